"""The run's one verdict: healthy, degraded, failed or invalid, with one sentence (docs/FIGURES.md "Verdict").

Built from the sections already computed (validity, the run's outcome, the
pipeline, the straggler block, the findings above the noise floor), never
recomputing them, so every output can put it first and say the same thing.
"""

from __future__ import annotations

from dsprof.analysis.stages.noise import Findings, NoiseFloor
from dsprof.analysis.stages.runner import stage
from dsprof.analysis.store.engine import Engine
from dsprof.analysis.summary import run_info
from dsprof.analysis.summary_schema import Pipeline, Serving, Straggler, Validation, Verdict, WhatIf


@stage("verdict", reads=(), in_summary=True)
def verdict_block(
    engine: Engine,
    validation: Validation,
    performance_summary: dict | None,
    pipeline: Pipeline,
    serving: Serving,
    straggler: Straggler,
    what_if: WhatIf,
    noise_floor: NoiseFloor,
    findings: Findings,
) -> Verdict:
    """The run's one ``verdict``, from the sections already computed.

    ``status`` and ``headline``, and how many late items stand above the noise floor.
    """
    run = run_info(performance_summary)
    above_floor = sum(1 for item in findings.items() if not item.get("noise"))
    floor_ms = round(noise_floor.slow_steps_ms, 3)

    def said(status: str, headline: str) -> Verdict:
        return Verdict(status=status, headline=headline, noise_floor_ms=floor_ms, findings=above_floor)  # type: ignore[typeddict-item]

    exit_status = run.get("exit_status")
    if exit_status not in (0, None):
        failed = run.get("failed_rank")
        who = f": rank {failed}" + (f" ({run.get('failed_device')})" if run.get("failed_device") else "") if failed is not None else ""
        return said(
            "failed", f"the run failed with exit status {exit_status}{who}" + (f" — {run['message']}" if run.get("message") else "")
        )
    if not validation.get("valid"):
        problems = "; ".join(validation.get("problems") or []) or "the swimlane is not valid"
        return said("invalid", f"the swimlane is not valid: {problems}")
    returned, expected = serving.get("tokens_returned"), serving.get("tokens_expected")
    if returned is not None and expected is not None and returned < expected:
        return said("failed", f"{returned:g} of {expected:g} output tokens came back")
    if pipeline.get("serialized"):
        return said("degraded", f"the depth-2 pipeline is serialized: {pipeline.get('diagnosis')}")
    if straggler.get("pattern") in ("rank", "spread"):
        return said("degraded", straggler["verdict"])
    if not above_floor:
        return said("healthy", f"healthy within noise (noise floor {floor_ms:.3f} ms)")
    share = what_if.get("share_of_decode_wall") or 0.0
    return said(
        "healthy",
        f"{above_floor} late item{'s' if above_floor != 1 else ''} above the noise floor ({floor_ms:.3f} ms) "
        f"cost {share:.1%} of the decode time, on no rank that stands out",
    )
