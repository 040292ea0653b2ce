"""The compiled STRACE scanner reads exactly what the pure-Python reader reads.

The Python reader is the oracle: on generated logs -- valid records at the
limits of the grammar, percent-escapes of every kind, the corruptions real
logs show, random byte damage -- the compiled path must give the same rows in
the same order, the same line numbers, drops, anchors and counts, however the
log is cut into pieces and the pieces shared out to threads. A build with
AddressSanitizer and UndefinedBehaviorSanitizer runs a corpus of such logs.
"""

from __future__ import annotations

import io
import os
import pickle
import random
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsprof.analysis.ingest import compiled as compiled_helpers
from dsprof.analysis.ingest import strace_log, strace_pieces
from dsprof.analysis.store.spans import PROMOTED_INT_ATTRS, PROMOTED_TEXT_ATTRS
from dsprof.profiler import strace_format as fmt
from dsprof.testing.strace_readers import outcome, select_reader

SOURCE = Path(strace_log.__file__).with_name("_strace_scan.c")
SETTINGS = settings(
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.large_base_example,
        HealthCheck.data_too_large,
    ],
)


@pytest.fixture()
def compiled(monkeypatch):
    select_reader("compiled", monkeypatch)


def both_readers(data: bytes, monkeypatch) -> tuple[tuple, tuple]:
    """(compiled, python) outcomes of one log."""
    monkeypatch.delenv(strace_log.PURE_PYTHON_ENV, raising=False)
    fast = outcome(data)
    monkeypatch.setenv(strace_log.PURE_PYTHON_ENV, "1")
    slow = outcome(data)
    monkeypatch.delenv(strace_log.PURE_PYTHON_ENV)
    return fast, slow


# -- logs at the edges of the grammar -------------------------------------------------------

DIGITS = st.text("0123456789", min_size=1, max_size=21)
NUMBER = st.one_of(
    st.integers(-(2**63) - 2, 2**64 + 2).map(str),
    DIGITS,
    DIGITS.map(lambda d: "-" + d),
    st.sampled_from(["-0", "0" * 19 + "7", "9" * 19, str(2**63), str(2**64 - 1), "-" + str(2**63), "", "-", "1x", "١٢"]),
)
ESCAPE = st.sampled_from(
    [
        "%20",
        "%3D",
        "%5B",
        "%5D",
        "%25",
        "%0A",
        "%00",
        "%C3%A9",
        "%C3",
        "%A9",
        "%E2%82",
        "%ED%A0%80",
        "%F4%90%80%80",
        "%zz",
        "%4",
        "%",
        "%%41",
        "%c3%a9",
        "é",
        "€",
        "\U0001f600",
        "~",
    ]
)
TOKEN = st.lists(st.one_of(st.text("abcXYZ.:_+-/09~", min_size=1, max_size=4), ESCAPE), max_size=4).map("".join)
KEYS = st.one_of(TOKEN, st.sampled_from([*PROMOTED_INT_ATTRS, *PROMOTED_TEXT_ATTRS, fmt.CLK_ATTR, "cl%6B", "ra%6Ek", "dev%69ce"]))
VALUES = st.one_of(TOKEN, NUMBER, st.sampled_from([fmt.CLK_DEVICE, fmt.CLK_HOST, "de%76", "007", "-12", "1" * 18, "1" * 19, "%35"]))
SEPARATOR = st.sampled_from([" ", " ", " ", "  ", "\t", " \t"])


@st.composite
def records(draw) -> str:
    """One record's text from its marker on: usually well formed, sometimes not."""
    fields = {
        "v": draw(st.sampled_from([str(fmt.STRACE_VERSION)] * 8 + ["2", "01", "", "x"])),
        "pid": draw(NUMBER),
        "tid": draw(NUMBER),
        "inv": draw(NUMBER),
        "hid": draw(st.one_of(TOKEN, st.just("9f3c2a71d04be815"))),
        "depth": draw(NUMBER),
        "name": draw(TOKEN),
        "ts": draw(NUMBER),
        "dur": draw(NUMBER),
    }
    if draw(st.booleans()):  # mostly numbers that parse
        for key in ("pid", "tid", "inv", "depth", "ts", "dur"):
            fields[key] = str(draw(st.integers(0, 2**40)))
    text = fmt.STRACE_MARKER + "".join(f"{draw(SEPARATOR) if draw(st.integers(0, 20)) == 0 else ' '}{k}={v}" for k, v in fields.items())
    for key, value in draw(st.lists(st.tuples(KEYS, VALUES), max_size=6)):
        text += f" {key}={value}"
    return text + draw(st.sampled_from(["", "", "", " ", "  ", " trailing words", " k=v=w", "]", "=", " =x", "[", "\r"]))


PREFIX = st.one_of(
    st.just(""),
    st.builds(fmt.format_prefix, st.integers(0, 2**40), st.integers(0, 2**40), st.just("INFO"), st.just("strace_span")),
    st.just("text before "),
)
SIDE = st.sampled_from(
    [
        fmt.format_anchor_record(7, 5, 1_764_470_000_123_456_789, 1),
        fmt.format_anchor_record(8, 5, 9, 1) + " trailing",
        "[CLOCK_ANCHOR] v=1 pid=3 mono_ns=",
        fmt.format_chip_ready_payload(7, "npu:0"),
        "[chip_process pid=x dev=y] ready",
    ]
)
NOISE = st.sampled_from(
    [
        "",
        "junk: plain text",
        "[not a marker] words",
        "Traceback (most recent call last):",
        "  File x, line 3",
        "run_id=7 step=3",
        "_id=7",
        "ACE] v=1 pid=1 tid=2 inv=3 hid=a depth=0 name=n ts=1 dur=2",
        "STRACE] v=1",
        "\r",
        "\x00\x01 binary",
        "\ufffd replaced",
        "caf\xe9",
        "[STR",
        "tail [S",
        "[STRACE",
    ]
)


@st.composite
def lines(draw) -> str:
    kind = draw(st.integers(0, 9))
    if kind <= 5:
        line = draw(PREFIX) + draw(records())
        while draw(st.integers(0, 3)) == 0:  # more records on the line
            line += draw(PREFIX) + draw(records())
        cut = draw(st.integers(0, 12))
        return line if cut else line[: draw(st.integers(0, len(line)))]  # now and then a torn one
    if kind == 6:
        return draw(SIDE)
    return draw(NOISE)


@st.composite
def logs(draw) -> bytes:
    text = "\n".join(draw(st.lists(lines(), min_size=1, max_size=25))) + draw(st.sampled_from(["\n", "", "\r\n"]))
    data = bytearray(text.encode("utf-8", errors="surrogateescape"))
    for where, insert in draw(st.lists(st.tuples(st.floats(0, 1), st.binary(max_size=3)), max_size=2)):
        at = int(where * len(data))
        data[at : at + len(insert) // 2] = insert
    if draw(st.booleans()):
        data = data.replace(b"\xc3\xa9", b"\xe9")  # latin-1 bytes: invalid UTF-8
    return bytes(data)


@pytest.mark.slow
@SETTINGS
@given(
    data=logs(),
    chunk_bytes=st.sampled_from([64 << 20, 1, 37, 200, 1000]),
    threads=st.integers(1, 4),
    part_bytes=st.sampled_from([1, 50, 400, 1 << 20]),
)
def test_compiled_scanner_reads_what_the_python_reader_reads(compiled, monkeypatch, data, chunk_bytes, threads, part_bytes):
    monkeypatch.setattr(strace_pieces, "PIECE_BYTES", chunk_bytes)
    monkeypatch.setattr(compiled_helpers, "SCAN_THREADS", threads)
    monkeypatch.setattr(compiled_helpers, "SCAN_MIN_PART_BYTES", part_bytes)
    fast, slow = both_readers(data, monkeypatch)
    assert fast == slow


@SETTINGS
@given(
    data=st.lists(st.sampled_from([b"[", b"\n", b"a", b"\n[", b"xxxxx"]), max_size=300).map(b"".join),
    chunk_bytes=st.integers(1, 40),
    max_line=st.integers(1, 30),
)
def test_the_mapped_log_is_cut_into_the_pieces_the_stream_is_cut_into(monkeypatch, data, chunk_bytes, max_line):
    """Files are read memory-mapped (no copy); the pieces, overlong lines skipped included, are those of the streaming reader."""
    monkeypatch.setattr(strace_pieces, "PIECE_BYTES", chunk_bytes)
    monkeypatch.setattr(strace_pieces, "MAX_LINE_BYTES", max_line)
    streamed = [p if isinstance(p, strace_pieces.SkippedLines) else bytes(p) for p in strace_pieces.log_pieces(io.BytesIO(data))]
    assert [p if isinstance(p, strace_pieces.SkippedLines) else bytes(p) for p in strace_pieces.mapped_pieces(data)] == streamed


def test_a_log_mapped_a_window_at_a_time_is_cut_as_the_stream_is_and_holds_one_window(monkeypatch, tmp_path):
    """A log longer than a window is mapped a window at a time: the same pieces, and never more than a window mapped.

    Mapped whole, a 4 GB log took 4 GB of address space on its own (issue 28: the
    analysis under a 4 GB ``ulimit -v``).
    """
    rng = random.Random(5)
    lines = [b"[" * rng.randint(0, 1) + b"x" * rng.choice([0, 3, 50, 700, 9000, 0, 3, 50, 700, 20000]) + b"\n" for _ in range(3000)]
    data = b"".join(lines)
    log = tmp_path / "long.log"
    log.write_bytes(data)
    monkeypatch.setattr(strace_pieces, "PIECE_BYTES", 6000)
    monkeypatch.setattr(strace_pieces, "MAX_LINE_BYTES", 5000)
    monkeypatch.setattr(strace_pieces, "MAP_BYTES", 3 * 4096)
    windows: list[tuple[int, int]] = []
    window = strace_pieces.MappedLog.window

    def recording(self, start, end):
        mapped, base = window(self, start, end)
        if not windows or windows[-1] != (base, len(mapped)):  # a window mapped
            windows.append((base, len(mapped)))
        return mapped, base

    monkeypatch.setattr(strace_pieces.MappedLog, "window", recording)
    streamed = [p if isinstance(p, strace_pieces.SkippedLines) else bytes(p) for p in strace_pieces.log_pieces(io.BytesIO(data))]
    with open(log, "rb") as handle:
        mapped = strace_pieces.map_file(handle)
        assert mapped is not None
        pieces = [p if isinstance(p, strace_pieces.SkippedLines) else bytes(p) for p in strace_pieces.mapped_pieces(mapped)]
        mapped.close()
    assert pieces == streamed
    assert strace_pieces.SkippedLines(1) in pieces
    bases = sorted({base for base, _ in windows})
    assert len(bases) > 20 and bases[-1] > len(data) - 20000  # remapped all along the log
    assert windows[0] == (0, strace_pieces.HEAD_BYTES)  # the head, looked at before parsing
    assert max(length for _, length in windows[1:]) <= 6000 + 5000 + 4096  # a piece's worth, never the whole log


def test_reading_again_reuses_memory_and_reads_the_same(compiled, tmp_path):
    """Column memory goes back to a pool when Arrow lets go of it; the next reads take it, whatever it held."""
    logs = []
    for seed in (1, 2):
        logs.append(tmp_path / f"{seed}.log")
        logs[-1].write_bytes(_drawn(seed) * 40)
    first = [strace_log.read_strace_log(path).spans for path in logs]
    assert first[0].num_rows and first[1].num_rows
    again = [strace_log.read_strace_log(path).spans for path in reversed(logs)]
    assert again[1].equals(first[0]) and again[0].equals(first[1])


def test_a_large_log_shared_out_to_threads_reads_as_in_python(compiled, monkeypatch):
    """Many pieces, each cut into parts for several threads, with islands at every kind of place."""
    rng = random.Random(5)
    lines = []
    for i in range(6000):
        attrs = {"rank": i % 8, "os.cpu_ns": rng.randrange(10**6), "note": rng.choice(["a b", "x", "[y]", "é%"])}
        record = fmt.format_prefix(i, 1, "INFO", "strace_span") + fmt.format_strace_payload(
            pid=100 + i % 8,
            tid=1,
            inv=2**63 + i,
            hid="ab",
            depth=i % 3,
            name=rng.choice(["chip.run", "n m"]),
            ts_ns=i * 1000,
            dur_ns=7,
            attrs=attrs,
        )
        roll = rng.random()
        if roll < 0.02:
            record = record[: rng.randrange(len(record))]  # torn
        elif roll < 0.04:
            record += "\nwrapped tail"  # a line that does not start with '['
        elif roll < 0.06:
            record += fmt.format_prefix(i, 1, "INFO", "strace_span") + fmt.format_strace_payload(
                pid=1, tid=1, inv=i, hid="cd", depth=0, name="second", ts_ns=i, dur_ns=1
            )
        lines.append(record)
    data = ("\n".join(lines) + "\n").encode()
    monkeypatch.setattr(strace_pieces, "PIECE_BYTES", 150_000)
    monkeypatch.setattr(compiled_helpers, "SCAN_THREADS", 3)
    monkeypatch.setattr(compiled_helpers, "SCAN_MIN_PART_BYTES", 10_000)
    fast, slow = both_readers(data, monkeypatch)
    assert fast == slow
    assert len(fast[1]) > 5000 and fast[4]  # rows were read, and some records dropped


NOT_BUILT_RUN = textwrap.dedent(
    """
    import sys
    sys.modules["dsprof.analysis.ingest._strace_scan"] = None  # as if it was never built
    from dsprof.analysis.ingest import compiled, strace_log
    from dsprof.testing.strace_readers import outcome
    assert compiled.compiled_module() is None and strace_log.compiled_scanner() is None
    print(outcome(sys.stdin.buffer.read())[1][0]["name"])
    """
)


def test_the_reader_falls_back_to_python_without_the_compiled_module(monkeypatch):
    data = (fmt.format_strace_payload(pid=1, tid=2, inv=3, hid="a", depth=0, name="n", ts_ns=1, dur_ns=2) + "\n").encode()
    env = {k: v for k, v in os.environ.items() if k != strace_log.PURE_PYTHON_ENV}
    run = subprocess.run([sys.executable, "-c", NOT_BUILT_RUN], input=data, capture_output=True, env=env, check=True)
    assert run.stdout.decode().strip() == "n"
    monkeypatch.setenv(strace_log.PURE_PYTHON_ENV, "1")
    assert strace_log.compiled_scanner() is None


def test_the_scanner_takes_its_vocabulary_from_the_format(compiled):
    """Names live in strace_format and spans; a Scanner told other names reads other records."""
    from dsprof.analysis.ingest import _strace_scan

    scanner = _strace_scan.Scanner(
        marker=b"[SPAN]",
        side_markers=(),
        version=b"3",
        fields=(b"ver", b"p", b"name", b"t", b"d"),
        kinds=(b"version", b"i64", b"token0", b"i64", b"i64"),
        ts_field=3,
        dur_field=4,
        clk=(b"c", b"D", b"H"),
        int_keys=(b"r",),
        text_keys=(b"s",),
    )
    result = scanner.scan(b"x [SPAN] ver=3 p=-4 name=a%20b t=5 d=6 r=7 s=x c=D q=1\n[SPAN] ver=2 p=1\n", 10, 1)
    (part,) = result["parts"]
    assert (part["rows"], result["n_lines"], bytes(result["islands"])) == (1, 2, b"[SPAN] ver=2 p=1\n")
    assert memoryview(result["island_lines"]).cast("q").tolist() == [12]
    assert memoryview(part["line"]).cast("q").tolist() == [11]
    _offsets, text = part["fields"][1]
    assert bytes(text) == b"a b" and bytes(part["clk"][1]) == b"D"
    with pytest.raises(ValueError):
        _strace_scan.Scanner(
            marker=b"",
            side_markers=(),
            version=b"1",
            fields=(b"v",),
            kinds=(b"version",),
            ts_field=0,
            dur_field=0,
            clk=(b"c", b"d", b"h"),
            int_keys=(),
            text_keys=(),
        )


# -- sanitizers ------------------------------------------------------------------------------

SANITIZED_RUN = textwrap.dedent(
    """
    import importlib.util, pickle, sys
    from dsprof.analysis.ingest import compiled, strace_log, strace_pieces
    from dsprof.testing.strace_readers import outcome
    spec = importlib.util.spec_from_file_location("_strace_scan", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    scanner = compiled.scanner_of(module)
    corpus, expected = pickle.load(open(sys.argv[2], "rb"))
    for data in corpus:  # exact-size copies, cut anywhere: a read past the end is caught
        for cut in (len(data), len(data.rstrip(b"\\n")), len(data) // 2, len(data) // 3):
            for threads, part in ((1, 1 << 20), (3, 1), (4, 64)):
                scanner.scan(bytes(data[:cut]), 0, threads, part)
    strace_log.compiled_scanner = lambda: scanner
    compiled.SCAN_MIN_PART_BYTES = 64
    for data, want in zip(corpus, expected):
        for chunk in (64 << 20, 4096):
            strace_pieces.PIECE_BYTES = chunk
            assert outcome(data) == want
    print("sanitized scans:", len(corpus))
    """
)


def _sanitizer_runtime() -> str | None:
    """The AddressSanitizer runtime to preload, if gcc has one here."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return None
    found = subprocess.run([gcc, "-print-file-name=libasan.so"], capture_output=True, text=True, check=False).stdout.strip()
    return found if os.path.isabs(found) and os.path.exists(found) else None


def _corpus() -> list[bytes]:
    """Logs that reach every path of the scanner (seeded), and a larger one shared out to threads."""
    return [_drawn(seed) for seed in range(16)] + [b"".join(_drawn(seed) for seed in range(100, 108))]


def _drawn(seed: int) -> bytes:
    """A messy log: records with odd values and escapes, torn records, continuations, cut markers, binary bytes."""
    rng = random.Random(seed)
    pieces = []
    for _ in range(rng.randrange(5, 200)):
        record = fmt.format_prefix(seed, 1, "INFO", "f") + fmt.format_strace_payload(
            pid=rng.randrange(-5, 2**40),
            tid=1,
            inv=rng.randrange(2**64),
            hid="9f",
            depth=rng.randrange(3),
            name=rng.choice(["a", "b c", "é"]),
            ts_ns=rng.randrange(-3, 2**62),
            dur_ns=rng.randrange(-3, 2**40),
            attrs={"rank": rng.choice(["1", "x", "%35"]), "clk": rng.choice(["dev", "host"]), "k%": rng.choice(["%C3%A9", "%C3", "v"])},
        )
        pieces.append(record[: rng.randrange(len(record) + 1)] if rng.random() < 0.1 else record)
        pieces.append(rng.choice(["\n", "\n", "\n", "", "\r\n", "\ncontinued k=v\n", "\n[STR", "\n\x00\n", "\n\xff\xfe\n"]))
    text = "".join(pieces)
    return text.encode("utf-8", errors="surrogateescape") if "\xff" not in text else text.encode("latin-1", errors="replace")


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the sanitizer build is set up for Linux/gcc")
@pytest.mark.parametrize("blocks", [[], ["-U__SSE2__"]], ids=["sse2", "portable"])
def test_scanner_under_address_and_undefined_behaviour_sanitizers(compiled, monkeypatch, tmp_path, blocks):
    """Both ways of reading 16-byte blocks: SSE2, and the portable loop other machines build."""
    runtime = _sanitizer_runtime()
    if runtime is None:
        pytest.skip("gcc with the AddressSanitizer runtime (libasan) is not available here")
    library = tmp_path / ("_strace_scan" + sysconfig.get_config_var("EXT_SUFFIX"))
    build = subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-g",
            "-O1",
            "-pthread",
            "-std=gnu11",
            "-fno-omit-frame-pointer",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            *blocks,
            f"-I{sysconfig.get_paths()['include']}",
            str(SOURCE),
            "-o",
            str(library),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if build.returncode != 0:
        pytest.skip(f"the sanitizer build failed here: {build.stderr.strip()[-300:]}")
    corpus = _corpus()
    select_reader("python", monkeypatch)
    (tmp_path / "corpus.pickle").write_bytes(pickle.dumps((corpus, [outcome(data) for data in corpus])))  # what the scans must give
    env = os.environ | {
        "LD_PRELOAD": runtime,
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }
    env.pop(strace_log.PURE_PYTHON_ENV, None)
    run = subprocess.run(
        [sys.executable, "-c", SANITIZED_RUN, str(library), str(tmp_path / "corpus.pickle")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert f"sanitized scans: {len(corpus)}" in run.stdout
