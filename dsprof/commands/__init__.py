"""The commands: one library function per ``dsprof`` command, reading and writing artifact directories.

The CLI (:mod:`dsprof.cli`) parses options and calls these; everything here is
usable from Python. This layer sits above the analysis and its outputs, which
never import it.
"""

from dsprof import __version__

__all__ = ["__version__"]  # for the CLI's --version: it imports nothing of dsprof but the commands and the errors
