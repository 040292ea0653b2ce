"""Real-stack shaped artifacts with chosen per-(rank, step) timings.

Tests and benchmarks need traces whose figures are known in advance. A
:class:`SyntheticRun` takes a timing plan (scalars or ``(ranks, steps)`` arrays
of nanoseconds), lays out every span of every decode invocation on the host
monotonic clock, and writes what the real stack writes: ``server.log`` (prefixed
STRACE records in span-close order, one CLOCK_ANCHOR per pid, chip_process ready
lines, unrelated log text, optionally two records on one physical line and a
torn last record), ``serving-trace/trace.json`` (SA_PROFILE request, scheduler,
worker and kernel spans around the window) and ``performance_summary.json``.
:meth:`SyntheticRun.timings` returns the ground truth that was injected.

Layout of one invocation (rank r, step s), all on the host clock::

    bind_start  = t0 + s * period + bind_start_offset
    runner_start = bind_start + bind + bind_to_runner
    fence wait  = [runner_start + launch, + fence_wait]
    runner_run  = [runner_start, runner_start + launch + fence_wait + drain]
    claim_release = [runner_end, + claim]
    validate    = [runner_end + runner_to_validate, + validate]
    root        = [bind_start, max(validate_end, claim_end)]

With ``pipelined=True`` the default period is the median runner_run plus the
claim, so bind(N+1) runs while runner_run(N) is still draining (depth-2
overlap); with ``pipelined=False`` it is the median root plus an idle gap, so
nothing overlaps. Steps stay on this grid whatever is injected: a runner_run
made longer than the period overlaps the next one on its rank (a pipeline
violation, as the real stack would show it) unless ``launch_waits_for_claim``,
which holds each launch until the previous claim_release, as the runtime does.

Records are built as Arrow string columns (no per-span Python formatting), so
64 ranks x 10,000 steps are written in seconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsprof.analysis.outputs.text import join_text, text_buffer
from dsprof.profiler import artifacts
from dsprof.profiler import strace_format as fmt

DECODE_HID = "9f3c2a71d04be815"
PREFILL_CALLABLE = "prefill.main"
PREFILL_HID = "41d0aa7c33e2b906"
# wall-clock origin of the synthetic run: well above 2**53, as real wall ns are
WALL0_NS = 1_764_470_000_123_456_789
T0_MONO_NS = 5_000_000_000_000

_TIMING_FIELDS = (
    "bind_start_offset_ns",
    "bind_ns",
    "bind_to_runner_ns",
    "launch_ns",
    "fence_wait_ns",
    "drain_ns",
    "device_wall_ns",
    "claim_ns",
    "runner_to_validate_ns",
    "validate_ns",
)


@dataclass
class Timings:
    """Absolute host-clock times (ns) of every phase, arrays of shape (ranks, steps)."""

    bind_start_ns: np.ndarray
    bind_end_ns: np.ndarray
    runner_start_ns: np.ndarray
    runner_end_ns: np.ndarray
    fence_start_ns: np.ndarray
    fence_wait_ns: np.ndarray
    device_wall_ns: np.ndarray
    claim_start_ns: np.ndarray
    claim_end_ns: np.ndarray
    validate_start_ns: np.ndarray
    validate_end_ns: np.ndarray

    @property
    def root_start_ns(self) -> np.ndarray:
        return self.bind_start_ns

    @property
    def root_end_ns(self) -> np.ndarray:
        return np.maximum(self.validate_end_ns, self.claim_end_ns)


@dataclass
class SyntheticRun:
    """A decode run with chosen timings; every ``*_ns`` plan broadcasts to (ranks, steps)."""

    ranks: int = 8
    steps: int = 143
    pipelined: bool = True
    period_ns: int | None = None
    bind_start_offset_ns: object = 0
    bind_ns: object = 1_000_000
    bind_to_runner_ns: object = 100_000
    launch_ns: object = 200_000
    fence_wait_ns: object = 9_000_000
    drain_ns: object = 300_000
    device_wall_ns: object = 9_100_000
    claim_ns: object = 50_000
    runner_to_validate_ns: object = 250_000
    validate_ns: object = 600_000
    launch_waits_for_claim: bool = False  # a late runner_run pushes its rank's next launches back
    device_phases: bool = True  # depth-2 runner markers (fence wait, device wall)
    bind_children: bool = True  # bind.args / bind.prebuilt
    root_attrs: bool = True  # identity, rank, device, callable, step on the root
    chip_ready_lines: bool = True
    anchors: bool = True
    warmup_steps: int = 0  # decode invocations before the serving window
    first_step: int = 0  # number of the first measured step: > 0 continues an earlier run of the plan on its grid
    prefill: bool = True  # one non-decode invocation per rank before decode
    dispatch_ids: bool = False  # roots carry dispatch_id = run_epoch + 1 (else 0: no scheduler allocates one)
    host_evidence: bool = False  # os.* attributes (SPEC §2.1) on every span: CPU time = duration, no run-queue wait
    unrelated_lines_per_step: int = 1
    two_per_line_every: int = 0  # join every n-th record to the next one on one line
    torn_tail: bool = False  # the log ends inside a record (crash)
    missing_steps: dict[int, int] = field(default_factory=dict)  # rank -> steps it lacks at the end
    base_pid: int = 41000
    sa_profile: bool = True
    sa_worker_spans: bool = True  # worker/kernel spans per (rank, step) in the SA_PROFILE trace
    performance_summary: bool = True
    requests_per_rank: int = 4
    output_tokens: int = 256
    prompt_tokens: int = 64
    acceptance_rate: float = 0.79

    def __post_init__(self) -> None:
        self.period: int = self._default_period() if self.period_ns is None else self.period_ns
        self.period_ns = self.period

    def _default_period(self) -> int:
        """The typical (median) step sets the period, so an injected delay stays local."""
        if self.pipelined:
            return (
                int(np.median(self._plan("launch_ns") + self._plan("fence_wait_ns") + self._plan("drain_ns") + self._plan("claim_ns")))
                + 20_000
            )
        return int(np.median(self._root_length())) + 500_000

    # -- timing plan --------------------------------------------------------------

    def _plan(self, name: str) -> np.ndarray:
        value = np.asarray(getattr(self, name), dtype=np.int64)
        return np.broadcast_to(value, (self.ranks, self.steps)).astype(np.int64)

    def _root_length(self) -> np.ndarray:
        p = {f: self._plan(f) for f in _TIMING_FIELDS}
        runner = p["launch_ns"] + p["fence_wait_ns"] + p["drain_ns"]
        return p["bind_ns"] + p["bind_to_runner_ns"] + runner + np.maximum(p["claim_ns"], p["runner_to_validate_ns"] + p["validate_ns"])

    def timings(self) -> Timings:
        """Ground truth of the decode steps inside the window (warm-up excluded)."""
        return self._timings(self.steps, self._measured_origin_ns() + self.first_step * self.period)

    def _measured_origin_ns(self) -> int:
        """Warm-up rounds come first, then a pause longer than a root, then the measured steps."""
        if not self.warmup_steps:
            return 0
        return self.warmup_steps * self.period + int(np.max(self._root_length())) + 5_000_000

    def _timings(self, steps: int, origin_ns: int) -> Timings:
        p = {f: self._plan(f) for f in _TIMING_FIELDS}
        if steps != self.steps:  # warm-up rounds reuse step 0's plan
            p = {f: np.repeat(v[:, :1], steps, axis=1) for f, v in p.items()}
        grid = T0_MONO_NS + origin_ns + np.arange(steps, dtype=np.int64) * self.period
        bind_start = grid[None, :] + p["bind_start_offset_ns"]
        bind_end = bind_start + p["bind_ns"]
        runner_start = bind_end + p["bind_to_runner_ns"]
        if self.launch_waits_for_claim:
            # runner_run(s) starts no earlier than claim_release(s-1) = runner_end(s-1):
            # S(s) = max(want(s), S(s-1) + dur(s-1)), solved as D(s) + cummax(want(s) - D(s))
            # with D(s) the sum of the earlier runner durations
            runner_dur = p["launch_ns"] + p["fence_wait_ns"] + p["drain_ns"]
            before = np.cumsum(runner_dur, axis=1) - runner_dur
            runner_start = before + np.maximum.accumulate(runner_start - before, axis=1)
        fence_start = runner_start + p["launch_ns"]
        runner_end = fence_start + p["fence_wait_ns"] + p["drain_ns"]
        validate_start = runner_end + p["runner_to_validate_ns"]
        return Timings(
            bind_start_ns=bind_start,
            bind_end_ns=bind_end,
            runner_start_ns=runner_start,
            runner_end_ns=runner_end,
            fence_start_ns=fence_start,
            fence_wait_ns=p["fence_wait_ns"],
            device_wall_ns=p["device_wall_ns"],
            claim_start_ns=runner_end,
            claim_end_ns=runner_end + p["claim_ns"],
            validate_start_ns=validate_start,
            validate_end_ns=validate_start + p["validate_ns"],
        )

    def steps_per_rank(self) -> np.ndarray:
        counts = np.full(self.ranks, self.steps, dtype=np.int64)
        for rank, lacking in self.missing_steps.items():
            counts[rank] -= lacking
        return counts

    def pid(self, rank: int) -> int:
        return self.base_pid + rank

    def device(self, rank: int) -> str:
        return f"npu:{rank}"

    @property
    def serving_window_ns(self) -> tuple[int, int]:
        """[start, end) of the SA_PROFILE request spans: just around the measured steps."""
        t = self.timings()
        return int(t.root_start_ns.min()) - 1_000_000, int(t.root_end_ns.max()) + 1_000_000

    # -- span rows ----------------------------------------------------------------

    def _span_rows(self, first: int, stop: int, timings: Timings) -> dict[str, np.ndarray]:
        """The STRACE spans of measured steps [first, stop) as flat columns (ints as int64, text as object arrays).

        The warm-up rounds and the prefill go with the block that starts at step 0.
        """
        blocks = []
        if self.warmup_steps and first == 0:
            blocks.append((self._timings(self.warmup_steps, 0), 0, False, 0))
        blocks.append((_step_slice(timings, first, stop), self.warmup_steps + self.first_step + first, True, first))
        columns: dict[str, list] = {k: [] for k in ("rank", "epoch", "depth", "name", "ts", "dur", "end", "clk", "hid", "callable", "step")}

        def add(rank, epoch, depth, name, ts, dur, hid, callable_, step, clk="host", end=None):
            n = len(rank)
            columns["rank"].append(rank)
            columns["epoch"].append(epoch)
            columns["depth"].append(np.full(n, depth, dtype=np.int64))
            columns["name"].append(np.full(n, name, dtype=object))
            columns["ts"].append(ts)
            columns["dur"].append(dur)
            columns["end"].append(ts + dur if end is None else end)
            columns["clk"].append(np.full(n, clk, dtype=object))
            columns["hid"].append(np.full(n, hid, dtype=object))
            columns["callable"].append(np.full(n, callable_, dtype=object))
            columns["step"].append(step)

        keep_counts = self.steps_per_rank()
        hid, callable_ = DECODE_HID, fmt.DECODE_CALLABLE
        for t, first_epoch, measured, step0 in blocks:
            steps = t.bind_start_ns.shape[1]
            rank_grid, step_grid = np.meshgrid(np.arange(self.ranks), np.arange(steps), indexing="ij")
            keep = step_grid + step0 < (keep_counts[:, None] if measured else steps)
            r = rank_grid[keep]
            s = step_grid[keep]
            epoch = s + first_epoch + (1 if self.prefill else 0)
            step = s + step0 + self.first_step if measured else np.full(len(s), -1)

            def sel(values: np.ndarray, keep: np.ndarray = keep) -> np.ndarray:
                return values[keep]

            root_start, root_end = sel(t.root_start_ns), sel(t.root_end_ns)
            add(r, epoch, 0, fmt.ROOT, root_start, root_end - root_start, hid, callable_, step)
            bs, be = sel(t.bind_start_ns), sel(t.bind_end_ns)
            add(r, epoch, 1, fmt.BIND, bs, be - bs, hid, callable_, step)
            if self.bind_children:
                half = (be - bs) // 2
                add(r, epoch, 2, fmt.BIND_ARGS, bs, half, hid, callable_, step)
                add(r, epoch, 2, fmt.BIND_PREBUILT, bs + half, (be - bs) - half, hid, callable_, step)
            rs, re_ = sel(t.runner_start_ns), sel(t.runner_end_ns)
            add(r, epoch, 1, fmt.RUNNER_RUN, rs, re_ - rs, hid, callable_, step)
            if self.device_phases:
                add(r, epoch, 2, fmt.FENCE_WAIT, sel(t.fence_start_ns), sel(t.fence_wait_ns), hid, callable_, step)
                # device clock: a per-invocation origin far from the host axis;
                # written when the fence completes, like the real runtime
                dev_ts = np.full(len(r), 1_000, dtype=np.int64)
                add(
                    r,
                    epoch,
                    2,
                    fmt.DEVICE_WALL,
                    dev_ts,
                    sel(t.device_wall_ns),
                    hid,
                    callable_,
                    step,
                    clk="dev",
                    end=sel(t.fence_start_ns) + sel(t.fence_wait_ns),
                )
            cs, ce = sel(t.claim_start_ns), sel(t.claim_end_ns)
            add(r, epoch, 1, fmt.CLAIM_RELEASE, cs, ce - cs, hid, callable_, step)
            vs, ve = sel(t.validate_start_ns), sel(t.validate_end_ns)
            add(r, epoch, 1, fmt.VALIDATE, vs, ve - vs, hid, callable_, step)

        if self.prefill and first == 0 and self.first_step == 0:  # a continuation had its prefill earlier
            r = np.arange(self.ranks)
            ts = np.full(self.ranks, T0_MONO_NS - 50_000_000, dtype=np.int64)
            dur = np.full(self.ranks, 30_000_000, dtype=np.int64)
            add(r, np.zeros(self.ranks, dtype=np.int64), 0, fmt.ROOT, ts, dur, PREFILL_HID, PREFILL_CALLABLE, np.full(self.ranks, -1))
            zero, no_step = np.zeros(self.ranks, dtype=np.int64), np.full(self.ranks, -1)
            for depth, name, start, length in (
                (1, fmt.BIND, ts, 1_000_000),
                (1, fmt.RUNNER_RUN, ts + 1_000_000, dur - 2_000_000),
                (1, fmt.CLAIM_RELEASE, ts + 1_100_000, 50_000),
                (1, fmt.VALIDATE, ts + dur - 900_000, 500_000),
            ):
                add(
                    r,
                    zero,
                    depth,
                    name,
                    start,
                    np.broadcast_to(length, (self.ranks,)).astype(np.int64),
                    PREFILL_HID,
                    PREFILL_CALLABLE,
                    no_step,
                )
        return {k: np.concatenate(v) for k, v in columns.items()}

    # -- writers ------------------------------------------------------------------

    def write(self, out_dir: str | Path) -> Path:
        """Write the artifact directory; returns it."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.write_server_log(out / artifacts.SERVER_LOG)
        if self.sa_profile:
            (out / artifacts.SERVING_TRACE_DIR).mkdir(exist_ok=True)
            self.write_sa_profile(out / artifacts.SERVING_TRACE_DIR / artifacts.MERGED_TRACE)
        if self.performance_summary:
            (out / artifacts.PERFORMANCE_SUMMARY).write_text(json.dumps(self.performance_summary_dict(), indent=2))
        return out

    def write_server_log(self, path: str | Path, block_steps: int = 2_000) -> None:
        """Write the log a block of steps at a time, so a day-long run is written in bounded memory."""
        timings = self.timings()
        with open(path, "wb") as f:
            f.write(text_buffer(self._lines(self._header_lines(timings))))
            for first in range(0, self.steps, block_steps):  # a loop over blocks of steps
                stop = min(first + block_steps, self.steps)
                f.write(text_buffer(self._lines(self._record_lines(first, stop, timings))))
            if self.torn_tail:
                f.write(b"[mono_ns=99][T0x1][INFO] strace: [STRACE] v=1 pid=1 tid=1 inv=3 hid=ab depth=0 name=chip.r")

    def _record_lines(self, first: int, stop: int, timings: Timings) -> tuple[np.ndarray, pa.Array]:
        """(sort keys, text) of the records of steps [first, stop), with the noise lines between them."""
        rows = self._span_rows(first, stop, timings)
        rank = rows["rank"].astype(np.int64)
        pid = rank + self.base_pid
        tid = pid  # each rank process runs its invocations on its main thread
        epoch = rows["epoch"].astype(np.int64)
        end = rows["end"].astype(np.int64)
        columns = {
            "pid": pid,
            "tid": tid,
            "inv": invocation_id(pid, epoch),
            "hid": rows["hid"],
            "depth": rows["depth"],
            "name": rows["name"],
            "ts": rows["ts"],
            "dur": rows["dur"],
        }
        payload = join_text(*fmt.payload_parts(columns))
        is_dev = rows["clk"] == fmt.CLK_DEVICE
        payload = pc.if_else(pa.array(is_dev), pc.binary_join_element_wise(payload, f" {fmt.CLK_ATTR}={fmt.CLK_DEVICE}", ""), payload)
        if self.root_attrs:
            attrs = join_text(
                " run_id=",
                epoch,
                " dispatch_id=",
                epoch + 1 if self.dispatch_ids else np.zeros_like(epoch),
                " run_epoch=",
                epoch,
                " slot_id=",
                epoch % 2,
                " generation=",
                epoch // 2,
                " rank=",
                rank,
                " device=npu:",
                rank,
                " callable=",
                rows["callable"],
                " step=",
                rows["step"],
            )
            payload = pc.if_else(pa.array(rows["depth"] == 0), pc.binary_join_element_wise(payload, attrs, ""), payload)
        if self.host_evidence:  # the emitting thread ran the whole span, never waited for a CPU
            evidence = join_text(f" {fmt.OS_CPU_NS}=", rows["dur"], f" {fmt.OS_RQ_NS}=0 {fmt.OS_NIVCSW}=0 {fmt.OS_MAJFLT}=0")
            payload = pc.binary_join_element_wise(payload, evidence, "")
        keys, texts = [end], [join_text("[mono_ns=", end, "][T0x", _hex(tid), "][INFO] strace: ", payload)]
        if self.unrelated_lines_per_step:
            n = (stop - first) * self.unrelated_lines_per_step
            index = (self.first_step + first) * self.unrelated_lines_per_step + np.arange(n, dtype=np.int64)
            when = T0_MONO_NS + index * (self.period // self.unrelated_lines_per_step) + 7_777
            keys.append(when)
            texts.append(
                join_text(
                    "[mono_ns=",
                    when,
                    "][T0x",
                    _hex(np.full(n, self.base_pid - 1)),
                    "][INFO] scheduler: batch ",
                    index,
                    " admitted 4 requests [queue=0] depth=2 name=x",
                )
            )
        return np.concatenate(keys), pa.concat_arrays(texts)

    def _header_lines(self, timings: Timings) -> tuple[np.ndarray, pa.Array]:
        """Each rank process's clock anchor and chip_process ready line, before its first span."""
        start = int(min(timings.bind_start_ns.min(), T0_MONO_NS - 50_000_000)) - 10_000_000
        lines, keys = [], []
        for r in range(self.ranks):  # one line per rank process, not per span
            p = self.pid(r)
            mono = start + r * 1_000
            if self.anchors:
                lines.append(fmt.format_anchor_record(p, mono, WALL0_NS + (mono - T0_MONO_NS), p))
                keys.append(mono)
            if self.chip_ready_lines:
                lines.append(fmt.format_prefix(mono + 500, p, "INFO", "chip_process") + fmt.format_chip_ready_payload(p, self.device(r)))
                keys.append(mono + 500)
        return np.asarray(keys, dtype=np.int64), pa.array(lines, pa.string())

    def _lines(self, keyed: tuple[np.ndarray, pa.Array]) -> pa.Array:
        """Lines in time order with their line breaks (every n-th record sharing a line with the next)."""
        keys, text = keyed
        if len(text) == 0:
            return text
        text = text.take(pa.array(np.argsort(keys, kind="stable")))
        sep = np.full(len(text), "\n", dtype=object)
        if self.two_per_line_every:
            # only a record is joined to the next line: a clock anchor must end its line (SPEC §2, the stack's rule)
            is_anchor = pc.match_substring(text, fmt.ANCHOR_MARKER).to_numpy(zero_copy_only=False)
            joined = np.arange(self.two_per_line_every - 1, len(text) - 1, self.two_per_line_every)
            sep[joined[~is_anchor[joined]]] = ""
        return pc.binary_join_element_wise(text, pa.array(sep, pa.string()), "")

    def request_spans(self) -> list[dict]:
        """SA_PROFILE request spans: one per request, spanning the serving window."""
        w0, w1 = self.serving_window_ns
        spans = []
        n_requests = self.ranks * self.requests_per_rank
        tokens = self.tokens_returned_per_request()
        for q in range(n_requests):
            spans.append(
                {
                    "name": "request",
                    "cat": "request",
                    "ph": "X",
                    "ts": w0 // 1000 + q,
                    "dur": (w1 - w0) // 1000 - q,
                    "pid": self.base_pid - 1,
                    "tid": 1,
                    "args": {
                        "request_id": f"req-{q}",
                        "prompt_tokens": self.prompt_tokens,
                        "output_tokens": int(tokens[q]),
                        "expected_tokens": self.output_tokens,
                    },
                }
            )
        return spans

    def tokens_returned_per_request(self) -> np.ndarray:
        return np.full(self.ranks * self.requests_per_rank, self.output_tokens, dtype=np.int64)

    def write_sa_profile(self, path: str | Path) -> None:
        """The merged SA_PROFILE trace: request and serving spans, a scheduler span per step and,
        with ``sa_worker_spans``, a worker and a kernel span per (rank, step) (built column-wise)."""
        t = self.timings()
        serving_pid = self.base_pid - 1
        events = [{"ph": "M", "name": "process_name", "pid": serving_pid, "tid": 0, "args": {"name": "serving"}}]
        events += self.request_spans()
        w0, w1 = self.serving_window_ns
        events.append(
            {
                "name": "serving.batch",
                "cat": "serving",
                "ph": "X",
                "ts": w0 // 1000,
                "dur": (w1 - w0) // 1000,
                "pid": serving_pid,
                "tid": 1,
                "args": {},
            }
        )
        for rank in range(self.ranks):  # start-up spans long before the batch, as the real stack writes them
            events.append(
                {
                    "name": "worker.init",
                    "cat": "worker",
                    "ph": "X",
                    "ts": (T0_MONO_NS - 200_000_000) // 1000,
                    "dur": 100_000,
                    "pid": self.pid(rank),
                    "tid": self.pid(rank),
                    "args": {"rank": rank},
                }
            )
        lines = [json.dumps(e) for e in events]
        step_start = t.root_start_ns.min(axis=0) // 1000
        step_end = t.root_end_ns.max(axis=0) // 1000
        steps = np.arange(self.steps)
        columns = [
            join_text(
                '{"name": "scheduler.step", "cat": "scheduler", "ph": "X", "ts": ',
                step_start,
                ', "dur": ',
                step_end - step_start,
                f', "pid": {serving_pid}, "tid": 2, "args": {{"step": ',
                self.first_step + steps,
                "}}",
            )
        ]
        if not self.sa_worker_spans:  # the worker category still appears, once per step
            columns.append(
                join_text(
                    '{"name": "worker.step", "cat": "worker", "ph": "X", "ts": ',
                    step_start,
                    ', "dur": ',
                    step_end - step_start,
                    f', "pid": {serving_pid}, "tid": 3, "args": {{"step": ',
                    self.first_step + steps,
                    "}}",
                )
            )
        else:
            rs, ss = np.nonzero(steps[None, :] < self.steps_per_rank()[:, None])
            pid = rs + self.base_pid
            for name, cat, start, end in (
                ("worker.execute", "worker", t.root_start_ns, t.root_end_ns),
                ("kernel.decode_fwd", "kernel", t.runner_start_ns, t.runner_end_ns),
            ):
                ts = start[rs, ss] // 1000
                columns.append(
                    join_text(
                        f'{{"name": "{name}", "cat": "{cat}", "ph": "X", "ts": ',
                        ts,
                        ', "dur": ',
                        end[rs, ss] // 1000 - ts,
                        ', "pid": ',
                        pid,
                        ', "tid": ',
                        pid,
                        ', "args": {"step": ',
                        self.first_step + ss,
                        "}}",
                    )
                )
        text = pa.concat_arrays([pa.array(lines, pa.string()), *columns])
        separators = np.full(len(text), ",\n", dtype=object)
        separators[-1] = "\n"
        with open(path, "wb") as f:
            f.write(b'{"traceEvents": [\n')
            f.write(text_buffer(pc.binary_join_element_wise(text, pa.array(separators, pa.string()), "")))
            f.write(b"]}\n")

    def performance_summary_dict(self) -> dict:
        tokens = int(self.tokens_returned_per_request().sum())
        w0, w1 = self.serving_window_ns
        elapsed_s = (w1 - w0) / 1e9
        n_requests = self.ranks * self.requests_per_rank
        return {
            "schema": artifacts.PERFORMANCE_SUMMARY_SCHEMA,
            "exit_status": 0,
            "batch_elapsed_s": round(elapsed_s, 6),
            "tokens_returned": tokens,
            "tokens_expected": n_requests * self.output_tokens,
            "throughput_tok_s": round(tokens / elapsed_s, 3),
            "effective_tpot_ms": round(elapsed_s * 1000 / (tokens / n_requests), 3),
            "acceptance_rate": self.acceptance_rate,
            "decode_steps": self.steps,
            "workload": {
                "preset": "synthetic",
                "ranks": self.ranks,
                "dp": self.ranks,
                "ep": self.ranks,
                "tp": 1,
                "requests": n_requests,
                "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens,
                "layers": 0,
                "metadata": "async",
                "depth": 2 if self.pipelined else 1,
                "device_phases": self.device_phases,
                "seed": 0,
            },
        }


def _step_slice(timings: Timings, first: int, stop: int) -> Timings:
    """The timings of steps [first, stop)."""
    return Timings(**{name: getattr(timings, name)[:, first:stop] for name in Timings.__dataclass_fields__})


def invocation_id(pid: np.ndarray, epoch: np.ndarray) -> np.ndarray:
    """A 64-bit per-process invocation id (not a step number): a mixed hash of (pid, epoch)."""
    with np.errstate(over="ignore"):
        mixed = (epoch.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        return mixed ^ (pid.astype(np.uint64) << np.uint64(20))


def _hex(values: np.ndarray) -> pa.Array:
    """Lower-case hex text of non-negative ints (the thread-id part of the prefix)."""
    values = np.asarray(values, dtype=np.int64)
    uniq, inverse = np.unique(values, return_inverse=True)
    return pa.array([format(int(v), "x") for v in uniq], pa.string()).take(pa.array(inverse))
