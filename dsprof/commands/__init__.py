"""The commands: one library function per ``dsprof`` command, reading and writing artifact directories.

The CLI (:mod:`dsprof.cli`) parses options and calls these; everything here is
usable from Python. This layer sits above the analysis and its outputs, which
never import it.
"""

from dsprof import __version__
from dsprof.allocators import bound_reservations, one_blas_thread
from dsprof.interrupts import watch_signals

# for the CLI's --version, its allocator bounds, its BLAS thread and its stop handlers: it imports nothing of dsprof but the commands
# and the errors
__all__ = ["__version__", "bound_reservations", "one_blas_thread", "watch_signals"]
