"""``dsprof run --ab``: the same seed with and without the faults, interleaved, predicted against measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsprof.commands.ab import AbResult, AbRun, decode_wall_ms, format_ab, run_ab
from dsprof.errors import DsprofError
from dsprof.runtime.config import RuntimeConfig

pytestmark = pytest.mark.runtime

DSPROF = Path(sys.executable).with_name("dsprof")


def test_one_ab_pair_of_a_straggler_measures_a_saving(tmp_path):
    out = tmp_path / "ab"
    args = ["run", "--ranks", "2", "--requests", "4", "--output-tokens", "16", "--seed", "2"]
    proc = subprocess.run(
        [str(DSPROF), *args, "--inject", "straggler:rank=1,ms=20", "--ab", "1", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads((out / "ab.json").read_text())
    assert found["schema"] == "dsprof.ab/1" and found["seed"] == 2 and found["inject"] == ["straggler:rank=1,ms=20"]
    (pair,) = found["pairs"]
    assert pair["pair"] == 1 and set(pair) == {"pair", "faulty", "clean", "measured_saved_ms"}
    assert set(pair["faulty"]) == {"dir", "exit_status", "decode_wall_ms", "predicted_saved_ms"}
    assert set(pair["clean"]) == {"dir", "exit_status", "decode_wall_ms"}
    # the faulty run really had the fault, the clean one none; both were analysed
    assert (Path(pair["faulty"]["dir"]) / "faults.json").is_file() and not (Path(pair["clean"]["dir"]) / "faults.json").exists()
    for side in ("faulty", "clean"):
        summary = json.loads((Path(pair[side]["dir"]) / "summary.json").read_text())
        assert pair[side]["decode_wall_ms"] == pytest.approx(decode_wall_ms(summary))
    # 20 ms more device work on every step of ~8: the faulty run is measurably longer
    assert found["measured_saved_ms"] == pytest.approx(pair["faulty"]["decode_wall_ms"] - pair["clean"]["decode_wall_ms"])
    assert found["measured_saved_ms"] > 0
    if found["predicted_saved_ms"] is None:  # an analysis without the what-if replay predicts nothing
        assert found["prediction"] is None and "no prediction" in proc.stdout
    else:
        assert found["prediction"] == "what_if.total_saved_ms" and found["predicted_saved_ms"] == pair["faulty"]["predicted_saved_ms"]
    assert "A/B verification" in proc.stdout and "measured saving" in proc.stdout


def test_ab_needs_a_fault_to_remove(tmp_path):
    with pytest.raises(DsprofError, match="--inject"):
        run_ab(RuntimeConfig.from_preset("demo"), tmp_path, pairs=1)


def test_ab_figures_are_medians_and_a_missing_prediction_is_said():
    config = RuntimeConfig.from_preset("demo", inject=["gc_pause:p=0.2,ms=30"])

    def runs(predictions: list[float | None]) -> list[AbRun]:
        walls = [(500.0, 380.0), (540.0, 400.0), (470.0, 390.0)]  # savings 120, 140, 80
        return [
            AbRun(faulty, index, Path(f"r{index}{faulty}"), 0, walls[index][0 if faulty else 1], predictions[index] if faulty else None)
            for index in range(3)
            for faulty in (True, False)
        ]

    result = AbResult(config, runs([100.0, 130.0, 90.0]))
    assert result.measured_saved_ms == 120.0 and result.predicted_saved_ms == 100.0
    assert result.error_share == pytest.approx(-20 / 120)
    assert "-16.7% against measured" in format_ab(result)
    silent = AbResult(config, runs([100.0, None, 90.0]))  # one faulty run had no what-if: no prediction at all
    assert silent.predicted_saved_ms is None and silent.to_json()["prediction"] is None
    assert "no prediction" in format_ab(silent)
