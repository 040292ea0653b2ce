"""The ``dsprof`` command.

Each command parses its options and calls one function of :mod:`dsprof.commands`,
so everything here can also be done from Python; of dsprof, this module imports
only those (each inside its command: ``dsprof X`` imports command X alone, and
the options' values come from :mod:`dsprof.commands.choices`), :mod:`dsprof.errors`
and the group (:mod:`dsprof.cli.group`). Errors the user can act on
(:class:`~dsprof.errors.DsprofError`, and files that cannot be read or written)
print as one line ``dsprof: error: <message>`` on stderr with exit status 2;
``--debug`` shows the traceback instead. Progress goes to stderr.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from dsprof.cli.group import (
    EXPECTED_RANKS,
    PRESET,
    THRESHOLD,
    cli,
    err_line,
    install_stop_handlers,
    out_line,
    progress_printer,
    window_options,
)
from dsprof.commands import bound_reservations, one_blas_thread
from dsprof.commands.choices import ENGINES, EXPORT_FORMATS, MAX_MARGIN, MEMORY_LIMIT_DEFAULT

__all__ = ["cli", "main"]

# --------------------------------------------------------------------------- run


@cli.command()
@click.option(
    "--preset",
    type=click.Choice(["demo", "production", "microbench"]),
    default="demo",
    show_default=True,
    help="Workload shape (docs/RUNTIME.md); the options below override it.",
)
@click.option("--ranks", type=click.IntRange(min=1), show_default=PRESET, help="Rank processes (EP = ranks, DP = ranks / TP).")
@click.option("--tp", show_default=PRESET, type=click.IntRange(min=1), help="Tensor-parallel size.")
@click.option("--requests", show_default=PRESET, type=click.IntRange(min=1), help="Concurrent requests in the batch.")
@click.option("--prompt-tokens", show_default=PRESET, type=click.IntRange(min=1), help="Prompt tokens per request.")
@click.option("--output-tokens", show_default=PRESET, type=click.IntRange(min=1), help="Output tokens per request.")
@click.option("--layers", show_default=PRESET, type=click.IntRange(min=1), help="Model layers.")
@click.option("--rounds", show_default=PRESET, type=click.IntRange(min=1), help="Measured rounds (microbench preset).")
@click.option("--warmup", show_default=PRESET, type=click.IntRange(min=0), help="Warm-up rounds (microbench preset).")
@click.option("--acceptance-rate", show_default=PRESET, type=click.FloatRange(0, 1), help="MTP draft acceptance rate.")
@click.option(
    "--metadata",
    type=click.Choice(["host-shared", "device-resident"]),
    show_default=PRESET,
    help="Metadata update path; device-resident serializes the pipeline (the regression to catch).",
)
@click.option("--profile-level", show_default=PRESET, help="SA_PROFILE levels, comma-separated: e2e, kernel, verbose.")
@click.option("--device-phases/--no-device-phases", default=None, show_default=PRESET, help="Emit device-phase markers inside runner_run.")
@click.option(
    "--host-evidence/--no-host-evidence",
    default=None,
    show_default=PRESET,
    help="Attach what the OS saw of each span's thread (os.cpu_ns, os.rq_ns, ...) [default: on].",
)
@click.option(
    "--torch-profiler",
    "torch_profiler",
    is_flag=True,
    default=None,
    help="Also record a torch.profiler (Kineto) trace per rank in DIR/torch-profiler/ (CPU activities, and CUDA's "
    "where available): the runtime's phases as record_function labels, one ProfilerStep#N per decode step.",
)
@click.option(
    "--inject",
    "inject",
    multiple=True,
    metavar="SPEC",
    help="Inject a fault (repeatable): fence_tail:[rank=R,]p=P,ms=X | straggler:rank=R,ms=X | "
    "slow_bind:rank=R,ms=X[,step=K] | cpu_contention:[rank=R,]p=P,ms=X[,at=device] | "
    "gc_pause:[rank=R,]p=P,ms=X[,at=host|device] | crash:rank=R,step=K.",
)
@click.option("--seed", type=int, show_default=PRESET, help="Random seed of the workload and injected faults.")
@click.option(
    "--ab",
    "ab_pairs",
    type=click.IntRange(min=1),
    is_flag=False,
    flag_value=3,
    default=None,
    metavar="[N]",
    help="A/B verification: N interleaved pairs (default 3) of runs with and without the --inject faults; "
    "compares the predicted saving with the measured one and writes ab.json.",
)
@THRESHOLD
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Artifact directory [default: runs/<preset>-<timestamp>].",
)
@click.option("--live", is_flag=True, help="Follow the run while it runs, as `dsprof watch` does (a live view on a terminal).")
def run(
    preset,
    ranks,
    tp,
    requests,
    prompt_tokens,
    output_tokens,
    layers,
    rounds,
    warmup,
    acceptance_rate,
    metadata,
    profile_level,
    device_phases,
    host_evidence,
    torch_profiler,
    inject,
    seed,
    ab_pairs,
    threshold_ms,
    out_dir,
    live,
) -> None:
    """Run the bundled decode runtime, profiled, then analyse it.

    Both profilers are on (SA_PROFILE fragments, STRACE markers). Prints the verification summary and the report's path. Exits 1 if the
    runtime failed or the swimlane is not valid (what was written is still
    analysed, e.g. after an injected crash).
    """
    # Imported here, not at the top: dsprof.commands.run loads torch (the runtime), which no other
    # command needs, so that the CLI starts without it. Not a cycle: nothing imports the CLI.
    from dsprof.commands.ab import ab_command
    from dsprof.commands.run import run_command

    if live and ab_pairs is not None:
        raise click.UsageError("--live follows one run; it does not go with --ab")
    command = run_command if ab_pairs is None else functools.partial(ab_command, pairs=ab_pairs)
    exit_code = command(
        preset,  # None below means "the preset's value"
        ranks=ranks,
        tp=tp,
        requests=requests,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        layers=layers,
        rounds=rounds,
        warmup=warmup,
        acceptance_rate=acceptance_rate,
        metadata=metadata,
        profile_level=profile_level,
        device_phases=device_phases,
        host_evidence=host_evidence,
        torch_profiler=torch_profiler,
        seed=seed,
        inject=list(inject) or None,
        threshold_ms=threshold_ms,
        out_dir=out_dir,
        **({"live": True} if live else {}),
        progress=progress_printer(),
        out=out_line,
        err=err_line,
    )
    click.get_current_context().exit(exit_code)


# --------------------------------------------------------------------------- analyze / ingest / merge


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to write the outputs [default: the artifact dir when one directory is given, else ./dsprof-analysis].",
)
@THRESHOLD
@click.option("--expect-ranks", type=EXPECTED_RANKS, show_default="any number", help="Fail validation unless this many ranks appear.")
@click.option(
    "--memory-limit",
    default=None,
    metavar="SIZE",
    show_default=MEMORY_LIMIT_DEFAULT,
    help="Memory the query engine may use before spilling to disk, e.g. 4GB or 25%.",
)
@click.option(
    "--spans",
    "spans_dir",
    type=click.Path(file_okay=False, path_type=Path),
    show_default="not kept",
    help="Keep the span dataset (Parquet, queryable with DuckDB) in this directory.",
)
@click.option(
    "--engine",
    type=click.Choice(list(ENGINES)),
    default="embedded",
    show_default=True,
    help="Where the span-sized work runs: this process, or a Ray cluster (pip install 'dsprof[cluster]').",
)
@click.option("--address", show_default="start a local cluster", help="Ray cluster address for --engine ray.")
@click.option(
    "--step-marker",
    metavar="NAME",
    show_default="ProfilerStep#N",
    help="PyTorch-profiler traces: the record_function label whose spans are the steps, numbered by order.",
)
@window_options
def analyze(paths, out_dir, threshold_ms, expect_ranks, memory_limit, spans_dir, engine, address, step_marker, steps, since, until) -> None:
    """Analyse traces and write the figures.

    PATHS are artifact dirs, STRACE logs, SA_PROFILE fragment dirs or merged
    traces, Chrome/Kineto JSON, or a span dataset written by `dsprof ingest`.
    Writes summary.json, summary.md, combined-swimlane.json and report.html,
    and prints the findings (docs/CLI.md).
    """
    from dsprof.commands.analyze import analyze_command

    analyze_command(
        paths,
        out_dir,
        threshold_ms=threshold_ms,
        expect_ranks=expect_ranks,
        memory_limit=memory_limit,
        spans_dir=spans_dir,
        engine=engine,
        address=address,
        step_marker=step_marker,
        steps=steps,
        since=since,
        until=until,
        progress=progress_printer(),
        out=out_line,
    )


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "-o",
    "--output",
    default="spans/",
    show_default=True,
    help="A directory (DIR/): the span dataset, Parquet by time window with dataset.json; "
    "or one span table file, .parquet, .csv or .jsonl (format from the extension).",
)
def ingest(paths, output) -> None:
    """Read traces and write their spans: the span dataset or one span table file.

    Prints the records read, the spans kept and the records dropped by reason.
    """
    if not output.strip():  # else it would be written into the current directory
        raise click.BadParameter(
            "an empty path (expected DIR/ for the span dataset, or a .parquet, .csv or .jsonl file)", param_hint="'-o'"
        )
    from dsprof.commands.ingest import ingest_command

    ingest_command(paths, output, progress=progress_printer(), out=out_line)


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path), help="Final outputs [default: as analyze].")
@click.option("--window", type=click.IntRange(min=2), default=200, show_default=True, help="Decode steps analysed live (the last N).")
@click.option(
    "--interval", type=click.FloatRange(min=0.05), default=0.25, show_default=True, help="Least seconds between two windows taken."
)
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, help="Window analyses under way at once (threads).")
@THRESHOLD
@click.option(
    "--idle-exit", type=click.FloatRange(min=0, min_open=True), show_default="never", help="End after S seconds without new bytes."
)
@click.option("--alert", "alert_rules", type=click.Path(dir_okay=False, path_type=Path), help="Gate rules (TOML) checked on every window.")
@click.option(
    "--on-alert", metavar="CMD", help="Start CMD (shell; $DSPROF_ALERT holds the line) on an alert and go on watching; at most 2 at once."
)
@click.option("--events", type=click.Path(dir_okay=False, path_type=Path), help="Append one JSON line per refresh to FILE.")
@click.option(
    "--spans", "spans_dir", type=click.Path(file_okay=False, path_type=Path), show_default="not kept", help="Keep the span dataset here."
)
@click.option(
    "--expect-ranks",
    type=EXPECTED_RANKS,
    show_default="any number",
    help="Show a step only once this many ranks reached it; fail validation unless this many ranks appear.",
)
def watch(
    paths, out_dir, window, interval, workers, threshold_ms, idle_exit, alert_rules, on_alert, events, spans_dir, expect_ranks
) -> None:
    """Follow a running job's logs: a live view of its last steps, then analyze's outputs.

    Ends on Ctrl-C, when performance_summary.json appears in a watched artifact dir, or after --idle-exit. Exit status:
    0, 1 when an --alert rule failed (without --on-alert), 2 on bad input (docs/WATCH.md).
    """
    from dsprof.commands.watch import WatchOptions, watch_command

    options = WatchOptions(
        out_dir, window, interval, threshold_ms, idle_exit, alert_rules, on_alert, events, spans_dir, expect_ranks, workers
    )
    screen = _screen if sys.stdout.isatty() else None
    click.get_current_context().exit(watch_command(paths, options, out=out_line, screen=screen))


def _screen(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@cli.command()
# not exists=True: a .json output path that was never merged exists only as <path>.fragments/
@click.argument("output", type=click.Path(path_type=Path))
def merge(output) -> None:
    """Merge SA_PROFILE fragments into trace.json.

    OUTPUT is the SA_PROFILE output: a directory, or a path ending in .json.
    Torn or malformed lines are skipped and counted.
    """
    from dsprof.commands.merge import merge_command

    merge_command(output, progress=progress_printer(), out=out_line)


# --------------------------------------------------------------------------- report / export


_INPUTS = click.option(
    "--inputs",
    "inputs",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    metavar="PATH",
    show_default="the span dataset or input files summary.json names inside ARTIFACT_DIR, else ARTIFACT_DIR",
    help="Read the spans from these inputs (repeatable): for inputs outside ARTIFACT_DIR, or that moved since the analysis.",
)


@cli.command()
@click.argument("artifact_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="HTML file [default: ARTIFACT_DIR/report.html].")
@_INPUTS
@window_options
def report(artifact_dir, output, inputs, steps, since, until) -> None:
    """Write the HTML report of an analysed artifact directory.

    Every figure comes from ARTIFACT_DIR/summary.json (run `dsprof analyze` first);
    only the swimlane's spans are read again, from the inputs the summary names inside
    ARTIFACT_DIR (or the span dataset kept with `analyze --spans`), else --inputs; stderr says which (docs/REPORTS.md).
    """
    progress = progress_printer()
    window = {"steps": steps, "since": since, "until": until}
    from dsprof.commands.report import report_from_dir

    path = report_from_dir(artifact_dir, output, inputs=inputs or None, progress=progress, note=err_line, **window)
    progress.done()
    click.echo(f"report: {path}")


@cli.command()
@click.argument("artifact_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(list(EXPORT_FORMATS)),
    default=None,
    help="perfetto: Perfetto's native protobuf (.pftrace); perfetto-json: Chrome trace JSON "
    "[default: from the output's name, .json or .json.gz for JSON, else perfetto].",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Trace file; a .json.gz name is compressed JSON "
    "[default: ARTIFACT_DIR/perfetto-trace.pftrace, or perfetto-trace.json for perfetto-json].",
)
@_INPUTS
@window_options
def export(artifact_dir, fmt, output, inputs, steps, since, until) -> None:
    """Export an analysed artifact directory for Perfetto (docs/REPORTS.md).

    Both formats open in ui.perfetto.dev; the JSON also in chrome://tracing.
    The spans are read as for `dsprof report`.
    """
    progress = progress_printer()
    window = {"steps": steps, "since": since, "until": until}
    from dsprof.commands.report import export_from_dir

    path = export_from_dir(artifact_dir, output, format=fmt, inputs=inputs or None, progress=progress, note=err_line, **window)
    progress.done()
    click.echo(f"trace: {path}")


# --------------------------------------------------------------------------- gate / diff


@cli.command(context_settings={"show_default": True})
@click.argument("summaries", metavar="SUMMARY", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--rules",
    "rules_path",
    type=click.Path(path_type=Path),
    show_default="required unless --suggest",
    help="TOML rules file; grammar, outcomes and outputs in docs/GATE_RULES.md.",
)
@click.option(
    "--suggest",
    is_flag=True,
    help="Print suggested rules from the SUMMARY... of healthy runs (facts, and effect-size limits: worst healthy value x --margin).",
)
@click.option(
    "--margin", type=click.FloatRange(min=1, max=MAX_MARGIN), default=1.5, help="With --suggest: headroom over the worst healthy value."
)
@click.option(
    "--baseline",
    type=click.Path(path_type=Path),
    show_default="none: [[relative]] rules are skipped",
    help="Baseline summary.json (or its artifact dir) for [[relative]] rules.",
)
@click.option(
    "--junit",
    type=click.Path(dir_okay=False, path_type=Path),
    show_default="not written",
    help="Write JUnit XML here (one testcase per rule, named by the rule).",
)
@click.option(
    "--verdict",
    "verdict_path",
    type=click.Path(dir_okay=False, path_type=Path),
    show_default="not written",
    help="Write the JSON verdict (dsprof.gate_verdict/1) here.",
)
@click.option(
    "--history",
    type=click.Path(dir_okay=False, path_type=Path),
    show_default='none: change = "worse" rules are skipped',
    help='Run history store (dsprof history add) for change = "worse" rules; this run counts as its newest.',
)
def gate(summaries, rules_path, suggest, margin, baseline, junit, verdict_path, history) -> None:
    """Check a summary against gate rules (docs/GATE_RULES.md).

    SUMMARY is a summary.json or the artifact dir holding one. With --suggest,
    give the summaries of several healthy runs instead: the rules printed
    (to stdout, in the rules format) hold on all of them with --margin to spare. One line per
    rule: status, rule name, figure, value vs limit. On GitHub Actions
    (GITHUB_ACTIONS=true) failures also become ::error annotations titled by
    the rule, and a table of every rule's outcome is appended to
    $GITHUB_STEP_SUMMARY; a rules or summary error gets an annotation and a
    step-summary line too.

    Exit status: 0 every rule passed, 1 a rule failed or its figure was not
    produced by the run, 2 the rules or the summary could not be read (a figure
    path the summary does not have is a rules error).
    """
    if suggest:
        if rules_path or baseline or junit or verdict_path or history:
            raise click.UsageError("--suggest prints rules: it takes no --rules, --baseline, --history, --junit or --verdict")
        from dsprof.commands.gate import suggest_command

        click.get_current_context().exit(suggest_command(summaries, margin=margin, out=out_line))
    if rules_path is None:
        raise click.UsageError("Missing option '--rules'")
    if len(summaries) != 1:
        raise click.UsageError(f"give one SUMMARY to check (got {len(summaries)}; several are for --suggest)")
    from dsprof.commands.gate import gate_command

    exit_code = gate_command(
        summaries[0], rules_path, baseline=baseline, junit=junit, verdict_path=verdict_path, history=history, out=out_line
    )
    click.get_current_context().exit(exit_code)


def _runs(spec: str, name: str) -> list[Path]:
    runs = [Path(part) for part in spec.split(",") if part.strip()]
    if not runs:
        raise click.BadParameter("give at least one artifact dir or summary.json", param_hint=name)
    return runs


@cli.command(context_settings={"show_default": True})
@click.argument("a")
@click.argument("b")
@click.option("--per-rank/--no-per-rank", default=False, help="Also compare per-rank blocks, per-rank cadence and achieved depth.")
@click.option(
    "--all/--folded", "show_all", default=False, help="List every figure, or fold unchanged figures and figures within noise into a count."
)
@click.option(
    "--fail-on-regression/--no-fail-on-regression",
    default=False,
    help="Exit 1 when a verdict changes for the worse or a figure moves beyond noise in its worse direction "
    "(needs repeated runs on at least one side).",
)
def diff(a, b, per_rank, show_all, fail_on_regression) -> None:
    """Compare the figures of two runs (docs/GATE_RULES.md, "Comparing runs").

    A and B are artifact dirs or summary.json files; give repeated runs
    comma-separated (A1,A2,A3) to tell changes beyond run-to-run noise from
    noise. Verdict changes come first, then the figures that moved, worse
    first, each marked better or worse, with the runs per side.

    Exit status: 0, or 1 with --fail-on-regression when something got worse
    beyond noise; 2 when a summary cannot be read.
    """
    from dsprof.commands.diff import diff_command

    exit_code = diff_command(
        _runs(a, "A"), _runs(b, "B"), per_rank=per_rank, show_all=show_all, fail_on_regression=fail_on_regression, out=out_line
    )
    click.get_current_context().exit(exit_code)


# --------------------------------------------------------------------------- history


@cli.group()
def history() -> None:
    """A run history in a DuckDB store: add runs, find change points, draw trends (docs/GATE_RULES.md)."""


@history.command("add")
@click.argument("store", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("run", metavar="RUN_DIR_OR_SUMMARY", type=click.Path(path_type=Path))
@click.option("--label", help="The run's name in the history  [default: run N].")
@click.option("--commit", help="The commit the run measured (shown with its change points).")
def history_add(store, run, label, commit) -> None:
    """Add a run's headline figures to STORE (made when missing).

    Adding a summary stored already changes nothing. Parallel adds to one store
    wait for each other (a lock on STORE.lock). Exit status: 0, or 2 when the
    store or the summary cannot be read.
    """
    from dsprof.commands.history import history_add_command

    click.get_current_context().exit(history_add_command(store, run, label=label, commit=commit, out=out_line))


@history.command("check", context_settings={"show_default": True})
@click.argument("store", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--figure", "figures", multiple=True, help="Check only figures matching this dotted path (* allowed; repeatable)  [default: all]."
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the change points as JSON here.")
@click.option("--newest", type=click.IntRange(min=1), default=5, help="A regression in this many newest runs fails the check.")
def history_check(store, figures, json_path, newest) -> None:
    """Find the change points of every figure's series in STORE.

    One line per change point: the figure, better or worse, by how much, the
    first run after it (label, commit) and its p-value. Exit status: 1 when a
    change for the worse starts in the newest --newest runs, else 0; 2 when the
    store cannot be read.
    """
    from dsprof.commands.history import history_check_command

    exit_code = history_check_command(store, figures=list(figures) or None, json_path=json_path, newest=newest, out=out_line)
    click.get_current_context().exit(exit_code)


@history.command("report")
@click.argument("store", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("trend.html"), show_default=True)
def history_report(store, output) -> None:
    """Write an offline trend page of STORE: one chart per figure over the runs, change points marked."""
    from dsprof.commands.history import history_report_command

    click.get_current_context().exit(history_report_command(store, output, out=out_line))


def main() -> None:
    """Console-script entry point; SIGTERM and Ctrl-C stop a command (cleanup runs, one line, exit 143 or 130)."""
    bound_reservations()
    one_blas_thread()
    install_stop_handlers()
    cli(prog_name="dsprof")


if __name__ == "__main__":
    main()
