"""The values the CLI's options offer, importing nothing heavy: ``dsprof X`` imports command X alone (cli/main.py)."""

from dsprof.analysis.policy.gate_suggest import MAX_MARGIN
from dsprof.analysis.store.memory_limit import DEFAULT_MEMORY_CAP, DEFAULT_MEMORY_SHARE

ENGINES = ("embedded", "ray")
# what the engine takes without --memory-limit
MEMORY_LIMIT_DEFAULT = f"{DEFAULT_MEMORY_SHARE:.0%} of RAM, at most {DEFAULT_MEMORY_CAP >> 30} GiB"
# export format -> its default file name in the artifact directory (commands/report.py)
PERFETTO_PROTO, PERFETTO_JSON = "perfetto", "perfetto-json"
EXPORT_FORMATS = (PERFETTO_PROTO, PERFETTO_JSON)

__all__ = ["ENGINES", "EXPORT_FORMATS", "MAX_MARGIN", "MEMORY_LIMIT_DEFAULT", "PERFETTO_JSON", "PERFETTO_PROTO"]
