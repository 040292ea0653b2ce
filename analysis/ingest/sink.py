"""Where readers put span tables instead of keeping them, and how they report progress.

Its own module so that every reader (text logs, Chrome JSON, SA_PROFILE) and
every writer (the span dataset, ``dsprof ingest``) name the one interface
without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import pyarrow as pa

# A callback told one line of progress at a time (None: quiet).
Progress = Callable[[str], None] | None


class SpanSink(Protocol):
    """Where a reader puts each chunk's span table instead of keeping it (e.g. a Parquet dataset).

    The tables have the columns of SPAN_SCHEMA, with the columns that hold one
    value per log dictionary-encoded (dataset.PARQUET_SCHEMA); a trace read
    into memory gets them decoded.
    """

    def add(self, table: pa.Table) -> None: ...
