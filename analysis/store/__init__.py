"""The storage layer: the span table schema, the DuckDB engine, the span dataset."""
