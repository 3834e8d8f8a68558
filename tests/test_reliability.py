"""What a run folder does after something went wrong: a loss that explodes but stays finite
fails the run with its reason; a killed writer's temp files, a damaged status.json and the
folder of a start that failed before its first step do not stand in the way of the next run;
`reproduce` exits non-zero when one of its runs failed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from small_runs import config, run_cli

from mecheval.errors import ConfigError
from mecheval.training import read_status, train
from mecheval.training.config import dump_yaml, resolve
from mecheval.training.folder import METRICS_FILE, STATUS_FILE
from mecheval.training.trainer import EXPLODED_LOSS_FACTOR, divergence, loss_ceiling


def test_divergence_names_non_finite_and_exploded_losses() -> None:
    ceiling = loss_ceiling(20)
    assert ceiling == pytest.approx(EXPLODED_LOSS_FACTOR * math.log(20))
    assert divergence(0.5 * ceiling, 7, ceiling) is None
    assert divergence(ceiling, 7, ceiling) is None  # at the ceiling is not past it
    exploded = divergence(2 * ceiling, 7, ceiling)
    assert exploded is not None and exploded.step == 7
    assert exploded.reason.startswith("diverged: training loss") and "exceeds" in exploded.reason
    for value in (math.nan, math.inf):
        stop = divergence(value, 3, ceiling)
        assert stop is not None and stop.reason == f"diverged: training loss is {value} at step 3"


def test_a_loss_that_explodes_but_stays_finite_fails_the_run(tmp_path: Path) -> None:
    # lr=1e3: the loss runs away to ~1e5 within a few steps and stays finite.
    status = train(config(lr=1e3, steps=8), tmp_path / "run")
    assert status["state"] == "failed"
    assert "exceeds" in status["reason"] and status["reason"].startswith("diverged")
    assert read_status(tmp_path / "run")["state"] == "failed"


def test_a_killed_writers_temp_files_are_removed_when_the_run_trains(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = config(steps=8, checkpoint_every=4)
    (run / "checkpoint").mkdir(parents=True)
    strays = [
        run / ".metrics.csv.x1y2.tmp",
        run / "checkpoint" / ".step-000000004.safetensors.ab.tmp",
    ]
    for stray in strays:
        stray.write_bytes(b"half")
    assert train(cfg, run)["state"] == "done"
    assert not any(p.exists() for p in strays)
    assert not [p for p in run.rglob("*") if p.name.startswith(".")]  # no .lock either


def test_a_damaged_status_trains_the_run_again_to_the_same_end(tmp_path: Path, capsys) -> None:
    cfg = config(steps=8)
    clean = train(cfg, tmp_path / "clean")
    run = tmp_path / "run"
    train(cfg, run)
    (run / STATUS_FILE).write_text("{{{")
    status = train(cfg, run)
    assert f"{run / STATUS_FILE}: damaged" in capsys.readouterr().err
    assert status["state"] == "done"
    assert status["metrics"] == clean["metrics"]
    assert (run / METRICS_FILE).read_bytes() == (tmp_path / "clean" / METRICS_FILE).read_bytes()


def test_a_folder_whose_run_never_trained_does_not_block_the_corrected_config(
    tmp_path: Path, capsys
) -> None:
    run = tmp_path / "run"
    bad = config(steps=8, lr=2e-3)
    # As a start that failed before its first step leaves it: its config and a crashed status.
    run.mkdir()
    (run / "config.yaml").write_text(dump_yaml(resolve(bad)))
    (run / STATUS_FILE).write_text(
        json.dumps({"state": "failed", "reason": "crashed: x", "step": 0})
    )
    assert train(config(steps=8), run)["state"] == "done"
    assert "never trained" in capsys.readouterr().err
    # A run that did train keeps its folder: another config is refused.
    with pytest.raises(ConfigError, match="different config"):
        train(bad, run)


def test_reproduce_reports_a_diverged_run_and_exits_0(tmp_path: Path, monkeypatch, capsys):
    """A grid's diverged run is a result (the paper's high LRs diverge): recorded with its
    reason and reported, exit 0 (a crashed run exits 1: tests/test_gather.py)."""
    args = ("reproduce", "ar", "--preset", "tiny", "--archs", "attention", "--out", str(tmp_path))
    code, _, err = run_cli(monkeypatch, capsys, *args, "-q")
    assert code == 0, err
    status_path = tmp_path / "ar-tiny" / "attention" / STATUS_FILE
    status = json.loads(status_path.read_text())
    status.update(state="failed", reason="diverged: made up for the test")
    status_path.write_text(json.dumps(status))
    code, out, _ = run_cli(monkeypatch, capsys, *args, "-q")
    assert code == 0
    assert "1 failed" in out and "diverged: made up for the test" in out


def test_a_rerun_without_the_checkpoint_it_needs_says_it_starts_over(tmp_path: Path, capsys):
    run = tmp_path / "run"
    cfg = config(steps=8)
    train(cfg, run)
    status = json.loads((run / STATUS_FILE).read_text())
    # As a crash at step 6 whose checkpoint was then lost.
    status.update(state="failed", reason="crashed: interrupted", step=6)
    (run / STATUS_FILE).write_text(json.dumps(status))
    assert train(cfg, run)["state"] == "done"
    assert (
        "no checkpoint to resume its step 6 from; training from step 0" in capsys.readouterr().err
    )


def test_a_sweep_trains_a_run_with_a_damaged_status_again_and_goes_on(tmp_path: Path, capsys):
    from small_runs import SWEEP_BASE

    from mecheval.experiments.grid import SweepSpec
    from mecheval.experiments.runners import run_sweep
    from mecheval.experiments.store import load_results

    spec = SweepSpec(name="s", base=SWEEP_BASE, grid={"training.lr": [1e-3, 3e-3]})
    run_sweep(spec, tmp_path / "clean")
    run_sweep(spec, tmp_path / "damaged")
    (tmp_path / "damaged" / "s" / "lr1e-3" / STATUS_FILE).write_text("{{{")
    outcomes = run_sweep(spec, tmp_path / "damaged")
    assert [(o.name, o.state, o.skipped) for o in outcomes] == [
        ("lr1e-3", "done", False),  # trained again
        ("lr3e-3", "done", True),
    ]
    assert "lr1e-3/status.json: damaged" in capsys.readouterr().err
    expected = load_results(tmp_path / "clean" / "s")
    assert load_results(tmp_path / "damaged" / "s").equals(expected)
