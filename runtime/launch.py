"""Launcher: start every rank process, collect the returned tokens, write the artifacts.

Artifact directory (docs/ARCHITECTURE.md, names from dsprof.profiler.artifacts):
``server.log`` (all ranks' stderr: each rank's fd 2 is the one file
descriptor the launcher opened on it), ``serving-trace/`` (SA_PROFILE
fragments + merged ``trace.json``), ``performance_summary.json`` and, when
faults are injected, ``faults.json`` — both written atomically at the end of
the run, before anything analyses it.

The ranks die with the launcher: each arms PR_SET_PDEATHSIG, and all of them
(with any helper process a rank forks) share one process group that the
launcher kills at the end. SIGTERM is handled like Ctrl-C: the ranks are
stopped, the artifacts of what ran are written, and the interrupt is raised
again to the caller.
"""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing
import os
import queue as queue_module
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from dsprof.errors import DsprofError
from dsprof.fileio import atomic_write_text
from dsprof.profiler import artifacts, sa_profile, strace
from dsprof.runtime import faults as fault_kinds
from dsprof.runtime.config import RuntimeConfig
from dsprof.runtime.device import make_device
from dsprof.runtime.distributed import free_port, init_distributed, shutdown_distributed
from dsprof.runtime.faults import FaultPlan, parse_faults
from dsprof.runtime.injectors import CpuNeighbour, GcPause
from dsprof.runtime.processes import (
    cpu_for_rank,
    die_with_parent,
    exit_status_of,
    pin_to_cpu,
    raise_on_sigterm,
    signal_of,
)
from dsprof.runtime.serving import Injectors, RankServer, plan_serving
from dsprof.runtime.torch_profile import RankProfile
from dsprof.runtime.torch_profile import remove_stale as remove_stale_profiles
from dsprof.runtime.worker import DistributedWorker

EXIT_OK, EXIT_RANK_FAILED, EXIT_TOKENS_MISSING = 0, 1, 3
_KILL_GRACE_S = 2.0  # after a rank fails: SIGTERM the rest, SIGKILL what is left after this
_FAILURE_REPORT_WAIT_S = 0.3  # after the first failure, for the other ranks' reports to arrive
_PROGRESS_INTERVAL_S = 0.3
# Errors a rank sees because a *peer* died (not its own fault).
_PEER_ERROR_MARKS = ("connection closed", "connection reset", "gloo", "nccl", "broken pipe", "timed out")


@dataclass
class RunOutcome:
    exit_status: int
    out_dir: Path
    summary: dict | None
    failed_rank: int | None
    message: str
    tokens: dict[int, list[int]] = field(default_factory=dict)  # request id -> output tokens returned


class QueueSink:
    """A rank's channel to the launcher (tokens, faults, lifecycle); ``channel`` has ``put``."""

    def __init__(self, channel):
        self.channel = channel

    def tokens(self, rank: int, step: int, returned: dict[int, list[int]], verified: int, accepted: int) -> None:
        self.channel.put(("tokens", rank, step, returned, verified, accepted, time.perf_counter_ns()))

    def fault(self, event: dict) -> None:
        self.channel.put(("fault", event))

    def measured(self, event: fault_kinds.FaultEvent, rank: int, found: dict) -> None:
        """What ``rank`` measured of ``event`` (its own, or a CPU neighbour's that starved it too)."""
        self.channel.put(("measured", (event.kind, event.rank, event.step), rank, found))

    def send(self, *message) -> None:
        self.channel.put(message)


class ListSink(QueueSink):
    """Keeps a rank's messages in a list (torchrun: gathered to rank 0 at the end)."""

    def __init__(self):
        self.messages: list[tuple] = []
        super().__init__(self)

    def put(self, message: tuple) -> None:
        self.messages.append(message)


def run_rank(config: RuntimeConfig, rank: int, world: int, master_addr: str, master_port: int, out_dir: Path, sink) -> dict:
    """Body of one rank process: join the group, build the shard, prefill, decode."""
    plan = FaultPlan(parse_faults(config.inject, config.ranks), config.ranks, config.seed)
    cpu_mates: frozenset[int] = frozenset()
    neighbour = None
    if plan.injects(fault_kinds.CPU_CONTENTION):
        cpu_mates = frozenset(r for r in range(world) if cpu_for_rank(r) == cpu_for_rank(rank))  # before pinning
        neighbour = _prepare_cpu_contention(plan, rank)
    torch.set_num_threads(1)
    if config.profile:
        strace.set_host_evidence(config.host_evidence)
        strace.enable(2)
        sa_profile.configure(out_dir / artifacts.SERVING_TRACE_DIR, config.profile_level)
    else:
        strace.disable()
        sa_profile.shutdown()
    device = None
    profile = RankProfile(out_dir, rank) if config.torch_profiler else None
    try:
        par = init_distributed(
            rank,
            world,
            config.tp,
            master_addr,
            master_port,
            metadata_group=config.metadata == "device-resident",
            peer_source=config.peer_source,
        )

        def on_device_thread_start() -> None:
            torch.set_num_threads(1)
            sa_profile.set_thread_name(f"device executor (rank {rank})")

        device = make_device(rank, config.copy_latency_ms, on_start=on_device_thread_start)
        strace.chip_process_ready(device.name)
        sa_profile.set_process_name(f"rank {rank} ({device.name})")
        sa_profile.set_thread_name("host")
        worker = DistributedWorker(rank, device)
        serving = plan_serving(config)
        with sa_profile.span("worker.init", "worker", rank=rank):
            gc_pauses = _prepare_gc_pauses(plan, rank, device)
            server = RankServer(config, par, device, worker, serving, sink, Injectors(plan, neighbour, *gc_pauses, cpu_mates))
        sink.send("up", rank, device.name, os.getpid())
        if profile is not None:  # before the ranks meet: every rank's trace holds the same collective calls
            profile.start()  # (its first start takes most of a second: not in the batch time)
        dist.barrier()
        sink.send("start", rank, time.perf_counter_ns())
        server.serve()
        if profile is not None:
            profile.stop()
        dist.barrier()
        stats = {"verified": server.verified, "accepted": server.accepted, "allocations": worker.allocations()}
        sink.send("done", rank, stats)
        return stats
    finally:
        if profile is not None:  # what a failed rank recorded (once: a stopped profile does nothing)
            with contextlib.suppress(Exception):
                profile.stop()
        if device is not None:
            device.close()
        if neighbour is not None:
            neighbour.close()
        sa_profile.flush()


def _prepare_gc_pauses(plan: FaultPlan, rank: int, device) -> tuple[GcPause | None, GcPause | None]:
    """The gc pauses this rank can inject, (on the host thread, inside the device program), each
    calibrated on the thread that will collect (each thread has its own heap arena)."""
    host_ms = plan.most_ms(fault_kinds.GC_PAUSE, rank, fault_kinds.AT_HOST)
    device_ms = plan.most_ms(fault_kinds.GC_PAUSE, rank, fault_kinds.AT_DEVICE)
    on_device: list[GcPause] = []
    if device_ms:
        device.submit(lambda _clock: on_device.append(GcPause(device_ms))).wait()
    return (GcPause(host_ms) if host_ms else None), (on_device[0] if on_device else None)


def _prepare_cpu_contention(plan: FaultPlan, rank: int) -> CpuNeighbour | None:
    """Pin this rank to its CPU for the whole run; fork the neighbour that will contend for it if it can be hit.

    Called before this process starts any thread: the neighbour is forked from
    a single-threaded process, and every thread started later (executor, gloo)
    inherits the pinning.
    """
    cpu = cpu_for_rank(rank)
    pin_to_cpu(cpu)
    return CpuNeighbour(cpu) if plan.most_ms(fault_kinds.CPU_CONTENTION, rank) else None


def _rank_process(config: RuntimeConfig, rank: int, port: int, out_dir: Path, log_fd: int, channel, launcher_pid: int, group: int) -> None:
    """Entry of a forked rank: dies with the launcher, joins the ranks' process group (``group`` 0: leads it),
    turns SIGTERM into an interrupt, and makes stderr the shared server.log descriptor."""
    die_with_parent(launcher_pid)
    # The rank's collections never walk the heap it inherited from the launcher: that is not the rank's
    # garbage (a gc_pause fault measures its own), and a launcher that forked while its other threads
    # were mid-update (a test runner, a notebook) may have left objects the collector must not touch.
    gc.freeze()
    with contextlib.suppress(OSError):  # the launcher sets it too, whichever comes first
        os.setpgid(0, group)
    raise_on_sigterm()
    sys.stderr.flush()
    os.dup2(log_fd, 2)
    # Whatever Python itself prints (warnings) goes to fd 2 line by line, not to
    # a parent's replacement of sys.stderr (e.g. a test runner's capture).
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sink = QueueSink(channel)
    code = 0
    try:
        run_rank(config, rank, config.ranks, "127.0.0.1", port, out_dir, sink)
        shutdown_distributed()
    except BaseException as error:  # report, then die: the launcher stops the job
        os.write(2, f"rank {rank} failed:\n{traceback.format_exc()}".encode(errors="backslashreplace"))
        text = f"{type(error).__name__}: {error}"
        sink.send("failed", rank, text, any(mark in text.lower() for mark in _PEER_ERROR_MARKS))
        code = 1
    finally:
        sa_profile.flush()
        channel.close()
        channel.join_thread()
    os._exit(code)


class _Ranks:
    """The rank processes of one run, in one process group (led by rank 0) that dies with them."""

    def __init__(self) -> None:
        self.procs: list = []
        self.group: int | None = None

    def start(self, context, config: RuntimeConfig, port: int, out: Path, log_fd: int, channel) -> None:
        launcher = os.getpid()
        for rank in range(config.ranks):
            proc = context.Process(
                target=_rank_process, name=f"dsprof-rank{rank}", args=(config, rank, port, out, log_fd, channel, launcher, self.group or 0)
            )
            proc.start()
            self.procs.append(proc)
            if self.group is None:
                self.group = proc.pid
            with contextlib.suppress(OSError):  # set from both sides: no race with the child's own setpgid
                os.setpgid(proc.pid, self.group)

    def stop(self) -> None:
        """SIGTERM the ranks still running, SIGKILL them after a grace period, then anything left in their group."""
        for proc in self.procs:
            if proc.exitcode is None:
                proc.terminate()
        deadline = time.monotonic() + _KILL_GRACE_S
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.exitcode is None:
                proc.kill()
                proc.join(1.0)
        if self.group is not None:  # helpers a rank forked (they also die with their rank)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.group, signal.SIGKILL)


class _Collector:
    """Launcher-side state: what the ranks reported."""

    def __init__(self, config: RuntimeConfig, plan, progress: Callable[[str], None] | None):
        self.config, self.plan, self.progress = config, plan, progress
        self.devices: dict[int, str] = {}
        self.starts: dict[int, int] = {}
        self.done: set[int] = set()
        self.failures: list[tuple[int, str, bool]] = []
        self.faults: list[dict] = []
        self.measured: dict[tuple[str, int, int], dict[int, dict]] = {}  # (kind, rank, step) -> measuring rank -> found
        self.programs: dict[tuple[int, int], fault_kinds.ProgramWindow] = {}  # (rank, step) -> window
        self.host_phases: dict[tuple[int, int], fault_kinds.HostPhases] = {}  # (rank, step) -> host stretches
        self.tokens: dict[int, list[int]] = {rid: [] for rid in range(config.requests)}
        self.last_token_ns: dict[int, int] = {}
        self.verified: dict[int, int] = {}
        self.accepted: dict[int, int] = {}
        self.step = -1
        self.returned = 0
        self.expected = sum(plan.tokens_expected.values())
        self._last_progress = 0.0

    def handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "tokens":
            _, rank, step, returned, verified, accepted, now = message
            for rid, toks in returned.items():
                self.tokens[rid].extend(toks)
                self.last_token_ns[rid] = now
                self.returned += len(toks)
            self.verified[rank], self.accepted[rank] = verified, accepted
            self.step = max(self.step, step)
            self._report(f"decode step {self.step + 1}/{self.plan.decode_steps - self.plan.warmup}, tokens {self.returned}/{self.expected}")
        elif kind == "fault":
            self.faults.append(message[1])
        elif kind == "measured":
            self.measured.setdefault(message[1], {})[message[2]] = message[3]
        elif kind == "program":  # a device program's window near a cpu_contention step
            self.programs[(message[1], message[2])] = message[3:]
        elif kind == "host_phases":  # the host thread's stretches of a run near a cpu_contention step
            self.host_phases[(message[1], message[2])] = message[3]
        elif kind == "up":
            self.devices[message[1]] = message[2]
            self._report(f"ranks up {len(self.devices)}/{self.config.ranks}", force=len(self.devices) == self.config.ranks)
        elif kind == "start":
            self.starts[message[1]] = message[2]
        elif kind == "done":
            self.done.add(message[1])
        elif kind == "failed":
            self.failures.append((message[1], message[2], message[3]))

    def _report(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if self.progress is not None and (force or now - self._last_progress >= _PROGRESS_INTERVAL_S):
            self._last_progress = now
            self.progress(text)


def _culprit(collector: _Collector, procs: list) -> tuple[int, str]:
    """The rank that failed first on its own (not because a peer vanished)."""
    own = [f for f in collector.failures if not f[2]]
    if own:
        return own[0][0], own[0][1]
    silent = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in {f[0] for f in collector.failures}]
    if silent:
        code = procs[silent[0]].exitcode
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        return silent[0], f"rank process died ({how})"
    rank, text, _ = collector.failures[0]
    return rank, text


def run_workload(config: RuntimeConfig, out_dir: str | os.PathLike, progress: Callable[[str], None] | None = None) -> RunOutcome:
    """Run the workload in ``config.ranks`` rank processes and write the artifact directory.

    On Ctrl-C or SIGTERM (in the main thread) the ranks are stopped, the
    artifacts of what ran are written, and the KeyboardInterrupt (or
    :class:`~dsprof.runtime.processes.Terminated`) is raised again.
    """
    config.validate()
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DsprofError(f"cannot create output directory {out}: {error.strerror}") from None
    for stale in (artifacts.PERFORMANCE_SUMMARY, artifacts.FAULTS):
        (out / stale).unlink(missing_ok=True)
    remove_stale_profiles(out)
    if config.profile:
        sa_profile.configure(out / artifacts.SERVING_TRACE_DIR, config.profile_level, main=True)
        sa_profile.set_process_name("dsprof launcher")
    else:  # also stops a recorder an earlier run in this process left on
        sa_profile.shutdown()
    with sa_profile.span("scheduler.plan", "scheduler", requests=config.requests, dp=config.dp):
        plan = plan_serving(config)
    collector = _Collector(config, plan, progress)
    log_fd = os.open(out / artifacts.SERVER_LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    context = multiprocessing.get_context("fork")
    channel = context.Queue()
    ranks = _Ranks()
    launch_ns = time.perf_counter_ns()
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous_handler = raise_on_sigterm() if on_main_thread else None
    interrupted: KeyboardInterrupt | None = None
    try:
        ranks.start(context, config, free_port(), out, log_fd, channel)
        _wait_for_ranks(ranks.procs, channel, collector)
        failed_rank, message = _failure(collector, ranks.procs)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM
        interrupted = stop
        if on_main_thread:  # a second SIGTERM ends the launcher at once; the ranks die with it
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        failed_rank, message = None, f"interrupted by {signal_of(stop).name}: the ranks were stopped"
    finally:
        ranks.stop()
        _drain(channel, collector)
        os.close(log_fd)
    outcome = _finish(
        config,
        out,
        plan,
        collector,
        launch_ns,
        failed_rank,
        message,
        progress,
        exit_status_of(interrupted) if interrupted is not None else None,
    )
    if on_main_thread:
        signal.signal(signal.SIGTERM, previous_handler)
    if interrupted is not None:
        raise interrupted
    return outcome


def _wait_for_ranks(procs: list, channel, collector: _Collector) -> None:
    """Handle reports until every rank is done, or shortly after the first failure."""
    failed_at = None
    while len(collector.done) < len(procs):
        try:
            collector.handle(channel.get(timeout=0.05))
            continue
        except queue_module.Empty:
            pass
        if collector.failures or any(p.exitcode not in (None, 0) for p in procs):
            failed_at = failed_at or time.monotonic()
            if time.monotonic() - failed_at > _FAILURE_REPORT_WAIT_S:
                return
        elif all(p.exitcode is not None for p in procs):
            return
    for proc in procs:
        proc.join(10.0)


def _failure(collector: _Collector, procs: list) -> tuple[int | None, str]:
    """(failed rank, message) — (None, "") when every rank finished."""
    if collector.failures or any(p.exitcode not in (None, 0) for p in procs):
        rank, reason = _culprit(collector, procs)
        return rank, f"rank {rank} ({collector.devices.get(rank, '?')}) failed: {reason}"
    if len(collector.done) < len(procs):
        return None, "ranks stopped without finishing"
    return None, ""


def _drain(channel, collector: _Collector) -> None:
    """Handle the reports still queued; stop at the first that cannot be read.

    After Ctrl-C or SIGTERM the launcher may have stopped in the middle of
    reading a report: the next read then starts inside it and unpickles
    garbage (any exception), which must not replace the interrupt.
    """
    while True:
        try:
            collector.handle(channel.get_nowait())
        except Exception:  # none left (queue.Empty), a report torn by the interrupt, the channel closed: the rest is lost
            return


def _finish(
    config: RuntimeConfig,
    out: Path,
    plan,
    collector: _Collector,
    launch_ns: int,
    failed_rank: int | None,
    message: str,
    progress,
    interrupted_status: int | None = None,
) -> RunOutcome:
    """Merge the SA_PROFILE fragments and write performance_summary.json and faults.json (atomically)."""
    start_ns = min(collector.starts.values()) if collector.starts else launch_ns
    end_ns = max(collector.last_token_ns.values()) if collector.last_token_ns else start_ns
    elapsed_s = (end_ns - start_ns) / 1e9
    missing = {
        rid: plan.tokens_expected[rid] - len(toks) for rid, toks in collector.tokens.items() if len(toks) != plan.tokens_expected[rid]
    }
    if interrupted_status is not None:
        status = interrupted_status
    elif failed_rank is not None or message:
        status = EXIT_RANK_FAILED
    elif missing:
        status = EXIT_TOKENS_MISSING
        message = f"{len(missing)} request(s) did not get all their tokens back"
    else:
        status = EXIT_OK
        message = f"{collector.returned} tokens returned by {config.ranks} ranks"
    if config.profile:
        dp_rank_of = {rid: dp for dp, rids in enumerate(plan.requests_of_dp) for rid in rids}
        for rid, last in collector.last_token_ns.items():
            sa_profile.complete(
                "request",
                "request",
                start_ns // 1000,
                (last - start_ns) // 1000,
                request_id=rid,
                dp_rank=dp_rank_of[rid],
                prompt_tokens=config.prompt_tokens,
                output_tokens=len(collector.tokens[rid]),
            )
        sa_profile.complete(
            "serving.batch", "serving", start_ns // 1000, (end_ns - start_ns) // 1000, requests=config.requests, tokens=collector.returned
        )
        if progress:
            progress("merging SA_PROFILE fragments")
        sa_profile.merge_fragments(out / artifacts.SERVING_TRACE_DIR)  # flushes this process's fragment first
        sa_profile.shutdown()  # nothing more goes into this run's fragments
    verified = sum(collector.verified.values())
    # tokens each request actually got back (as analysis/stages/serving.py counts them): after a
    # failure the TPOT must reflect the missing tokens, not the ones that were planned
    requests = len(plan.tokens_expected) or config.requests
    returned_per_request = collector.returned / requests
    summary = {
        "schema": artifacts.PERFORMANCE_SUMMARY_SCHEMA,
        "exit_status": status,
        "batch_elapsed_s": round(elapsed_s, 6),
        "tokens_returned": collector.returned,
        "tokens_expected": collector.expected,
        "throughput_tok_s": round(collector.returned / elapsed_s, 3) if elapsed_s > 0 else None,
        "effective_tpot_ms": round(elapsed_s * 1000 / returned_per_request, 3) if returned_per_request else None,
        "acceptance_rate": round(sum(collector.accepted.values()) / verified, 4) if verified else None,
        "acceptance_rate_configured": config.acceptance_rate,
        "acceptance_synthetic": True,
        "decode_steps": plan.decode_steps - plan.warmup,
        "warmup_steps": plan.warmup,
        "failed_rank": failed_rank,
        "message": message,
        "devices": {str(r): d for r, d in sorted(collector.devices.items())},
        "workload": config.workload(),
    }
    atomic_write_text(out / artifacts.PERFORMANCE_SUMMARY, json.dumps(summary, indent=2) + "\n")
    if config.inject:
        faults = sorted((_with_measured(f, collector) for f in collector.faults), key=lambda f: (f["step"], f["rank"], f["kind"]))
        atomic_write_text(
            out / artifacts.FAULTS,
            json.dumps({"schema": artifacts.FAULTS_SCHEMA, "seed": config.seed, "specs": list(config.inject), "faults": faults}, indent=2)
            + "\n",
        )
    return RunOutcome(status, out, summary, failed_rank, message, collector.tokens)


def _with_measured(fault: dict, collector: _Collector) -> dict:
    """A faults.json entry with what the ranks measured of it."""
    found = collector.measured.get((fault["kind"], fault["rank"], fault["step"]), {})
    if fault["kind"] == fault_kinds.CPU_CONTENTION:
        found = fault_kinds.contention_loss(fault, found, collector.programs, collector.host_phases)
    return fault_kinds.with_measured(fault, found)


def run_torchrun_rank(config: RuntimeConfig, out_dir: str | os.PathLike, rank: int, world: int) -> int:
    """One rank started by torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set).

    Ranks keep their reports locally; rank 0 gathers them after the final
    barrier and writes performance_summary.json (and faults.json). The ranks'
    stderr is wherever torchrun sends it: redirect it to ``DIR/server.log``.
    """
    if world != config.ranks:
        raise DsprofError(f"WORLD_SIZE={world} does not match --ranks {config.ranks}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sink = ListSink()
    launch_ns = time.perf_counter_ns()
    run_rank(config, rank, world, os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500")), out, sink)
    gathered: list | None = [None] * world if rank == 0 else None
    dist.gather_object(sink.messages, gathered, dst=0)
    status = EXIT_OK
    if rank == 0:
        plan = plan_serving(config)
        collector = _Collector(config, plan, None)
        for messages in gathered or []:
            for message in messages:
                collector.handle(message)
        status = _finish(config, out, plan, collector, launch_ns, None, "", None).exit_status
    shutdown_distributed()
    return status
