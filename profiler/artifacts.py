"""The artifact directory: what a profiled run leaves behind, and what dsprof writes beside it.

One home for every file name of the contract (docs/FORMATS.md, "The artifact
directory"). The runtime writes the inputs, the analysis reads them and writes
the outputs; both import the names from here.

SA_PROFILE output paths (docs/FORMATS.md, "SA_PROFILE"): an output *directory* ``D`` keeps its
fragments in ``D/fragments/trace.<pid>.jsonl`` and its merge in
``D/trace.json``; an output path ``P.json`` keeps them in
``P.json.fragments/`` and ``P.json`` itself.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# -- written by the runtime (inputs of the analysis) ---------------------------------------
SERVER_LOG = "server.log"
SERVING_TRACE_DIR = "serving-trace"
PERFORMANCE_SUMMARY = "performance_summary.json"
FAULTS = "faults.json"
TORCH_PROFILER_DIR = "torch-profiler"  # one Kineto trace per rank (dsprof run --torch-profiler): torch_profile_name(rank)

# -- SA_PROFILE output layout ----------------------------------------------------------------
FRAGMENTS_DIR = "fragments"
MERGED_TRACE = "trace.json"
FRAGMENT_PATTERN = re.compile(r"^trace\.(\d+)\.jsonl$")

# -- written by dsprof (outputs) ---------------------------------------------------------------
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
COMBINED_SWIMLANE = "combined-swimlane.json"
REPORT_HTML = "report.html"
PERFETTO_JSON = "perfetto-trace.json"
PERFETTO_PROTO = "perfetto-trace.pftrace"
SPAN_DATASET_MANIFEST = "dataset.json"  # the manifest of a span dataset directory (dsprof ingest, analyze --spans)

# Schemas of the JSON side files (bumped when a field changes meaning).
PERFORMANCE_SUMMARY_SCHEMA = "dsprof.performance_summary/1"
FAULTS_SCHEMA = "dsprof.faults/1"


TORCH_PROFILE_PATTERN = re.compile(r"^rank(\d+)\.json$")


def torch_profile_name(rank: int) -> str:
    """The file of one rank's torch.profiler (Kineto) trace inside :data:`TORCH_PROFILER_DIR`."""
    return f"rank{rank}.json"


def fragment_name(pid: int) -> str:
    return f"trace.{pid}.jsonl"


def fragments_dir(output: str | os.PathLike) -> Path:
    """Where the fragments of an SA_PROFILE output live: ``D/fragments`` or ``<path>.fragments``."""
    output = Path(output)
    if output.suffix == ".json":
        return output.with_name(output.name + "." + FRAGMENTS_DIR)
    return output / FRAGMENTS_DIR


def merged_path(output: str | os.PathLike) -> Path:
    """Where the merge goes: a ``.json`` output is itself the merged trace, a directory gets ``trace.json``."""
    output = Path(output)
    return output if output.suffix == ".json" else output / MERGED_TRACE


def fragment_files(directory: Path) -> list[Path]:
    """The fragments in a fragments directory: files named ``trace.<pid>.jsonl``, in pid order."""
    found = [p for p in directory.iterdir() if p.is_file() and FRAGMENT_PATTERN.match(p.name)] if directory.is_dir() else []
    return sorted(found, key=lambda p: (int(FRAGMENT_PATTERN.match(p.name).group(1)), p.name))  # type: ignore[union-attr]
