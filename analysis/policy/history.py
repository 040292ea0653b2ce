"""The run history: one DuckDB file of runs and their headline figures, and its change points (docs/GATE_RULES.md).

A store holds ``meta`` (what it is and its schema version), ``runs`` (one row
per run in the order added: label, commit, when, where from, its report and
the hash of its summary) and ``figures`` (one row per run and headline
figure, :func:`headline_figures`). Adding a summary whose hash is stored
already changes nothing. Writers take an exclusive ``flock`` on
``STORE.lock`` around the whole transaction and readers a shared one, so
parallel CI jobs adding to one store lose nothing. A file that is not a
DuckDB database, a database that is not a dsprof history, or a store of
another schema version is an :class:`~dsprof.errors.InputError`: one line.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from dsprof.analysis.policy.change_points import ALPHA, RESOLUTION, change_points
from dsprof.analysis.policy.diff import HIGHER, LOWER, figure_direction, flatten_figures
from dsprof.analysis.summary import figure_unit, summary_with_path
from dsprof.errors import DsprofError, InputError
from dsprof.interrupts import interruptible
from dsprof.profiler import artifacts

STORE_FORMAT = "dsprof.history"
SCHEMA_VERSION = 1
DEFAULT_NEWEST = 5
COUNT_RESOLUTION = 1.0
_EXPECTED = "a dsprof history store (made by `dsprof history add`)"
NOISE_FLOOR = "noise.floor_ms"
DECODE_WALL = "what_if.decode_wall_ms"
# Headline figures besides every percentile of the figures block (flatten_figures names them).
_HEADLINE = (
    "serving.throughput_tok_s",
    "serving.effective_tpot_ms",
    "slow_steps.count",
    "tail_steps.count",
    "late_starts.count",
    "tail_steps.straggler.share",
    "tail_cost.share_of_decode_wall",
    "what_if.share_of_decode_wall",
    "what_if.by_rank.*",
    "pipeline.cadence_p50_ms",
    "pipeline.overlap_share",
    NOISE_FLOOR,
    DECODE_WALL,
)
_PERCENTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
# A percentile is kept when at least this many of its block's samples lie above it: over fewer it is
# one or two steps of a shared CI host, as wild as the max (a p99 over 78 steps once read 9x its level).
SAMPLES_ABOVE_A_PERCENTILE = 4
VERDICT_STATUS = "verdict.status"
_SCHEMA = (
    "CREATE TABLE meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)",
    "CREATE TABLE runs (run INTEGER PRIMARY KEY, label VARCHAR NOT NULL, commit VARCHAR, added_at VARCHAR NOT NULL,"
    " source VARCHAR NOT NULL, report VARCHAR, summary_hash VARCHAR NOT NULL UNIQUE)",
    "CREATE TABLE figures (run INTEGER NOT NULL, figure VARCHAR NOT NULL, value DOUBLE, text VARCHAR, PRIMARY KEY (run, figure))",
)


def _enough_samples_above(block: Any, quantile: float) -> bool:
    count = block.get("count") if isinstance(block, dict) else None
    return not isinstance(count, int) or count * (1.0 - quantile) >= SAMPLES_ABOVE_A_PERCENTILE


def headline_figures(summary: dict) -> dict[str, float | str]:
    """The figures a history keeps of one summary: numbers by dotted path, and ``verdict.status`` as text when present.

    Of the figures block, the percentiles (p50, p95, p99) that at least
    :data:`SAMPLES_ABOVE_A_PERCENTILE` of the block's ``count`` lie above (all
    three where a block has no count): a block's max, and a p99 of a few dozen
    steps, is one step, too wild on a shared CI host to have a level that changes.
    """
    kept: dict[str, float | str] = {}
    blocks = summary["figures"] if isinstance(summary.get("figures"), dict) else {}
    for name, value in flatten_figures(summary).items():
        block, _, key = name.rpartition(".")
        if block in blocks and key in _PERCENTILES:
            if _enough_samples_above(blocks[block], _PERCENTILES[key]):
                kept[name] = float(value)
        elif any(fnmatchcase(name, pattern) for pattern in _HEADLINE):
            kept[name] = float(value)
    verdict = summary.get("verdict")
    if isinstance(verdict, dict) and isinstance(verdict.get("status"), str):
        kept[VERDICT_STATUS] = verdict["status"]
    return kept


def summary_hash(summary: dict) -> str:
    """SHA-256 of the summary as canonical JSON: the same summary, however written, has one hash."""
    return hashlib.sha256(json.dumps(summary, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@contextlib.contextmanager
def _locked(store: Path, exclusive: bool) -> Iterator[None]:
    """Hold ``STORE.lock`` (kept, never removed: removing it would let two writers lock different files)."""
    try:
        fd = os.open(store.with_name(store.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise DsprofError(f"{store}: cannot lock the store: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


@dataclass
class History:
    """Every run of a store (in add order) and their figures, as arrays."""

    runs: list[dict[str, Any]]
    figures: dict[str, tuple[np.ndarray, np.ndarray]]  # figure -> (run indices, values), runs ascending
    texts: dict[str, dict[int, str]] = field(default_factory=dict)  # text figures: figure -> run -> value


class HistoryStore:
    """An open store; make one with :meth:`open_for_write` or :meth:`open_for_read`."""

    def __init__(self, path: Path, connection: duckdb.DuckDBPyConnection):
        self.path = path
        self.connection = connection

    @classmethod
    def open_for_write(cls, store: str | os.PathLike) -> contextlib.AbstractContextManager[HistoryStore]:
        """The store under its exclusive lock, made when it does not exist."""
        return cls._open(Path(store), write=True)

    @classmethod
    def open_for_read(cls, store: str | os.PathLike) -> contextlib.AbstractContextManager[HistoryStore]:
        """An existing store under a shared lock."""
        path = Path(store)
        if not path.is_file():
            raise InputError(path, "no history store here", expected=_EXPECTED)
        return cls._open(path, write=False)

    @classmethod
    @contextlib.contextmanager
    def _open(cls, path: Path, *, write: bool) -> Iterator[HistoryStore]:
        with _locked(path, exclusive=write):
            connection = _connect(path, read_only=not write)
            try:
                (_check_or_create if write else _check_version)(path, connection)
                yield cls(path, connection)
            finally:
                connection.close()

    def find(self, digest: str) -> int | None:
        row = self.connection.execute("SELECT run FROM runs WHERE summary_hash = ?", [digest]).fetchone()
        return None if row is None else int(row[0])

    def add(
        self, summary: dict, *, source: str, label: str | None = None, commit: str | None = None, report: str | None = None
    ) -> tuple[int, bool]:
        """Append a run; ``(its index, True)``, or ``(the stored run's index, False)`` when this summary is stored already."""
        digest = summary_hash(summary)
        known = self.find(digest)
        if known is not None:
            return known, False
        figures = headline_figures(summary)
        c = self.connection
        c.execute("BEGIN TRANSACTION")
        try:
            (run,) = c.execute("SELECT count(*) FROM runs").fetchone() or (0,)
            added_at = datetime.now(UTC).isoformat(timespec="seconds")
            c.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)", [run, label or f"run {run}", commit, added_at, source, report, digest]
            )
            rows = [
                (run, name, value if isinstance(value, float) else None, value if isinstance(value, str) else None)
                for name, value in figures.items()
            ]
            if rows:
                c.executemany("INSERT INTO figures VALUES (?, ?, ?, ?)", rows)
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        return int(run), True

    def load(self) -> History:
        """The whole history, as :class:`History`."""
        c = self.connection
        columns = ["run", "label", "commit", "added_at", "source", "report", "summary_hash"]
        runs = [dict(zip(columns, row, strict=True)) for row in c.execute(f"SELECT {', '.join(columns)} FROM runs ORDER BY run").fetchall()]
        table = c.execute("SELECT figure, run, value FROM figures WHERE value IS NOT NULL ORDER BY figure, run").fetchnumpy()
        names, indices, values = (np.asarray(table[column]) for column in ("figure", "run", "value"))
        starts = np.flatnonzero(np.r_[True, names[1:] != names[:-1]]) if names.size else np.array([], dtype=int)
        ends = np.r_[starts[1:], names.size]
        figures = {str(names[a]): (indices[a:b], values[a:b]) for a, b in zip(starts, ends, strict=True)}
        texts: dict[str, dict[int, str]] = {}
        for name, run, text in c.execute("SELECT figure, run, text FROM figures WHERE text IS NOT NULL ORDER BY figure, run").fetchall():
            texts.setdefault(name, {})[int(run)] = text
        return History(runs=runs, figures=figures, texts=texts)


def _connect(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    try:
        return interruptible(duckdb.connect(str(path), read_only=read_only))
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(path, f"not a readable DuckDB database ({first[:200]})", expected=_EXPECTED) from None


def _check_or_create(path: Path, connection: duckdb.DuckDBPyConnection) -> None:
    tables = {row[0] for row in connection.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if not tables:
        for statement in _SCHEMA:
            connection.execute(statement)
        connection.executemany("INSERT INTO meta VALUES (?, ?)", [("format", STORE_FORMAT), ("schema_version", str(SCHEMA_VERSION))])
        return
    _check_version(path, connection)


def _check_version(path: Path, connection: duckdb.DuckDBPyConnection) -> None:
    """Refuse a database that is not a dsprof history, or a history of another schema version."""
    try:
        meta = dict(connection.execute("SELECT key, value FROM meta").fetchall())
    except duckdb.Error:
        raise InputError(path, "a DuckDB database, but not a dsprof history store (no meta table)", expected=_EXPECTED) from None
    if meta.get("format") != STORE_FORMAT:
        raise InputError(path, f"a DuckDB database of format {str(meta.get('format'))[:80]!r}, not {STORE_FORMAT!r}", expected=_EXPECTED)
    if meta.get("schema_version") != str(SCHEMA_VERSION):
        raise InputError(
            path,
            f"history schema version {str(meta.get('schema_version'))[:20]}, this dsprof reads version {SCHEMA_VERSION}",
            expected="a store written by this dsprof version: start a new store, or use the dsprof that wrote it",
        )


# --------------------------------------------------------------------------- adding and checking


def add_run(store: str | os.PathLike, run: str | os.PathLike, *, label: str | None = None, commit: str | None = None) -> tuple[int, bool]:
    """``dsprof history add``: a run dir or summary.json into the store; ``(run index, added)``."""
    summary, source = summary_with_path(run)
    return _add_loaded(store, summary, str(Path(source or run).resolve()), label=label, commit=commit)


def _add_loaded(store: str | os.PathLike, summary: dict, source: str, *, label: str | None, commit: str | None) -> tuple[int, bool]:
    report = Path(source).with_name(artifacts.REPORT_HTML)
    with HistoryStore.open_for_write(store) as history:
        return history.add(summary, source=source, label=label, commit=commit, report=str(report) if report.is_file() else None)


@dataclass(frozen=True)
class FoundChange:
    """A change point of one figure, located at the first run after it."""

    figure: str
    index: int  # 0-based run index in add order
    label: str
    commit: str | None
    direction: str  # "worse", "better", or "" for a figure with no better direction
    before: float
    after: float
    pvalue: float

    @property
    def change(self) -> float:
        return self.after - self.before

    @property
    def magnitude(self) -> float:
        """The change as a share of the level before (the absolute change when that level is zero)."""
        return self.change / abs(self.before) if self.before else self.change

    def describe(self) -> str:
        """``step_interval_ms.p50 worse by +61.2% (60.1 -> 97.0 ms) at run 10 'nightly-11' (commit abc1234), p = 2e-09``."""
        unit = figure_unit(self.figure)
        size = f"{self.magnitude:+.1%}" if self.before else f"{self.change:+g}{' ' + unit if unit else ''}"
        where = f"run {self.index} {self.label!r}" + (f" (commit {self.commit[:12]})" if self.commit else "")
        levels = f"{self.before:.6g} -> {self.after:.6g}{' ' + unit if unit else ''}"
        return f"{self.figure} {self.direction or 'changed'} by {size} ({levels}) at {where}, p = {self.pvalue:.2g}"

    def to_json(self) -> dict[str, Any]:
        return {
            "figure": self.figure,
            "index": self.index,
            "label": self.label,
            "commit": self.commit,
            "direction": self.direction,
            "magnitude": round(self.magnitude, 6),
            "pvalue": float(f"{self.pvalue:.3g}"),
            "before": round(self.before, 6),
            "after": round(self.after, 6),
        }


@dataclass
class HistoryCheck:
    """The change points of every figure checked, and which regressions fall in the newest runs."""

    history: History
    checked: list[str]
    change_points: list[FoundChange]
    newest: int

    @property
    def regressions(self) -> list[FoundChange]:
        """Changes for the worse whose first run is one of the newest :attr:`newest` runs."""
        first_new = len(self.history.runs) - self.newest
        return [c for c in self.change_points if c.direction == "worse" and c.index >= first_new]

    @property
    def series(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return {name: self.history.figures[name] for name in self.checked}


def _direction(figure: str, change: float) -> str:
    sense = figure_direction(figure)
    if sense not in (HIGHER, LOWER) or change == 0:
        return ""
    return "better" if (change > 0) == (sense == HIGHER) else "worse"


def _resolution(figure: str, history: History) -> float:
    """The smallest step a figure's series can take, below which no change is told apart from noise.

    A count moves by whole items. A what-if figure sums findings, each above
    its run's noise floor: one more or one fewer finding moves it by about a
    floor, so its resolution is the history's median floor (as a share of the
    decode wall for the share). Every other figure: the summary's 0.001.
    """
    if figure.rsplit(".", 1)[-1] == "count":
        return COUNT_RESOLUTION
    if not figure.startswith("what_if.") or figure == DECODE_WALL or NOISE_FLOOR not in history.figures:
        return RESOLUTION
    floor_runs, floors = history.figures[NOISE_FLOOR]
    if figure != "what_if.share_of_decode_wall":
        return max(float(np.median(floors)), RESOLUTION)
    wall_runs, walls = history.figures.get(DECODE_WALL, (np.array([], dtype=np.int64), np.array([])))
    _, in_floors, in_walls = np.intersect1d(floor_runs, wall_runs, return_indices=True)
    shares = floors[in_floors] / walls[in_walls] if in_floors.size else np.array([])
    shares = shares[np.isfinite(shares)]
    return max(float(np.median(shares)), RESOLUTION) if shares.size else RESOLUTION


def find_changes(history: History, *, figures: list[str] | None = None, newest: int = DEFAULT_NEWEST) -> HistoryCheck:
    """Change points of the figures matching ``figures`` (dotted paths, ``*`` allowed; default all stored)."""
    names = sorted(history.figures)
    if figures:
        unmatched = [p for p in figures if not any(fnmatchcase(n, p) for n in names)]
        if unmatched:
            raise DsprofError(f"no stored figure matches {', '.join(repr(p) for p in unmatched)} (the store has {len(names)} figures)")
        names = [n for n in names if any(fnmatchcase(n, p) for p in figures)]
    found = []
    alpha = ALPHA / max(len(names), 1)  # the family-wise error over the figures checked stays ALPHA (Bonferroni)
    for name in names:
        runs, values = history.figures[name]
        for point in change_points(values, alpha=alpha, resolution=_resolution(name, history)):
            run = history.runs[int(runs[point.index])]
            found.append(
                FoundChange(
                    name, run["run"], run["label"], run["commit"], _direction(name, point.change), point.before, point.after, point.pvalue
                )
            )
    found.sort(key=lambda c: (c.index, c.figure))
    return HistoryCheck(history=history, checked=names, change_points=found, newest=newest)


def load_history(store: str | os.PathLike) -> History:
    with HistoryStore.open_for_read(store) as history:
        return history.load()


def check_history(store: str | os.PathLike, *, figures: list[str] | None = None, newest: int = DEFAULT_NEWEST) -> HistoryCheck:
    """``dsprof history check``: the change points of a store's figures."""
    return find_changes(load_history(store), figures=figures, newest=newest)


def with_candidate(history: History, summary: dict, source: str) -> History:
    """The history with a run not stored yet appended as its newest run (what ``gate --history`` judges)."""
    if any(run.get("summary_hash") == summary_hash(summary) for run in history.runs):
        return history
    index = len(history.runs)
    runs = [*history.runs, {"run": index, "label": f"{source} (this run)", "commit": None, "source": source, "report": None}]
    figures = dict(history.figures)
    for name, value in headline_figures(summary).items():
        if isinstance(value, float):
            old_runs, old_values = figures.get(name, (np.array([], dtype=np.int64), np.array([])))
            figures[name] = (np.r_[old_runs, index], np.r_[old_values, value])
    return History(runs=runs, figures=figures, texts=history.texts)
