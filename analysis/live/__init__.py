"""Following a running job: the same stages over a window of recent steps."""
