"""The commands: one library function per ``dsprof`` command, reading and writing artifact directories.

The CLI (:mod:`dsprof.cli`) parses options and calls these; everything here is
usable from Python. This layer sits above the analysis and its outputs, which
never import it.
"""
