"""User-facing errors: the CLI prints these as one line, without a traceback."""

from __future__ import annotations


class DsprofError(Exception):
    """An error the user can act on; ``str()`` is the whole message."""

    exit_code = 2


class InputError(DsprofError):
    """Bad input: names the file, the line or record, and what was expected."""

    def __init__(self, path: object, what: str, line: int | None = None, expected: str | None = None):
        self.path = str(path)
        self.line = line
        self.what = what
        self.expected = expected
        where = self.path if line is None else f"{self.path}:{line}"
        message = f"{where}: {what}"
        if expected:
            message += f" (expected {expected})"
        super().__init__(message)

    def __reduce__(self):
        """Rebuilt from its fields, so that it crosses a process boundary (a Ray task's error) whole."""
        return type(self), (self.path, self.what, self.line, self.expected)
