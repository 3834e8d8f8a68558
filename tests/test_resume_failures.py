"""Failures met on resume and mid-sweep: a corrupt checkpoint is discarded (one warning line
naming the file) and the run trains again to the same result; a run or stacked group that
raises in a worker is recorded as failed, with its reason, while the rest of the sweep
finishes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import small_runs
import torch
from safetensors.torch import load_file, save_file
from small_runs import TASK, config

from mecheval.experiments import runners
from mecheval.experiments.grid import SweepSpec
from mecheval.experiments.runners import run_sweep
from mecheval.experiments.store import load_results
from mecheval.models import build_model, registry
from mecheval.tasks import build_datasets
from mecheval.training import read_status, resolve, train
from mecheval.training.checkpoint import load_checkpoint
from mecheval.training.folder import is_finished
from mecheval.training.trainer import Trainer

# ---------------------------------------------------------------------- corrupt checkpoints


def cfg(**training):
    # 8 steps, evaluations at 4 and 8. One thread, set in the config: the module-scoped
    # reference run is trained before conftest's per-test thread setting applies.
    return config(checkpoint_every=4, threads=1, **training)


@pytest.fixture(scope="module")
def data():
    return build_datasets(resolve(cfg()).task)


@pytest.fixture(scope="module")
def whole(tmp_path_factory, data) -> Path:
    """The uninterrupted run every resumed or restarted run must equal."""
    run = tmp_path_factory.mktemp("whole") / "run"
    assert train(cfg(), run, datasets=data)["state"] == "done"
    return run


class Crash(RuntimeError):
    pass


def interrupted(run: Path, data) -> Path:
    """``run`` crashed at step 8, before it finished: it holds the step-4 checkpoint."""

    def crash_at_8(step, model, run_dir):
        if step == 8:
            raise Crash("simulated crash")

    with pytest.raises(Crash):
        train(cfg(), run, datasets=data, callbacks=[crash_at_8])
    (tensors,) = (run / "checkpoint").glob("step-*.safetensors")
    assert tensors.name == "step-000000004.safetensors"
    return tensors


def assert_same_run(a: Path, b: Path) -> None:
    assert (a / "metrics.csv").read_bytes() == (b / "metrics.csv").read_bytes()
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


def foreign_tensors(path: Path) -> None:
    """A whole, readable safetensors file of another model (d_model 32)."""
    model = build_model(resolve(config(d_model=32)).model)
    save_file({f"model.{k}": v.contiguous() for k, v in model.state_dict().items()}, path)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


CORRUPTIONS = {
    # name: (what to damage, how) -> the file the warning must name
    "truncated tensors": ("tensors", _truncate),
    "garbage tensors": ("tensors", lambda p: p.write_bytes(b"\x00garbage" * 64)),
    "empty tensors": ("tensors", lambda p: p.write_bytes(b"")),
    "missing tensors": ("tensors", lambda p: p.unlink()),
    "another model's tensors": ("tensors", foreign_tensors),
    "garbage state.json": ("state", lambda p: p.write_bytes(b"\xff\xfe not json")),
    "truncated state.json": ("state", _truncate),
    "state.json without fields": ("state", lambda p: p.write_text('{"format": 1}')),
    "state.json of another format": (
        "state",
        lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "format": 99})),
    ),
    "state.json whose step is not its data position": (
        "state",
        lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "step": 5})),
    ),
    "state.json without trainer scalars": (
        "state",
        lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "trainer": {}})),
    ),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_corrupt_checkpoint_is_discarded_and_the_run_trains_again(
    corruption, tmp_path, data, whole, capsys
) -> None:
    run = tmp_path / "run"
    tensors = interrupted(run, data)
    which, damage = CORRUPTIONS[corruption]
    damaged = tensors if which == "tensors" else run / "checkpoint" / "state.json"
    damage(damaged)
    capsys.readouterr()

    status = train(cfg(), run, datasets=data)  # no exception

    assert status["state"] == "done"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: "), err
    assert str(damaged) in err[0] and "training from step 0" in err[0]
    # The status keeps the reason; the result is the uninterrupted run's, bit for bit.
    on_disk = read_status(run)
    assert on_disk["state"] == "done" and str(damaged) in on_disk["discarded_checkpoint"]
    assert_same_run(whole, run)
    # Nothing of the corrupt checkpoint, nor any temporary, is left.
    assert not (run / "checkpoint").exists()
    assert not [p.name for p in run.rglob("*") if p.name.endswith(".tmp")]


def test_a_good_checkpoint_still_resumes_without_a_warning(tmp_path, data, whole, capsys):
    run = tmp_path / "run"
    interrupted(run, data)
    capsys.readouterr()
    seen = []
    callbacks = [lambda step, model, run_dir: seen.append(step)]
    status = train(cfg(), run, datasets=data, callbacks=callbacks)
    assert status["state"] == "done" and "discarded_checkpoint" not in status
    assert seen == [8]  # resumed at step 4: no evaluation at 0 or 4 again
    assert capsys.readouterr().err == ""
    assert_same_run(whole, run)


def test_load_checkpoint_restores_nothing_from_a_corrupt_checkpoint(tmp_path, data) -> None:
    from mecheval.training.checkpoint import CorruptCheckpoint

    run = tmp_path / "run"
    tensors = interrupted(run, data)
    foreign_tensors(tensors)
    trainer = Trainer(resolve(cfg()), data, tmp_path / "other")
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(CorruptCheckpoint, match=r"model\.\S+ is .*, expected") as err:
        load_checkpoint(run / "checkpoint", trainer.model, trainer.optimizer, trainer.scheduler)
    assert str(tensors) in str(err.value) and "\n" not in str(err.value)
    for key, value in trainer.model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert not trainer.optimizer.state


def test_train_cli_on_a_corrupt_checkpoint_warns_in_one_line(tmp_path, monkeypatch, capsys):
    import yaml

    from mecheval.cli import main

    config_path = tmp_path / "run.yaml"
    data = json.loads(cfg().model_dump_json())
    data["training"]["keep_checkpoint"] = True  # the finished run leaves its checkpoint
    config_path.write_text(yaml.safe_dump(data))
    argv = ["mecheval", "train", str(config_path), "--out", str(tmp_path), "--name", "r", "-q"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert (exit_info.value.code or 0) == 0
    run = tmp_path / "r"
    # As after a kill: not finished, and its checkpoint damaged.
    (run / "status.json").write_text(json.dumps({"state": "running", "step": 4}))
    (run / "model.safetensors").unlink()
    (tensors,) = (run / "checkpoint").glob("step-*.safetensors")
    _truncate(tensors)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    assert (exit_info.value.code or 0) == 0, err
    assert out.startswith(f"done: {run}")
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: {tensors}: unreadable")


def test_a_sweep_resumes_past_a_corrupt_checkpoint(tmp_path) -> None:
    base = {
        "task": TASK,
        "model": {"architecture": "attention", "d_model": 16},
        "training": {"steps": 8, "eval_every": 4, "batch_size": 16, "threads": 1},
    }
    spec = SweepSpec(
        name="s",
        base=base,
        grid={"training.lr": [1e-3, 3e-3]},
        set={"training.checkpoint_every": 4, "training.keep_checkpoint": True},
    )
    first = run_sweep(spec, tmp_path)
    assert [o.state for o in first] == ["done", "done"]
    run = tmp_path / "s" / "lr3e-3"
    metrics = (run / "metrics.csv").read_text()
    (run / "status.json").unlink()
    (run / "model.safetensors").unlink()
    (tensors,) = (run / "checkpoint").glob("step-*.safetensors")
    tensors.write_bytes(b"not a safetensors file")

    again = run_sweep(spec, tmp_path)
    assert [(o.name, o.state, o.skipped) for o in again] == [
        ("lr1e-3", "done", True),
        ("lr3e-3", "done", False),
    ]
    assert (run / "metrics.csv").read_text() == metrics
    assert str(tensors) in read_status(run)["discarded_checkpoint"]


# ---------------------------------------------------------------------- a crash mid-sweep

# A plugin architecture whose training forward raises when ``model.mixer.explode`` is set:
# a plugin, so that the crash reaches spawned worker processes too. Evaluation (eval mode)
# works, so the crash comes from the training loop, not from the first evaluation.
EXPLODING = """
import os

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from mecheval.models.mixers.base import Mixer
from mecheval.models.registry import architecture


class ExplodingOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    explode: bool = False
    die: bool = False  # end the process instead, as a kill or a crash in native code does


@architecture("exploding", options=ExplodingOptions, description="raises when training")
class Exploding(Mixer):
    def __init__(self, d_model: int, options: ExplodingOptions) -> None:
        super().__init__()
        self.explode = options.explode
        self.die = options.die
        self.out_proj = nn.Linear(d_model, d_model)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        if self.explode and self.training:
            raise RuntimeError("boom: the exploding mixer")
        if self.die and self.training:
            os._exit(3)
        return self.out_proj(x.cumsum(1))
"""

SWEEP_BASE = {
    **small_runs.SWEEP_BASE,
    "training": {**small_runs.SWEEP_BASE["training"], "steps": 8, "eval_every": 4},
}


@pytest.fixture
def exploding(tmp_path, monkeypatch):
    """The plugin, loaded here and (through the environment) in worker processes."""
    monkeypatch.setenv(registry.PLUGIN_ENV, "")
    path = tmp_path / "exploding.py"
    path.write_text(EXPLODING)
    before = set(registry.ARCHITECTURES)
    loaded = set(registry._loaded_plugins)
    registry.use_plugins([path])
    yield path
    for name in set(registry.ARCHITECTURES) - before:
        del registry.ARCHITECTURES[name]
    registry._loaded_plugins.intersection_update(loaded)


def exploding_spec() -> SweepSpec:
    return SweepSpec(
        name="x",
        base={**SWEEP_BASE, "model": {**SWEEP_BASE["model"], "architecture": "exploding"}},
        grid={"model.mixer.explode": [False, True], "training.lr": [1e-3, 3e-3]},
    )


def assert_recorded(sweep_dir: Path, outcomes, failing: set[str], reason: str) -> None:
    """``failing`` runs failed with ``reason`` (outcome, status.json and results table);
    every other run is done."""
    for o in outcomes:
        if o.name in failing:
            assert o.state == "failed" and reason in o.reason, (o.name, o.reason)
            status = read_status(sweep_dir / o.name)
            assert status["state"] == "failed" and reason in status["reason"], o.name
        else:
            assert (o.state, o.reason) == ("done", ""), (o.name, o.reason)
            assert read_status(sweep_dir / o.name)["state"] == "done"
    table = load_results(sweep_dir).drop_duplicates("run").set_index("run")
    assert set(table.index) == {o.name for o in outcomes}
    for o in outcomes:
        assert table.loc[o.name, "status"] == o.state
        if o.name in failing:
            assert reason in table.loc[o.name, "reason"]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_that_raises_in_a_worker_fails_and_the_sweep_finishes(
    exploding, tmp_path, workers
) -> None:
    outcomes = run_sweep(exploding_spec(), tmp_path, workers=workers)
    names = [o.name for o in outcomes]
    assert names == [
        "explodeoff-lr1e-3",
        "explodeoff-lr3e-3",
        "explodeon-lr1e-3",
        "explodeon-lr3e-3",
    ]
    failing = {"explodeon-lr1e-3", "explodeon-lr3e-3"}
    assert_recorded(tmp_path / "x", outcomes, failing, "RuntimeError: boom: the exploding mixer")
    if workers > 1:
        return
    # A rerun skips the finished runs and tries the crashed ones again (a crash, unlike a
    # divergence, may not happen again).
    again = run_sweep(exploding_spec(), tmp_path, workers=workers)
    assert [(o.name, o.skipped) for o in again] == [(n, n not in failing) for n in names]


def test_a_stacked_group_that_raises_fails_whole_and_the_others_finish(
    tmp_path, monkeypatch
) -> None:
    from mecheval.training.stacking import group

    stacks = []
    original = group.GroupTrainer.run

    def run(self, *args, **kwargs):
        lrs = [member.t.lr for member in self.members]
        stacks.append(lrs)
        if 3e-3 in lrs:
            raise RuntimeError("boom: the stack of lr 3e-3")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(group.GroupTrainer, "run", run)
    spec = SweepSpec(
        name="g",
        base=SWEEP_BASE,
        grid={"training.lr": [1e-3, 2e-3, 3e-3, 4e-3]},
    )
    outcomes = run_sweep(spec, tmp_path, group_size=2)  # in this process: workers=1
    assert stacks == [[1e-3, 2e-3], [3e-3, 4e-3]]  # the crash stopped no other stack
    assert_recorded(tmp_path / "g", outcomes, {"lr3e-3", "lr4e-3"}, "boom: the stack of lr 3e-3")


def test_runs_trained_one_by_one_in_a_group_do_not_share_a_crash(tmp_path, monkeypatch) -> None:
    # A group that cannot be stacked (here: its vmap probe made to fail) trains its runs one
    # after another; one run's crash must not keep the next from training, nor give it that
    # crash as its reason.
    from mecheval.training import trainer
    from mecheval.training.stacking import group

    monkeypatch.setattr(group, "_vmap_error", lambda _group: "declared not vmappable")
    original = trainer.Trainer.train_step

    def train_step(self, batch):
        if self.t.lr == 2e-3:
            raise RuntimeError("boom: the run of lr 2e-3")
        return original(self, batch)

    monkeypatch.setattr(trainer.Trainer, "train_step", train_step)
    spec = SweepSpec(name="n", base=SWEEP_BASE, grid={"training.lr": [1e-3, 2e-3, 3e-3]})
    with pytest.warns(RuntimeWarning, match="cannot be vmapped"):
        outcomes = run_sweep(spec, tmp_path, group_size=3)
    assert [o.name for o in outcomes] == ["lr1e-3", "lr2e-3", "lr3e-3"]
    assert_recorded(tmp_path / "n", outcomes, {"lr2e-3"}, "boom: the run of lr 2e-3")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_group_that_raises_before_training_fails_with_its_reason(
    tmp_path, monkeypatch, workers
) -> None:
    # Outside the training itself: here the worker cannot read one job's config (damaged
    # after planning, so that only the worker sees it). That group fails with the reason in
    # one line; the other groups train.
    make_jobs = runners.make_jobs

    def damaged(*args, **kwargs):
        jobs = make_jobs(*args, **kwargs)
        jobs[1].config["training"]["lr"] = "fast"
        return jobs

    monkeypatch.setattr(runners, "make_jobs", damaged)
    spec = SweepSpec(name="b", base=SWEEP_BASE, grid={"training.lr": [1e-3, 2e-3, 3e-3]})
    outcomes = run_sweep(spec, tmp_path, workers=workers)
    assert [(o.name, o.state) for o in outcomes] == [
        ("lr1e-3", "done"),
        ("lr2e-3", "failed"),
        ("lr3e-3", "done"),
    ]
    reason = outcomes[1].reason
    assert reason.startswith("crashed: ValidationError: training.lr") and "'fast'" in reason
    assert "\n" not in reason


def test_a_worker_that_dies_fails_its_runs_instead_of_ending_the_sweep(exploding, tmp_path):
    spec = SweepSpec(
        name="d",
        base={**SWEEP_BASE, "model": {**SWEEP_BASE["model"], "architecture": "exploding"}},
        grid={"model.mixer.die": [False, True]},
    )
    outcomes = run_sweep(spec, tmp_path, workers=2)  # returns: no BrokenProcessPool raised
    assert [o.name for o in outcomes] == ["dieoff", "dieon"]
    died = "crashed: BrokenProcessPool: A process in the process pool was terminated abruptly"
    assert outcomes[1].state == "failed" and outcomes[1].reason.startswith(died)
    # The other run finished first, or was taken down with the pool: either way it is
    # reported, and nothing is recorded as finished that was not.
    assert (outcomes[0].state, outcomes[0].reason[: len(died)]) in {("done", ""), ("failed", died)}
    assert not is_finished(read_status(tmp_path / "d" / "dieon"))
