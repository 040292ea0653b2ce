"""The progress callback long work takes: one line of text at a time (the CLI prints it to stderr), or None."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str], None] | None
