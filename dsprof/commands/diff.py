"""``dsprof diff``: compare the figures of two runs or of two groups of repeated runs (docs/GATE_RULES.md)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from dsprof.analysis.policy.diff import diff_summaries, format_diff
from dsprof.analysis.summary import summary_path
from dsprof.commands.printing import Printer
from dsprof.errors import DsprofError
from dsprof.fileio import check_input_file


def diff_command(
    a: Sequence[str | os.PathLike],
    b: Sequence[str | os.PathLike],
    *,
    per_rank: bool = False,
    show_all: bool = False,
    fail_on_regression: bool = False,
    out: Printer = print,
) -> int:
    """Print the comparison of runs ``a`` with runs ``b``; returns 1 for a regression when ``fail_on_regression``, else 0."""
    if fail_on_regression and len(a) < 2 and len(b) < 2:
        raise DsprofError(
            "--fail-on-regression needs repeated runs on at least one side (A1,A2,A3) to tell a regression from run-to-run noise"
        )
    for named in (*a, *b):
        check_input_file(summary_path(named), expected="summary.json or an artifact directory holding one")
    result = diff_summaries(list(a), list(b), per_rank=per_rank)
    out(format_diff(result, show_all=show_all))
    if fail_on_regression and result.regressions:
        out(f"regression: {len(result.regressions)} verdict(s) or figure(s) worse beyond noise")
        return 1
    return 0
