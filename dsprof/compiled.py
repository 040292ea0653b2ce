"""The one switch over dsprof's optional compiled helpers (the STRACE scanner, the dataset's invocation starts).

Each helper is a C extension built at install time where a compiler is found,
and each has a Python path that defines the result. Setting
:data:`PURE_PYTHON_ENV` makes every one of them take the Python path: the
tests compare the two, and the benchmarks time both.
"""

from __future__ import annotations

import os
from types import ModuleType

PURE_PYTHON_ENV = "DSPROF_PURE_PYTHON"


def use_compiled(module: ModuleType | None) -> ModuleType | None:
    """``module`` (None where it was not built), or None where :data:`PURE_PYTHON_ENV` asks for Python."""
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None
    return module
