"""Run folders end to end: learning, determinism, exact resume, divergence, skip, load_run, CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mecheval.errors import ConfigError
from mecheval.tasks import build_datasets
from mecheval.training import evaluate, load_run, read_status, resolve, train
from mecheval.training.config import config_from_data


def config(**training):
    data = {
        "task": {
            "kind": "ar",
            "n_keys": 8,
            "n_values": 8,
            "n_pairs": 2,
            "n_train": 640,
            "n_dev": 64,
            "n_test": 64,
            "seed": 3,
        },
        "model": {"architecture": "attention", "d_model": 16},
        "training": {"lr": 3e-3, "steps": 40, "eval_every": 10, **training},
    }
    return config_from_data(data)


@pytest.fixture(scope="module")
def data():
    return build_datasets(resolve(config()).task)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "model.safetensors")


def assert_same_run(a: Path, b: Path) -> None:
    assert (a / "metrics.csv").read_bytes() == (b / "metrics.csv").read_bytes()
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


def test_learns_trivial_task(tmp_path: Path) -> None:
    # One key-value pair: copy the value. A working recipe reaches ~100 % in a few hundred steps.
    cfg = config_from_data(
        {
            "task": {
                "kind": "ar",
                "n_keys": 8,
                "n_values": 8,
                "n_pairs": 1,
                "n_train": 640,
                "n_dev": 64,
                "n_test": 64,
            },
            "model": {"d_model": 16},
            "training": {"lr": 3e-3, "steps": 300, "eval_every": 100},
        }
    )
    status = train(cfg, tmp_path / "run")
    assert status["state"] == "done"
    assert status["metrics"]["dev"]["accuracy"] >= 0.95
    assert status["metrics"]["test"]["likelihood"] >= 0.8
    import pandas as pd

    frame = pd.read_csv(tmp_path / "run" / "metrics.csv")
    dev_acc = frame.query("split == 'dev' and metric == 'accuracy'").set_index("step")["value"]
    assert list(dev_acc.index) == [0, 100, 200, 300]  # at init, every eval_every, at the end
    assert dev_acc[0] < 0.5
    loss = frame.query("split == 'train' and metric == 'running_loss'")["value"]
    assert loss.iloc[-1] < loss.iloc[0]


def test_deterministic(tmp_path: Path, data) -> None:
    a = train(config(), tmp_path / "a", datasets=data)
    b = train(config(), tmp_path / "b", datasets=data)
    assert a["metrics"] == b["metrics"]
    assert_same_run(tmp_path / "a", tmp_path / "b")
    train(config(seed=1), tmp_path / "c", datasets=data)
    assert (tmp_path / "a" / "metrics.csv").read_bytes() != (
        tmp_path / "c" / "metrics.csv"
    ).read_bytes()


class Crash(RuntimeError):
    pass


@pytest.mark.parametrize(
    ("checkpoint_every", "queries"),
    [(20, 1), (15, 1), (15, 2)],  # checkpoints on and off eval boundaries; extra queries
)
def test_resume_equals_uninterrupted(
    tmp_path: Path, data, checkpoint_every: int, queries: int
) -> None:
    cfg = config(checkpoint_every=checkpoint_every, train_queries=queries)
    train(cfg, tmp_path / "whole", datasets=data)

    def crash_at_30(step, model, run_dir):
        if step == 30:
            raise Crash("simulated crash")

    with pytest.raises(Crash):
        train(cfg, tmp_path / "split", datasets=data, callbacks=[crash_at_30])
    status = read_status(tmp_path / "split")
    assert status["state"] == "failed" and status["reason"].startswith("crashed")
    assert (tmp_path / "split" / "checkpoint" / "state.json").is_file()
    assert not (tmp_path / "split" / "model.safetensors").exists()
    # The metrics file holds rows past the checkpoint (step 30); resume must redo them exactly.
    assert "30," in (tmp_path / "split" / "metrics.csv").read_text()
    seen = []
    status = train(
        cfg,
        tmp_path / "split",
        datasets=data,
        callbacks=[lambda step, model, run_dir: seen.append(step)],
    )
    assert status["state"] == "done"
    # The crash at step 30 comes before that step's checkpoint is written.
    last_checkpoint = (29 // checkpoint_every) * checkpoint_every
    assert seen == [s for s in (10, 20, 30, 40) if s > last_checkpoint]
    assert_same_run(tmp_path / "whole", tmp_path / "split")
    assert not (tmp_path / "split" / "checkpoint").exists()  # cleaned up when done


def test_resume_after_hard_kill(tmp_path: Path, data) -> None:
    # A killed process updates nothing: status stays "running", a half-written temp file may
    # be left behind. The checkpoint is what counts.
    cfg = config(checkpoint_every=20)
    train(cfg, tmp_path / "whole", datasets=data)

    def crash(step, model, run_dir):
        if step == 30:
            raise Crash()

    run = tmp_path / "split"
    with pytest.raises(Crash):
        train(cfg, run, datasets=data, callbacks=[crash])
    (run / "status.json").write_text(json.dumps({"state": "running", "step": 30}))
    (run / "checkpoint" / ".step-000000030.safetensors.abc.tmp").write_bytes(b"partial")
    assert train(cfg, run, datasets=data)["state"] == "done"
    assert_same_run(tmp_path / "whole", run)


def test_finished_run_is_skipped(tmp_path: Path, data) -> None:
    first = train(config(), tmp_path / "r", datasets=data)
    calls = []
    again = train(
        config(threads=1),
        tmp_path / "r",
        datasets=data,
        callbacks=[lambda *a: calls.append(a)],
    )
    assert again == first and calls == []
    with pytest.raises(ConfigError, match="different config"):
        train(config(lr=1e-2), tmp_path / "r", datasets=data)


def test_divergence_is_a_failed_status(tmp_path: Path, data) -> None:
    status = train(config(lr=1e6), tmp_path / "big", datasets=data)
    assert status["state"] == "failed"
    assert "diverged" in status["reason"] and status["step"] > 0
    assert json.loads((tmp_path / "big" / "status.json").read_text())["state"] == "failed"
    assert not (tmp_path / "big" / "model.safetensors").exists()

    def poison(step, model, run_dir):
        if step == 10:
            with torch.no_grad():
                model.embedding.weight[:] = float("inf")

    status = train(config(), tmp_path / "inf", datasets=data, callbacks=[poison])
    assert status["state"] == "failed" and status["step"] == 11
    assert "nan" in status["reason"]
    # Diverging again would be pointless: the failed run is returned, not retried.
    assert train(config(), tmp_path / "inf", datasets=data) == status


def test_load_run_rebuilds_the_model(tmp_path: Path, data) -> None:
    status = train(config(), tmp_path / "r", datasets=data)
    cfg, model = load_run(tmp_path / "r")
    assert cfg == resolve(config())
    assert not model.training
    got = evaluate(model, data["dev"], batch_size=cfg.training.eval_batch_size)
    assert got == status["metrics"]["dev"]
    with pytest.raises(ConfigError, match="not a run folder"):
        load_run(tmp_path / "nothing")


# ---------------------------------------------------------------------------- CLI


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    from mecheval.cli import main

    monkeypatch.setattr(sys, "argv", ["mecheval", *args])
    code = 0
    try:
        main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def write_config(tmp_path: Path, **training) -> Path:
    path = tmp_path / "run.yaml"
    from mecheval.training import dump_yaml

    path.write_text(dump_yaml(config(**training)))
    return path


def test_cli_trains_and_summarises(tmp_path: Path, monkeypatch, capsys) -> None:
    path = write_config(tmp_path)
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "train",
        str(path),
        "--out",
        str(tmp_path / "runs"),
        "--name",
        "x",
        "--quiet",
        "--set",
        "training.steps=20",
    )
    assert code == 0, err
    assert "done" in out and "dev p(y)=" in out and "test" in out
    assert read_status(tmp_path / "runs" / "x")["step"] == 20


def test_cli_bad_config_exits_2(tmp_path: Path, monkeypatch, capsys) -> None:
    path = write_config(tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, "train", str(path), "--set", "training.lrr=1")
    assert code == 2
    assert err.strip() == "error: training.lrr: unknown field"
    code, _, err = run_cli(monkeypatch, capsys, "train")
    assert code == 2 and "--preset" in err


def test_cli_diverged_exits_1(tmp_path: Path, monkeypatch, capsys) -> None:
    path = write_config(tmp_path)
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "train",
        str(path),
        "--quiet",
        "--out",
        str(tmp_path),
        "--set",
        "training.lr=1e6",
    )
    assert code == 1
    assert "diverged" in err


def test_cli_preset_print_config(tmp_path: Path, monkeypatch, capsys) -> None:
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "train",
        "--preset",
        "quick",
        "--task",
        "ar",
        "--set",
        "training.lr=5e-4",
        "--print-config",
    )
    assert code == 0, err
    import yaml

    data = yaml.safe_load(out)
    assert data["training"]["lr"] == 5e-4 and data["model"]["architecture"] == "attention"
    assert data["model"]["vocab_size"] is not None
