"""The ``dsprof`` command.

Each command parses its options and calls one library function, so everything
here can also be done from Python. Errors the user can act on
(:class:`~dsprof.errors.DsprofError`, and files that cannot be read or written)
print as one line ``dsprof: error: <message>`` on stderr with exit status 2;
``--debug`` shows the traceback instead. Progress goes to stderr.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import time
from pathlib import Path

import click

from dsprof import __version__
from dsprof.errors import DsprofError

_DEBUG_KEY = "dsprof.debug"
_PROGRESS_KEY = "dsprof.progress"


class UserError(click.ClickException):
    """A one-line error with the exit status of the error that caused it."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file=None) -> None:
        click.echo(f"dsprof: error: {self.format_message()}", err=True)


def _os_error_message(exc: OSError) -> str:
    where = exc.filename if exc.filename is not None else ""
    reason = exc.strerror or str(exc)
    return f"{where}: {reason}" if where else reason


def _usage_error_message(exc: click.UsageError) -> str:
    """Click's message on one line, pointing at the command's help instead of printing the usage block."""
    message = " ".join(exc.format_message().split())
    return f"{message} (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else message


class DsprofGroup(click.Group):
    """Turns library errors and bad options into one-line messages unless ``--debug`` was given."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise UserError(_usage_error_message(exc), exc.exit_code) from exc
        except (DsprofError, OSError) as exc:
            printer = ctx.meta.get(_PROGRESS_KEY)
            if printer is not None:
                printer.done()  # the error starts on its own line
            if ctx.meta.get(_DEBUG_KEY):
                raise
            if isinstance(exc, DsprofError):
                raise UserError(str(exc), exc.exit_code) from exc
            raise UserError(_os_error_message(exc)) from exc


class ProgressPrinter:
    """Progress lines on stderr: rewritten in place on a terminal, one per line otherwise."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.in_place = self.stream.isatty()
        self.pending = False

    def __call__(self, message: str) -> None:
        if self.in_place:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r\x1b[K" + message[:width])
            self.stream.flush()
            self.pending = True
        else:
            click.echo(message, file=self.stream)

    def done(self) -> None:
        """End an in-place line so that what follows starts on a fresh one."""
        if self.pending:
            self.stream.write("\n")
            self.stream.flush()
            self.pending = False


@click.group(cls=DsprofGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="dsprof")
@click.option("--debug", is_flag=True, help="Show the full traceback of errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Profile a multi-rank LLM decode runtime and explain why decode steps were late.

    Exit status: 0 success, 1 a failed check (gate failed, run failed or invalid),
    2 an error (bad input, bad rules, bad options).
    """
    ctx.meta[_DEBUG_KEY] = debug


def _progress() -> ProgressPrinter:
    """The command's progress printer, registered so that an error can end its line."""
    printer = ProgressPrinter()
    click.get_current_context().meta[_PROGRESS_KEY] = printer
    return printer


_THRESHOLD = click.option("--threshold-ms", type=click.FloatRange(min=0), default=5.0, show_default=True,
                          help="Late-start / tail-step threshold.")


# --------------------------------------------------------------------------- run


@cli.command()
@click.option("--preset", type=click.Choice(["demo", "production", "microbench"]), default="demo",
              show_default=True, help="Workload shape (SPEC §4); the options below override it.")
@click.option("--ranks", type=click.IntRange(min=1), help="Rank processes (EP = ranks, DP = ranks / TP).")
@click.option("--tp", type=click.IntRange(min=1), help="Tensor-parallel size.")
@click.option("--requests", type=click.IntRange(min=1), help="Concurrent requests in the batch.")
@click.option("--prompt-tokens", type=click.IntRange(min=1), help="Prompt tokens per request.")
@click.option("--output-tokens", type=click.IntRange(min=1), help="Output tokens per request.")
@click.option("--layers", type=click.IntRange(min=1), help="Model layers.")
@click.option("--rounds", type=click.IntRange(min=1), help="Measured rounds (microbench preset).")
@click.option("--warmup", type=click.IntRange(min=0), help="Warm-up rounds (microbench preset).")
@click.option("--acceptance-rate", type=click.FloatRange(0, 1), help="MTP draft acceptance rate.")
@click.option("--metadata", type=click.Choice(["host-shared", "device-resident"]),
              help="Metadata update path; device-resident serializes the pipeline (the regression to catch).")
@click.option("--profile-level", help="SA_PROFILE levels, comma-separated: e2e, kernel, verbose.")
@click.option("--device-phases/--no-device-phases", default=None,
              help="Emit device-phase markers inside runner_run.")
@click.option("--inject", "inject", multiple=True, metavar="SPEC",
              help="Inject a fault (repeatable): fence_tail:p=P,ms=X | straggler:rank=R,ms=X | "
                   "slow_bind:rank=R,ms=X[,step=K] | crash:rank=R,step=K.")
@click.option("--seed", type=int, help="Random seed of the workload and injected faults.")
@_THRESHOLD
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Artifact directory [default: runs/<preset>-<timestamp>].")
def run(preset, ranks, tp, requests, prompt_tokens, output_tokens, layers, rounds, warmup, acceptance_rate,
        metadata, profile_level, device_phases, inject, seed, threshold_ms, out_dir) -> None:
    """Run the bundled decode runtime, profiled, then analyse it.

    Both profilers are on (SA_PROFILE fragments, STRACE markers). Prints the verification summary and the report's path. Exits 1 if the
    runtime failed or the swimlane is not valid (what was written is still
    analysed, e.g. after an injected crash).
    """
    from dsprof.runtime.config import RuntimeConfig
    from dsprof.session import profile_run

    config = RuntimeConfig.from_preset(  # None means "the preset's value"
        preset, ranks=ranks, tp=tp, requests=requests, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
        layers=layers, rounds=rounds, warmup=warmup, acceptance_rate=acceptance_rate, metadata=metadata,
        profile_level=profile_level, device_phases=device_phases, seed=seed, inject=list(inject) or None,
    )
    if out_dir is None:
        out_dir = Path("runs") / f"{preset}-{time.strftime('%Y%m%d-%H%M%S')}"
    progress = _progress()
    result = profile_run(config, out_dir, threshold_ms=threshold_ms, progress=progress)
    progress.done()
    if result.summary_md is not None:
        click.echo(result.summary_md.read_text().rstrip())
    for line in result.problems:
        click.echo(f"dsprof: {line}", err=True)
    if result.report_path is not None:
        click.echo(f"report: {result.report_path}")
    click.echo(f"artifacts: {result.out_dir}")
    click.get_current_context().exit(result.exit_code)


# --------------------------------------------------------------------------- analyze / ingest / merge


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where to write the outputs [default: the artifact dir when one directory is given, "
                   "else ./dsprof-analysis].")
@_THRESHOLD
@click.option("--expect-ranks", type=click.IntRange(min=1), help="Fail validation unless this many ranks appear.")
def analyze(paths, out_dir, threshold_ms, expect_ranks) -> None:
    """Analyse traces and write the figures.

    PATHS are artifact dirs, STRACE logs, SA_PROFILE fragment dirs or merged
    traces, Chrome/Kineto JSON. Writes summary.json, summary.md, combined-swimlane.json and the HTML report,
    and prints the summary table.
    """
    from dsprof.analysis.analyze import analyze as run_analysis
    from dsprof.analysis.analyze import format_summary_table

    if out_dir is None:
        out_dir = paths[0] if len(paths) == 1 and paths[0].is_dir() else Path("dsprof-analysis")
    progress = _progress()
    result = run_analysis(list(paths), out_dir, threshold_ms=threshold_ms, expect_ranks=expect_ranks,
                          progress=progress)
    progress.done()
    click.echo(format_summary_table(result.summary))
    for name, path in result.outputs.items():
        click.echo(f"{name}: {path}")


@cli.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("-o", "--output", default="spans/", show_default=True,
              help="A directory (DIR/): the span dataset, Parquet by time window with dataset.json; "
                   "or one span table file, .parquet, .csv or .jsonl (format from the extension).")
def ingest(paths, output) -> None:
    """Read traces and write their spans: the span dataset or one span table file.

    Prints the records read, the spans kept and the records dropped by reason.
    """
    # This process does no linear algebra and makes no reference cycles worth
    # collecting: numpy's BLAS threads and the cyclic collector would only take
    # CPU from the readers (set before numpy is first imported).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    gc.disable()
    from dsprof.commands import ingest as command

    command.keep_pandas_out()
    progress = _progress()
    trace = command.ingest_paths(list(paths), output, progress=progress)
    progress.done()
    click.echo(command.format_ingest_report(trace))
    click.echo(command.output_description(output, trace))


@cli.command()
# not exists=True: a .json output path that was never merged exists only as <path>.fragments/
@click.argument("output", type=click.Path(path_type=Path))
def merge(output) -> None:
    """Merge SA_PROFILE fragments into trace.json.

    OUTPUT is the SA_PROFILE output: a directory, or a path ending in .json.
    Torn or malformed lines are skipped and counted.
    """
    from dsprof.profiler.sa_profile import merge_fragments

    progress = _progress()
    result = merge_fragments(output, progress=progress, require_fragments=True)
    progress.done()
    click.echo(f"merged {result.events} events from {result.fragments} fragment(s) into {result.path}"
               f" ({result.skipped_lines} malformed line(s) skipped)")


# --------------------------------------------------------------------------- report / export


@cli.command()
@click.argument("artifact_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="HTML file [default: ARTIFACT_DIR/report.html].")
@_THRESHOLD
def report(artifact_dir, output, threshold_ms) -> None:
    """Write the HTML report of an artifact directory."""
    from dsprof.analysis.outputs.html_report import report_from_dir

    progress = _progress()
    path = report_from_dir(artifact_dir, output, threshold_ms=threshold_ms, progress=progress)
    progress.done()
    click.echo(f"report: {path}")


@cli.command()
@click.argument("artifact_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["perfetto-json"]), default="perfetto-json", show_default=True,
              help="Trace format to write.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Trace file [default: ARTIFACT_DIR/perfetto-trace.json].")
def export(artifact_dir, fmt, output) -> None:
    """Export the combined swimlane for Perfetto.

    The trace opens in ui.perfetto.dev and chrome://tracing.
    """
    from dsprof.analysis.outputs.perfetto import export_from_dir

    if output is None:
        output = artifact_dir / "perfetto-trace.json"
    progress = _progress()
    path = export_from_dir(artifact_dir, output, format=fmt, progress=progress)
    progress.done()
    click.echo(f"trace: {path}")


# --------------------------------------------------------------------------- gate / diff


@cli.command()
@click.argument("summary", type=click.Path(path_type=Path))
@click.option("--rules", "rules_path", required=True, type=click.Path(path_type=Path),
              help="TOML rules file (docs/GATE_RULES.md).")
@click.option("--baseline", type=click.Path(path_type=Path),
              help="Baseline summary.json (or its artifact dir) for [[relative]] rules.")
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path), help="Write JUnit XML here.")
@click.option("--verdict", "verdict_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the JSON verdict here.")
def gate(summary, rules_path, baseline, junit, verdict_path) -> None:
    """Check a summary against gate rules.

    SUMMARY is a summary.json or the artifact dir holding one.

    Exit status: 0 every rule passed, 1 a rule failed or its figure is missing,
    2 the rules or the summary could not be read.
    """
    from dsprof.analysis.gate import format_verdict
    from dsprof.analysis.gate import gate as run_gate

    verdict = run_gate(summary, rules_path, baseline=baseline, junit=junit, verdict_path=verdict_path)
    click.echo(format_verdict(verdict))
    click.get_current_context().exit(verdict.exit_code)


def _runs(spec: str, name: str) -> list[Path]:
    runs = [Path(part) for part in spec.split(",") if part.strip()]
    if not runs:
        raise click.BadParameter("give at least one artifact dir or summary.json", param_hint=name)
    return runs


@cli.command()
@click.argument("a")
@click.argument("b")
@click.option("--per-rank", is_flag=True, help="Include per-rank figures.")
@click.option("--changed-only", is_flag=True, help="Leave out figures that did not change.")
def diff(a, b, per_rank, changed_only) -> None:
    """Compare the figures of two runs.

    A and B are artifact dirs or summary.json files; give repeated runs
    comma-separated (A1,A2,A3) to flag changes beyond run-to-run noise.
    """
    from dsprof.analysis.diff import diff_summaries, format_diff

    result = diff_summaries(_runs(a, "A"), _runs(b, "B"), per_rank=per_rank)
    click.echo(format_diff(result, only_changed=changed_only))


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="dsprof")


if __name__ == "__main__":
    main()
