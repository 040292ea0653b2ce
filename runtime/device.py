"""The device layer: one in-order stream per rank with completion fences.

On CPU a rank's "device" is an executor thread that runs submitted programs in
order and signals a fence for each; on CUDA the same interface uses a real
stream and events. A run's device timeline is relative to its launch, never
host timestamps. A collective inside a phase is timed through
:func:`device_wait`, which finds the clock of the program running on the
calling thread. Details: docs/RUNTIME.md, "What runs" (Device layer).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from dsprof.profiler import strace
from dsprof.profiler import strace_format as fmt
from dsprof.runtime import torch_profile
from dsprof.runtime.injectors import ThreadRunQueues, thread_run_queue_ns

# A device phase: (path below device_wall, start offset from the launch ns, duration ns, attributes).
Phase = tuple[str, int, int, dict[str, Any]]

# The PhaseClock of the program running on this thread (the executor's, or CUDA's host enqueue).
_running = threading.local()


class PhaseClock:
    """Collects the named, possibly nested, device phases of one program run (CPU: executor clock).

    ``labelled``: each phase is also a ``record_function`` label of its span name (:mod:`.torch_profile`).
    """

    def __init__(self, origin_ns: int, labelled: bool = False):
        self.origin_ns = origin_ns
        self.labelled = labelled
        self.phases: list[Phase] = []  # (path below device_wall, start offset ns, dur ns, attributes)
        self._open: list[str] = []  # names of the phases open now, outermost first

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[dict[str, Any]]:
        """Time ``name`` inside the innermost open phase (its path is ``outer.name``).

        Yields the phase's attributes: what the body learns (a collective's ``peer``) is written with the span.
        """
        self._open.append(name)
        path = ".".join(self._open)
        attrs: dict[str, Any] = {}
        token = self._start()
        try:
            with torch_profile.label(fmt.device_phase_name(path) if self.labelled else None):
                yield attrs
        finally:
            self._open.pop()
            self._finish(path, token, attrs)

    def _start(self) -> object:
        return time.monotonic_ns()

    def _finish(self, path: str, token, attrs: dict[str, Any]) -> None:
        end = time.monotonic_ns()
        self.phases.append((path, token - self.origin_ns, end - token, attrs))

    def resolve(self) -> list[Phase]:
        return self.phases


@contextlib.contextmanager
def running(clock: PhaseClock, threads: ThreadRunQueues | None = None) -> Iterator[None]:
    """Mark ``clock`` as the one of the program this thread runs (for :func:`device_wait`).

    ``threads``: the CPU device's threads, whose run-queue wait a collective wait carries as host evidence.
    """
    _running.clock, _running.threads = clock, threads
    try:
        yield
    finally:
        _running.clock, _running.threads = None, None


def device_wait(name: str) -> contextlib.AbstractContextManager[dict[str, Any]]:
    """Time a wait of the running device program on a peer (a collective) as a nested phase.

    Yields the phase's attributes (the caller names the ``peer`` it waited for). Outside
    a device program (e.g. in a test calling the model directly) it times nothing, and
    the attributes go nowhere.
    """
    clock = getattr(_running, "clock", None)
    if clock is None:
        return contextlib.nullcontext({})
    threads = getattr(_running, "threads", None)
    return clock.phase(name) if threads is None else _wait_with_run_queue(clock, name, threads)


@contextlib.contextmanager
def _wait_with_run_queue(clock: PhaseClock, name: str, threads: ThreadRunQueues) -> Iterator[dict[str, Any]]:
    """A collective wait on the CPU device, with ``os.rq_ns``: the most run-queue wait any device thread saw in it.

    The executor blocks in the collective while the library's worker threads do
    the exchange; a CPU taken from those threads lengthens the wait as surely
    as a late peer does, and only their run-queue wait tells the two apart
    (docs/FORMATS.md "Host evidence").
    """
    with clock.phase(name) as attrs:
        started, before = time.monotonic_ns(), threads.read()
        try:
            yield attrs
        finally:
            waited, lasted = threads.most_since(before), time.monotonic_ns() - started
            if waited >= 0:  # a thread's wait is counted when it gets the CPU: some of it may precede the span
                attrs[fmt.OS_RQ_NS] = min(waited, lasted)


def running_on_cuda() -> bool:
    """Whether the device program running on this thread is enqueued on a CUDA stream (host times mean nothing there)."""
    return isinstance(getattr(_running, "clock", None), _CudaPhaseClock)


class Fence:
    """Completion fence of one submitted program, and what the device reports of the program.

    ``wall()`` is the program's ``device_wall`` and ``phases()`` its phases
    (paths below device_wall, nested ones included), as (start offset from the
    launch, duration) on the device clock; ``evidence()`` is what the OS saw
    of the CPU executor thread while the program ran ({} on CUDA).
    """

    def __init__(self, launch_ns: int, clock: PhaseClock):
        self.launch_ns = launch_ns
        self.clock = clock
        self.start_ns = 0
        self.end_ns = 0
        self.start_sample: strace.Sample | None = None
        self.end_sample: strace.Sample | None = None
        self.error: BaseException | None = None
        self.signal_at_ns = 0  # a late completion fence (fault injection): signalled then, not at end_ns
        self.late_ns = 0  # how long the host waited for that late signal after the program had ended
        self.measure_rq = False  # take the executor's run-queue wait over the program (cpu_contention ground truth)
        self.rq_ns = -1
        self.threads_rq_ns = -1  # the most any thread of the rank but the host thread waited (executor, I/O threads)
        self._done = threading.Event()

    def wait(self, timeout: float | None = None) -> None:
        if not self._done.wait(timeout):
            raise TimeoutError("device fence not signalled in time")
        if self.error is not None:
            raise RuntimeError(f"device program failed: {self.error!r}") from self.error
        if self.signal_at_ns:
            now = time.monotonic_ns()
            if self.signal_at_ns > now:
                time.sleep((self.signal_at_ns - now) / 1e9)
                self.late_ns = time.monotonic_ns() - now
            self.signal_at_ns = 0

    def done(self) -> bool:
        return self._done.is_set() and time.monotonic_ns() >= self.signal_at_ns

    def wall(self) -> tuple[int, int]:
        return self.start_ns - self.launch_ns, self.end_ns - self.start_ns

    def phases(self) -> list[Phase]:
        """Nested phases in start order, a parent before the children that start with it."""
        return sorted(self.clock.resolve(), key=lambda phase: (phase[1], phase[0].count(".")))

    def evidence(self) -> dict[str, int]:
        return strace.evidence(self.start_sample, self.end_sample)


class CpuDevice:
    """A rank's CPU "device": an in-order executor thread with completion fences."""

    kind = "cpu"

    def __init__(self, index: int, copy_latency_ms: float = 0.0, on_start: Callable[[], None] | None = None):
        self.index = index
        self.name = f"cpu:{index}"
        self.torch_device = torch.device("cpu")
        self.copy_latency_s = copy_latency_ms / 1000.0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._on_start = on_start
        self._host_tid = threading.get_native_id()  # the thread that made the device: the rank's host thread
        self._threads = ThreadRunQueues(but=self._host_tid)  # the device's threads: the executor, the collective's workers
        self._thread = threading.Thread(target=self._loop, name=f"device-{self.name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        if self._on_start is not None:
            self._on_start()
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, fence, signal_delay_s, label = item
            evidence = strace.TRACER.sampling
            if evidence or fence.measure_rq:
                self._threads.refresh()  # threads started since (the executor waited on its queue anyway)
            rq_start = thread_run_queue_ns() if fence.measure_rq else -1
            threads_start = self._threads.read() if fence.measure_rq else {}
            fence.start_sample = strace.host_sample()
            fence.start_ns = time.monotonic_ns()
            try:
                # device programs never need autograd
                with torch.inference_mode(), running(fence.clock, self._threads if evidence else None), torch_profile.label(label):
                    fn(fence.clock)
            except BaseException as error:  # the host sees it when it waits on the fence
                fence.error = error
            # The program is complete when the executor signals its fence: a CPU taken from the executor after
            # the last phase delays the signal, and device_wall (its end and its evidence) covers that too.
            if rq_start >= 0:
                fence.rq_ns = thread_run_queue_ns() - rq_start
                fence.threads_rq_ns = self._threads.most_since(threads_start)
            fence.end_sample = strace.host_sample()
            fence.end_ns = time.monotonic_ns()
            if signal_delay_s > 0:  # a late completion fence (fault injection); the stream goes on meanwhile
                fence.signal_at_ns = fence.end_ns + int(signal_delay_s * 1e9)
            fence._done.set()

    def submit(
        self,
        fn: Callable[[PhaseClock], None],
        signal_delay_s: float = 0.0,
        measure_rq: bool = False,
        label: str | None = None,
        origin_ns: int | None = None,
    ) -> Fence:
        """Queue ``fn(phase_clock)`` behind earlier work; returns its completion fence.

        ``signal_delay_s`` signals the fence that much after the program ends (the
        stream runs on); ``measure_rq`` takes the executor's run-queue wait over the program;
        ``label``: the program's ``record_function`` label (its phases are labelled too);
        ``origin_ns``: the device clock's origin (CLOCK_MONOTONIC), where the caller has already marked the launch
        (runner_run's start), else now. The readers place the device timeline from runner_run's start, and the host
        thread can lose the GIL to the executor for milliseconds between its mark and this call: an origin taken
        here would put every device phase that much early on the host axis.
        """
        launch = time.monotonic_ns() if origin_ns is None else origin_ns
        fence = Fence(launch, PhaseClock(launch, labelled=label is not None))
        fence.measure_rq = measure_rq
        self._queue.put((fn, fence, signal_delay_s, label))
        return fence

    def copy_to_device(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Synchronous host-to-device copy: ordered on the stream, waits for completion.

        The CPU device models the transfer's latency (``copy_latency_ms``): it is
        what a real synchronous H2D copy plus stream sync costs the caller.
        """

        def copy(_clock: PhaseClock) -> None:
            dst.copy_(src.reshape(dst.shape))
            if self.copy_latency_s > 0:
                time.sleep(self.copy_latency_s)

        self.submit(copy).wait()

    def copy_from_device(self, src: torch.Tensor) -> torch.Tensor:
        return src.clone()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._threads.close()


class _CudaPhaseClock(PhaseClock):
    """Phases as pairs of CUDA events, resolved to offsets from the launch's origin event once done."""

    def __init__(self, origin_event, labelled: bool = False):
        super().__init__(0, labelled)
        self.origin_event = origin_event
        self.events: list[tuple[str, Any, Any, dict[str, Any]]] = []  # (path, start event, end event, attributes)

    def _start(self) -> object:
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        return start

    def _finish(self, path: str, token, attrs: dict[str, Any]) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.events.append((path, token, end, attrs))

    def resolve(self) -> list[Phase]:
        return [
            (path, int(self.origin_event.elapsed_time(start) * 1e6), int(start.elapsed_time(end) * 1e6), attrs)
            for path, start, end, attrs in self.events
        ]


class _CudaFence(Fence):
    def __init__(self, launch_ns: int, clock: _CudaPhaseClock, start_event, end_event, signal_delay_s: float):
        super().__init__(launch_ns, clock)
        self.origin_event = clock.origin_event
        self.start_event, self.end_event, self.signal_delay_s = start_event, end_event, signal_delay_s

    def wait(self, timeout: float | None = None) -> None:
        self.end_event.synchronize()
        if self.signal_delay_s > 0 and not self._done.is_set():
            slept = time.monotonic_ns()
            time.sleep(self.signal_delay_s)
            self.late_ns = time.monotonic_ns() - slept
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set() or self.end_event.query()

    def wall(self) -> tuple[int, int]:
        origin = self.origin_event
        return (int(origin.elapsed_time(self.start_event) * 1e6), int(self.start_event.elapsed_time(self.end_event) * 1e6))


class CudaDevice:
    """A rank's CUDA device: one stream; programs are launched asynchronously on it."""

    kind = "cuda"

    def __init__(self, index: int):
        self.index = index
        self.name = f"cuda:{index}"
        self.torch_device = torch.device(self.name)
        torch.cuda.set_device(self.torch_device)
        self.stream = torch.cuda.Stream(self.torch_device)

    def submit(
        self,
        fn: Callable[[PhaseClock], None],
        signal_delay_s: float = 0.0,
        measure_rq: bool = False,
        label: str | None = None,
        origin_ns: int | None = None,
    ) -> Fence:
        """``measure_rq`` is moot: a CUDA stream is no thread that waits for a CPU; ``label`` is on the enqueueing host
        thread; ``origin_ns`` too (the device clock's origin is an event on the stream)."""
        launch = time.monotonic_ns()
        with torch.cuda.stream(self.stream), torch.inference_mode():
            origin = torch.cuda.Event(enable_timing=True)
            origin.record()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            clock = _CudaPhaseClock(origin, labelled=label is not None)
            start.record()
            with running(clock), torch_profile.label(label):
                fn(clock)
            end.record()
        return _CudaFence(launch, clock, start, end, signal_delay_s)

    def copy_to_device(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        with torch.cuda.stream(self.stream):
            dst.copy_(src.reshape(dst.shape), non_blocking=False)
        self.stream.synchronize()

    def copy_from_device(self, src: torch.Tensor) -> torch.Tensor:
        self.stream.synchronize()
        return src.to("cpu")

    def close(self) -> None:
        self.stream.synchronize()


def make_device(index: int, copy_latency_ms: float, on_start: Callable[[], None] | None = None):
    """The rank's device: CUDA device ``index`` when CUDA is available, else the CPU executor.

    ``copy_latency_ms`` and ``on_start`` only concern the CPU executor: a CUDA
    copy has its own latency, and there is no executor thread to start.
    """
    if torch.cuda.is_available():
        return CudaDevice(index % torch.cuda.device_count())
    return CpuDevice(index, copy_latency_ms, on_start)
