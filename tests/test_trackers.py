"""Experiment trackers (training/trackers.py, ``training.log``): TensorBoard event files a
reader loads with the run's metrics.csv values and emergence restores; W&B's calls, one run
per mecheval run; the same weights with and without a tracker; a clear line, nothing
written, for a tracker that is unknown or not installed."""

from __future__ import annotations

import importlib.machinery
import sys
import types
from pathlib import Path

import pandas as pd
import pytest
from small_runs import config, run_cli
from test_resume_failures import Crash
from test_training_group import run_both
from test_training_group import spy as spy  # noqa: F401 - the fixture

from mecheval.errors import ConfigError
from mecheval.experiments.mechanisms import EmergenceCallback
from mecheval.tasks import build_datasets
from mecheval.training import resolve, train
from mecheval.training import trackers as trackers_module
from mecheval.training.folder import TENSORBOARD_DIR
from mecheval.training.trackers import wandb_mode

tensorboard = pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")


@pytest.fixture(scope="module")
def data():
    return build_datasets(resolve(config()).task)


def events(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of the run's event files, as TensorBoard's reader loads them (an
    earlier session's events after a resumed step discarded, as TensorBoard shows them)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(run_dir / TENSORBOARD_DIR))
    reader.Reload()
    return {
        tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]
    }


def metrics_as_events(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    table = pd.read_csv(run_dir / "metrics.csv")
    return {
        f"{split}/{metric}": list(zip(rows.step, rows.value, strict=True))
        for (split, metric), rows in table.groupby(["split", "metric"], sort=False)
    }


def assert_same(logged, expected) -> None:
    assert sorted(logged) == sorted(expected)
    for tag, points in expected.items():
        assert [step for step, _ in logged[tag]] == [step for step, _ in points], tag
        # Event files hold float32.
        assert [v for _, v in logged[tag]] == pytest.approx([v for _, v in points], rel=1e-6)


def test_tensorboard_events_hold_the_metrics_and_the_emergence_restores(tmp_path, data) -> None:
    cfg = config(log="tensorboard")
    run = tmp_path / "run"
    callback = EmergenceCallback(cfg.task, n_layers=cfg.model.n_layers, n_docs=8)
    assert train(cfg, run, datasets=data, callbacks=[callback])["state"] == "done"
    logged = events(run)
    emergence = {tag: logged.pop(tag) for tag in list(logged) if tag.startswith("emergence/")}
    assert_same(logged, metrics_as_events(run))
    assert {"train/lr", "train/running_loss", "dev/accuracy", "test/likelihood"} <= set(logged)
    table = pd.read_csv(run / "emergence.csv", keep_default_na=False)
    likelihood = table[table.metric == "likelihood"]
    expected = {
        f"emergence/{'restore_' + row.role if row.role else row.condition}": []
        for row in likelihood.itertuples()
    }
    for row in likelihood.itertuples():
        key = f"emergence/{'restore_' + row.role if row.role else row.condition}"
        expected[key].append((row.step, row.value))
    assert set(expected) == {
        "emergence/original",
        "emergence/corrupted",
        "emergence/restore_key",
        "emergence/restore_value",
        "emergence/restore_query",
    }
    assert_same(emergence, expected)


def test_a_tracker_changes_no_weight_and_no_metric(tmp_path, data) -> None:
    train(config(), tmp_path / "plain", datasets=data)
    train(config(log="tensorboard"), tmp_path / "tracked", datasets=data)
    plain, tracked = tmp_path / "plain", tmp_path / "tracked"
    for name in ("model.safetensors", "metrics.csv"):
        assert (plain / name).read_bytes() == (tracked / name).read_bytes()
    assert not (tmp_path / "plain" / TENSORBOARD_DIR).exists()


def crash_at_8(step, model, run_dir):
    """A callback that crashes the run at its step-8 evaluation."""
    if step == 8:
        raise Crash("simulated crash")


def test_a_resumed_run_shows_each_step_once(tmp_path, data) -> None:
    run = tmp_path / "run"
    cfg = config(log="tensorboard", eval_every=2, checkpoint_every=4)
    with pytest.raises(Crash):
        train(cfg, run, datasets=data, callbacks=[crash_at_8])
    # The first session logged step 6 after its last checkpoint (4); the second logs it again.
    assert [step for step, _ in events(run)["dev/accuracy"]] == [0, 2, 4, 6]
    train(cfg, run, datasets=data)
    assert [step for step, _ in events(run)["dev/accuracy"]] == [0, 2, 4, 6, 8]
    assert_same(events(run), metrics_as_events(run))


def test_a_run_may_be_resumed_or_skipped_with_other_trackers(tmp_path, data) -> None:
    run = tmp_path / "run"
    first = train(config(), run, datasets=data)
    # Trackers are a runtime field: the finished run is skipped, not refused.
    assert train(config(log="tensorboard"), run, datasets=data) == first


def test_each_member_of_a_stack_logs_as_its_own_run(tmp_path, data, spy) -> None:
    cfgs = [config(seed=0, log="tensorboard"), config(seed=1, lr=1e-2, log="tensorboard")]
    run_both(tmp_path, cfgs, data, spy)
    spy.assert_stacked(8, [2] * 8)  # trained as a stack
    for i in range(2):
        stacked = tmp_path / f"g{i}"
        assert_same(events(stacked), metrics_as_events(stacked))
    assert events(tmp_path / "g0")["dev/loss"] != events(tmp_path / "g1")["dev/loss"]


def test_log_is_a_list_of_known_trackers() -> None:
    assert config(log="tensorboard, wandb,tensorboard").training.log == ["tensorboard", "wandb"]
    assert config(log="none").training.log == []
    with pytest.raises(ConfigError, match=r"training\.log"):
        config(log="mlflow")


def test_an_unknown_or_missing_tracker_is_one_line_and_writes_nothing(
    tmp_path, monkeypatch, capsys
) -> None:
    out = tmp_path / "runs"
    args = ("train", "--preset", "tiny", "--out", str(out), "-q")
    code, _, err = run_cli(monkeypatch, capsys, *args, "--set", "training.log=mlflow")
    assert code == 2 and "training.log" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()

    real_find_spec = trackers_module.importlib.util.find_spec
    monkeypatch.setattr(
        trackers_module.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "wandb" else real_find_spec(name, *a),
    )
    code, _, err = run_cli(monkeypatch, capsys, *args, "--set", "training.log=wandb")
    assert code == 2, err
    assert err.strip() == (
        "error: training.log: wandb needs the wandb package: pip install 'mecheval[wandb]'"
    )
    assert not out.exists()


class FakeWandB:
    """Stands in for the wandb package: records each run's init arguments, logs and finish."""

    def __init__(self) -> None:
        self.runs: list[FakeWandB.Run] = []

    class Run:
        def __init__(self, **kwargs) -> None:
            self.init = kwargs
            self.logged: list[tuple[int, dict]] = []
            self.finished = False

        def log(self, values, step) -> None:
            self.logged.append((step, values))

        def finish(self) -> None:
            self.finished = True

    def module(self) -> types.ModuleType:
        module = types.ModuleType("wandb")
        module.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # "installed"

        def init(**kwargs):
            self.runs.append(FakeWandB.Run(**kwargs))
            return self.runs[-1]

        module.init = init  # type: ignore[attr-defined]
        return module


@pytest.fixture
def fake_wandb(monkeypatch) -> FakeWandB:
    fake = FakeWandB()
    monkeypatch.setitem(sys.modules, "wandb", fake.module())
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(Path(__file__).parent / "no-such-netrc"))
    return fake


def test_wandb_logs_one_offline_run_per_run_with_the_metrics(tmp_path, data, fake_wandb) -> None:
    cfgs = [config(seed=0, log="wandb"), config(seed=1, log="wandb")]
    for i, cfg in enumerate(cfgs):
        train(cfg, tmp_path / "sweep" / f"r{i}", datasets=data)
    first, second = fake_wandb.runs
    assert first.init["mode"] == "offline"
    assert first.init["project"] == "mecheval"
    assert first.init["name"] == "sweep/r0" and second.init["name"] == "sweep/r1"
    assert first.init["dir"] == str(tmp_path / "sweep" / "r0")
    assert first.init["id"] != second.init["id"]
    assert first.init["config"]["training"]["seed"] == 0
    assert first.finished and second.finished
    expected = metrics_as_events(tmp_path / "sweep" / "r0")
    assert [step for step, _ in first.logged] == [0, 4, 8]
    for tag, points in expected.items():
        assert [(s, values[tag]) for s, values in first.logged if tag in values] == points


def test_wandb_resumes_its_run_and_goes_online_where_configured(
    tmp_path, data, fake_wandb, monkeypatch
) -> None:
    run = tmp_path / "run"
    cfg = config(log="wandb", eval_every=2, checkpoint_every=4)
    with pytest.raises(Crash):
        train(cfg, run, datasets=data, callbacks=[crash_at_8])
    monkeypatch.setenv("WANDB_API_KEY", "key")
    train(cfg, run, datasets=data)
    crashed, resumed = fake_wandb.runs
    assert crashed.init["id"] == resumed.init["id"] and resumed.init["resume"] == "allow"
    assert crashed.finished  # closed when the crash ended the session
    assert resumed.init["mode"] == "online"
    assert [step for step, _ in crashed.logged] == [0, 2, 4, 6]
    assert [step for step, _ in resumed.logged] == [6, 8]


def test_wandb_mode_follows_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"
    monkeypatch.delenv("WANDB_MODE")
    assert wandb_mode() == "offline"
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password secret\n")
    (tmp_path / "netrc").chmod(0o600)
    assert wandb_mode() == "online"
