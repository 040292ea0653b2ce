"""The two STRACE log readers under test: the compiled scanner and the pure-Python reader.

Tests run the same checks on both (``select_reader``) and compare them on
generated logs (``outcome``): the Python reader defines the result, the
compiled one must match it exactly.
"""

from __future__ import annotations

import pytest

from dsprof.analysis.ingest import strace_log
from dsprof.analysis.store.spans import SPAN_SCHEMA
from dsprof.errors import InputError

READERS = ("compiled", "python")


def select_reader(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``name`` the reader of this test; skips when the compiled scanner is not built here."""
    monkeypatch.delenv(strace_log.PURE_PYTHON_ENV, raising=False)
    if name == "python":
        monkeypatch.setenv(strace_log.PURE_PYTHON_ENV, "1")
    elif strace_log.compiled_scanner() is None:
        pytest.skip("the compiled STRACE scanner is not built (no C compiler at install time?)")


def outcome(data: bytes, file: str = "generated.log") -> tuple:
    """Everything a read of ``data`` yields, in comparable form (or the error it raises)."""
    try:
        trace = strace_log.parse_strace_bytes(data, file)
    except InputError as error:
        return ("error", str(error))
    return (
        trace.spans.schema.equals(SPAN_SCHEMA),
        trace.spans.to_pylist(),
        trace.anchors.to_pylist(),
        trace.chip_devices.to_pylist(),
        trace.dropped,
        trace.drop_sites,
        trace.records_read,
        trace.lines_read,
    )
