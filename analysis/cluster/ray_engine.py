"""The same analysis on a Ray cluster, for fleets whose logs outgrow one machine.

Only the span-sized work is distributed (ingest, one task per log; the
invocation pass, one task per time window); everything per step runs once, on
the driver, with the same SQL as the embedded engine, so both give the same
summary.json. Workers must see the inputs and the dataset at the same paths.
Ray is an optional dependency (``pip install dsprof[cluster]``). Details:
docs/CLUSTER.md, "What runs where".
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa

from dsprof.analysis.cluster.guard import guarded_local_cluster
from dsprof.analysis.ingest import is_text_log, read_paths
from dsprof.analysis.stages.invocations import invocation_query
from dsprof.analysis.store.dataset import DEFAULT_WINDOW_NS, SpanDatasetWriter
from dsprof.analysis.store.engine import open_engine
from dsprof.analysis.store.predicates import in_window
from dsprof.analysis.store.spans import Trace, merge_traces
from dsprof.errors import DsprofError
from dsprof.progress import Progress

# How long the driver waits for a cluster's address to accept a connection before giving up.
CONNECT_TIMEOUT_S = 15.0
ANSWER_TIMEOUT_S = 5.0  # ... and then for its first HTTP/2 frame (a gRPC server sends it at once)
# What Ray reads itself (a running local cluster's address file), rather than an address to probe.
RAY_KEYWORDS = ("auto", "local")
# host:port (a hostname, IPv4 or [IPv6]), optionally ray:// (Ray Client; port 10001 when left out).
_ADDRESS = re.compile(r"(ray://)?(\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}))(?::([0-9]{1,5}))?", re.ASCII)
RAY_CLIENT_PORT = 10001
RAY_TEMP_PREFIX = "dsprof-ray-"  # a local cluster's session directory, removed when it stops
_WAIT_S = 0.2  # longest a signal waits while Ray tasks run
_AF_UNIX_PATH_MAX = 107
# An HTTP/2 client's connection preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, Ray Client's server)
# answers with a SETTINGS frame of its own (RFC 9113 §3.4), anything else (an HTTP/1 server, a database) does not.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_HTTP2_FRAME_HEADER = 9
_HTTP2_SETTINGS = 4
# What Ray appends to its temporary directory for its longest socket: "XXXXXXXX/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store".
_RAY_SOCKET_TAIL = 8 + 64


def check_address(address: str | None) -> tuple[str, int] | None:
    """(host, port) of a cluster address, None where Ray finds the cluster itself; DsprofError on anything else."""
    if address is None or address in RAY_KEYWORDS:
        return None
    match = _ADDRESS.fullmatch(address)
    port = int(match.group(3)) if match and match.group(3) else RAY_CLIENT_PORT if match and match.group(1) else 0
    if match is None or not 0 < port < 65536:
        raise DsprofError(f"bad Ray address {address[:200]!r} (expected host:port, ray://host[:port], auto or local)")
    return match.group(2).strip("[]"), port


def probe_address(address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail within ``timeout_s`` when nothing listens at ``address``, or what listens does not speak gRPC.

    Ray itself would retry for minutes, printing its C++ client's warnings, where nothing or something else listens.
    """
    where = check_address(address)
    if where is None or address is None:
        return
    shown = repr(address[:200])
    if address.startswith("ray://") and importlib.util.find_spec("grpc") is None:
        raise DsprofError(f"the Ray Client address {shown} needs pip install 'ray[client]' (or give the head's host:port)")
    try:
        connection = socket.create_connection(where, timeout=timeout_s)
    except OSError as exc:
        raise DsprofError(f"cannot reach the Ray cluster at {shown}: {exc.strerror or exc or 'timed out'}") from None
    with connection:
        try:
            connection.settimeout(ANSWER_TIMEOUT_S)
            connection.sendall(_HTTP2_PREFACE)
            answer = _read_up_to(connection, _HTTP2_FRAME_HEADER)
        except OSError:  # it hung up on the preface, or said nothing in time
            answer = b""
    if len(answer) < _HTTP2_FRAME_HEADER or answer[3] != _HTTP2_SETTINGS:
        raise DsprofError(
            f"no Ray cluster at {shown}: it does not answer as Ray's gRPC server (is it the head's GCS port, 6379 by default?)"
        )


def _read_up_to(connection: socket.socket, size: int) -> bytes:
    """Up to ``size`` bytes, fewer where the peer closes first."""
    data = b""
    while len(data) < size and (chunk := connection.recv(size - len(data))):
        data += chunk
    return data


def _ray():
    """The ``ray`` module, or a clear error: the cluster engine is an optional extra."""
    try:
        import ray  # an optional dependency: imported only when the cluster engine is asked for
    except ImportError:
        raise DsprofError("the ray engine needs Ray: pip install 'dsprof[cluster]'") from None
    return ray


def _ingest_log(path: str, dataset: str, prefix: str, window_ns: int) -> tuple[Trace, dict[int, list[str]], int]:
    """Ray task: one text log into the shared dataset; its Trace (spans on disk), its files by window, and the window length.

    The writer makes windows longer (doubling them) where the log's times are sparse, so logs may come back with different lengths.
    """
    writer = SpanDatasetWriter(dataset, window_ns, part_prefix=prefix)
    trace = read_paths([path], sink=writer)
    writer.close()
    by_window: dict[int, list[str]] = {}
    for written in writer.files:
        by_window.setdefault(written["window"], []).append(str(Path(dataset) / written["path"]))
    trace.span_files = [Path(f) for files in by_window.values() for f in files]
    return trace, by_window, writer.window_ns


def _common_windows(parts: list[tuple[Trace, dict[int, list[str]], int]], window_ns: int) -> tuple[dict[int, list[str]], int]:
    """The files of every log by window of the longest window length: windows of length w * 2**k are exactly window >> k."""
    window_ns = max((length for _, _, length in parts), default=window_ns)
    by_window: dict[int, list[str]] = {}
    for _, files_by_window, length in parts:
        shift = (window_ns // length).bit_length() - 1
        for window, files in files_by_window.items():
            by_window.setdefault(window >> shift, []).extend(files)
    return by_window, window_ns


def _window_invocations(files: list[str], window: int, window_ns: int, memory_limit: int | None) -> pa.Table:
    """Ray task: the invocations that start in ``window``, from the files of the window and its neighbours."""
    engine = open_engine(Trace(span_files=[Path(f) for f in files]), memory_limit=memory_limit)
    try:
        return engine.arrow(invocation_query(having=in_window(window, window_ns)))
    finally:
        engine.close()


def read_and_aggregate(
    paths: Sequence[str | os.PathLike],
    dataset: str | os.PathLike,
    *,
    address: str | None = None,
    window_ns: int = DEFAULT_WINDOW_NS,
    memory_limit: int | None = None,
    progress: Progress = None,
) -> tuple[Trace, pa.Table]:
    """Read ``paths`` and aggregate their invocations on a Ray cluster (``address``; None: a local one)."""
    probe_address(address)
    ray = _ray()
    with contextlib.ExitStack() as session:
        if not ray.is_initialized():
            _start_ray(ray, address, session)
        return _read_and_aggregate(ray, paths, dataset, window_ns, memory_limit, progress)


def _start_ray(ray, address: str | None, session: contextlib.ExitStack) -> None:
    """Connect to the cluster at ``address``, or start a local one that dies with this process; ``session`` ends it.

    A local cluster gets a private session directory (removed afterwards,
    nothing left in ``TMPDIR``) and a guard (:mod:`dsprof.analysis.cluster.guard`)
    that kills its processes even when this one is SIGKILLed. Ray's native
    signal handler (a stack dump on SIGTERM) is replaced by the one it replaced.
    """
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    options: dict = {"address": address}
    if address is None:
        private = Path(tempfile.mkdtemp(prefix=RAY_TEMP_PREFIX, dir=_ray_temp_base()))
        session.callback(shutil.rmtree, private, ignore_errors=True)
        session.enter_context(guarded_local_cluster([private]))
        options = {"address": "local", "_temp_dir": str(private)}  # never a cluster RAY_ADDRESS points at: one of our own
    session.callback(ray.shutdown)
    try:
        ray.init(**options, logging_level="ERROR", log_to_driver=False, include_dashboard=False)
    finally:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in handlers.items():
                if handler is not None:
                    signal.signal(signum, handler)


def _ray_temp_base() -> str:
    """TMPDIR, unless Ray's socket paths under it would not fit AF_UNIX's 107 bytes (then /tmp, as Ray's own default)."""
    base = tempfile.gettempdir()
    return base if len(base) + len(RAY_TEMP_PREFIX) + _RAY_SOCKET_TAIL <= _AF_UNIX_PATH_MAX else "/tmp"


def _read_and_aggregate(
    ray, paths: Sequence[str | os.PathLike], dataset: str | os.PathLike, window_ns: int, memory_limit: int | None, progress: Progress
) -> tuple[Trace, pa.Table]:
    """Ingest as one task per log, then aggregate as one task per time window, on the connected cluster."""
    logs, others = _split_inputs(paths)
    if progress:
        progress(f"cluster: ingesting {len(logs)} log(s) on {int(ray.cluster_resources().get('CPU', 0))} CPUs")
    ingest = ray.remote(_ingest_log)
    parts = _gather(ray, [ingest.remote(str(log), str(dataset), f"log{i}", window_ns) for i, log in enumerate(logs)])
    local = read_paths(others, progress=progress, logs=False) if others else Trace()
    trace = merge_traces([*(t for t, _, _ in parts), local])
    by_window, window_ns = _common_windows(parts, window_ns)
    if progress:
        progress(f"cluster: aggregating invocations in {len(by_window)} time window(s)")
    aggregate = ray.remote(_window_invocations)
    tasks = [
        aggregate.remote(sorted(f for w in (k - 1, k, k + 1) for f in by_window.get(w, [])), k, window_ns, memory_limit)
        for k in sorted(by_window)
    ]
    tables = [t for t in _gather(ray, tasks) if t.num_rows]
    return trace, (pa.concat_tables(tables) if tables else None)


def _gather(ray, tasks: list) -> list:
    """The tasks' results; a task that failed on bad input raises that input's one-line error, not Ray's traceback.

    Ray's blocking calls turn whatever a signal handler raises into a bare
    KeyboardInterrupt (a SIGTERM would read as Ctrl-C), so signals wait while
    Ray waits and are handled between its short waits.
    """
    pending = list(tasks)
    with _signals_between_waits() as handle_signals:
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=_WAIT_S)
            handle_signals()
    try:
        return ray.get(tasks)
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, (DsprofError, OSError)):
            raise exc.cause from None
        raise


@contextlib.contextmanager
def _signals_between_waits() -> Iterator[Callable[[], None]]:
    """SIGTERM and SIGINT noted instead of handled; the function given hands a noted one to its own handler."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    noted: list[int] = []
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}

    def handle_noted() -> None:
        if noted:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            signal.raise_signal(noted[0])

    for signum, handler in handlers.items():
        if handler is not None:
            signal.signal(signum, lambda number, _frame: noted.append(number))
    try:
        yield handle_noted
    finally:
        for signum, handler in handlers.items():
            if handler is not None:
                signal.signal(signum, handler)


def _split_inputs(paths: Sequence[str | os.PathLike]) -> tuple[list[Path], list[Path]]:
    """(text logs, everything else): each log is one ingest task; the rest (read without logs) stays on the driver."""
    logs: list[Path] = []
    others: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            logs += sorted(p for p in path.glob("*.log") if p.is_file())
            others.append(path)
        elif is_text_log(path):
            logs.append(path)
        else:
            others.append(path)
    return logs, others
