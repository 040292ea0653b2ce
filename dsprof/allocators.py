"""Keep the allocators from reserving address space far beyond what dsprof uses.

DuckDB's jemalloc keeps the address space of memory it has freed (``retain``),
glibc reserves 64 MB per arena and makes up to 8 arenas a core, and Arrow's
mimalloc reserves large regions up front: together about twice the resident
memory, so an analysis under a 4 GB address-space cap (``ulimit -v``) failed
at 2 GB resident. Measured side by side, the bounded settings cost nothing in
time (docs/ARCHITECTURE.md, "Memory"). The CLI sets them before DuckDB or Arrow
allocate; a variable already in the environment is kept. It also keeps numpy's
OpenBLAS to one thread (:func:`one_blas_thread`).
"""

from __future__ import annotations

import ctypes
import os

_M_ARENA_MAX = -8  # glibc's mallopt parameter: most malloc arenas


def bound_reservations() -> None:
    """Set the allocators' limits for this process and its children (before DuckDB or Arrow is imported)."""
    arenas = max(2, os.cpu_count() or 2)
    os.environ.setdefault("DUCKDB_JE_MALLOC_CONF", f"retain:false,narenas:{arenas}")
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    if "MALLOC_ARENA_MAX" not in os.environ:  # glibc reads the variable at start only: set the limit itself
        try:
            ctypes.CDLL(None).mallopt(_M_ARENA_MAX, arenas)
        except (OSError, AttributeError):  # not glibc
            pass


def one_blas_thread() -> None:
    """One OpenBLAS thread for numpy, in this process and its children (a variable already set is kept).

    dsprof multiplies no large matrices (torch, in the runtime, brings MKL of its own), while OpenBLAS starts a
    thread per core that spins for about a tenth of a second once numpy loads: on a 2-core host that took 0.12 s
    of CPU from ``dsprof ingest`` of a 256 MB log (benchmarks/bench_ingest.py).
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
