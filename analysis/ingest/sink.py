"""Where readers put span tables instead of keeping them.

Its own module so that every reader (text logs, Chrome JSON, SA_PROFILE) and
every writer (the span dataset, ``dsprof ingest``) name the one interface
without importing each other.
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa


class SpanSink(Protocol):
    """Where a reader puts each chunk's span table instead of keeping it (e.g. a Parquet dataset).

    The tables have the columns of SPAN_SCHEMA, with the columns that hold one
    value per log dictionary-encoded (dataset.PARQUET_SCHEMA); a trace read
    into memory gets them decoded.
    """

    def add(self, table: pa.Table) -> None: ...
