"""The engine's memory limit: its default share of RAM and the ``--memory-limit`` text.

Its own module, importing nothing heavy: the CLI shows the default in ``--help`` before any command is imported.
"""

from __future__ import annotations

import os
import re

from dsprof.errors import DsprofError

# Share of physical memory DuckDB may hold before spilling (``--memory-limit`` overrides), and at most this much:
# the analysis' own arrays sit beside it, and a 64 x 100k analysis peaks at 1.58 GiB RSS under 1 GB (103 s), against
# 2.80 GiB (94 s) at a tenth of a 24 GiB machine (benchmarks/README.md "Scale, round 2").
DEFAULT_MEMORY_SHARE = 0.10
DEFAULT_MEMORY_CAP = 1 << 30
MIN_MEMORY_LIMIT = 256 << 20


def physical_memory() -> int:
    """Bytes of RAM on this machine (8 GiB where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def default_memory_limit() -> int:
    """Bytes: a share of this machine's RAM, at most :data:`DEFAULT_MEMORY_CAP`, so a big analysis spills instead of
    exhausting memory."""
    return max(MIN_MEMORY_LIMIT, min(DEFAULT_MEMORY_CAP, int(physical_memory() * DEFAULT_MEMORY_SHARE)))


# The largest ``--memory-limit`` taken: 1 PiB, past any machine (DuckDB's own bound, 2**63 bytes, is
# otherwise met only when the first query runs, after every input was read).
MAX_MEMORY_LIMIT = 1 << 50
_MEMORY_UNITS = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_MEMORY_UNITS |= {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "B": 1, "": 1}
# ASCII digits only: Python's float() would read other scripts' digits too.
_MEMORY_TEXT = re.compile(r"([0-9]{1,20}(?:\.[0-9]{1,20})?(?:E[+-]?[0-9]{1,3})?)(%|[KMGT]I?B|[KMGTB]|)", re.ASCII)


def parse_memory_limit(text: str) -> int:
    """``4GB``, ``512MiB``, ``25%`` (of RAM) or plain bytes -> bytes, at most MAX_MEMORY_LIMIT; DsprofError on anything else."""
    match = _MEMORY_TEXT.fullmatch(text.strip().upper().replace(" ", ""))
    number = float(match.group(1)) if match else 0.0
    if match and match.group(2) == "%":
        if 0 < number <= 100:
            return max(MIN_MEMORY_LIMIT, int(physical_memory() * number / 100))
    elif match and 0 < number * _MEMORY_UNITS[match.group(2)] <= MAX_MEMORY_LIMIT:
        return max(MIN_MEMORY_LIMIT, int(number * _MEMORY_UNITS[match.group(2)]))
    raise DsprofError(f"bad memory limit {text[:100]!r} (expected e.g. 4GB, 512MiB or 25%, at most {MAX_MEMORY_LIMIT >> 40} TiB)")
