"""``training.stop_at_accuracy`` (zoology's early stopping): a run stops at the first
evaluation whose dev accuracy reaches the target, and is up to that step the full run
exactly (the LR schedule is the full run's); alone or as a member of a stacked group."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from small_runs import config
from test_training_group import StackSpy, assert_same_run, spied_group, spy  # noqa: F401

from mecheval.tasks import build_datasets
from mecheval.training import read_status, resolve, train

STEPS, EVERY = 24, 2


@pytest.fixture(scope="module")
def data():
    return build_datasets(resolve(config()).task)


def dev_accuracy(run_dir: Path) -> pd.Series:
    """The run's dev accuracy at each evaluation, indexed by step."""
    rows = pd.read_csv(run_dir / "metrics.csv")
    rows = rows[(rows["split"] == "dev") & (rows["metric"] == "accuracy")]
    return rows.set_index("step")["value"]


def target_inside(full: pd.Series) -> tuple[float, int]:
    """A target the full run first reaches at an evaluation before its last, and that step."""
    inside = full[(full.index > 0) & (full.index < STEPS)]
    target = float(inside.max())
    first = int(inside[inside >= target].index[0])
    assert target > 0 and first < STEPS  # the test would not test anything otherwise
    return target, first


def test_stops_at_first_evaluation_reaching_target(tmp_path: Path, data) -> None:
    full_dir, stop_dir = tmp_path / "full", tmp_path / "stop"
    train(config(steps=STEPS, eval_every=EVERY, lr=1e-2), full_dir, datasets=data)
    target, first = target_inside(dev_accuracy(full_dir))

    status = train(
        config(steps=STEPS, eval_every=EVERY, lr=1e-2, stop_at_accuracy=target),
        stop_dir,
        datasets=data,
    )
    assert status["state"] == "done"
    assert status["step"] == first and status["total_steps"] == STEPS
    assert f"at step {first} of {STEPS}" in status["stopped_early"]
    assert (stop_dir / "model.safetensors").exists()
    # Up to the stop, every metric row is the full run's, bit for bit; nothing after it.
    full = pd.read_csv(full_dir / "metrics.csv")
    stopped = pd.read_csv(stop_dir / "metrics.csv")
    assert stopped["step"].max() == first
    pd.testing.assert_frame_equal(stopped, full[full["step"] <= first].reset_index(drop=True))
    # A finished early run is skipped when asked again, not trained on.
    again = train(
        config(steps=STEPS, eval_every=EVERY, lr=1e-2, stop_at_accuracy=target),
        stop_dir,
        datasets=data,
    )
    assert again["step"] == first
    assert len(pd.read_csv(stop_dir / "metrics.csv")) == len(stopped)


def test_target_never_reached_trains_every_step(tmp_path: Path, data) -> None:
    status = train(
        config(steps=8, eval_every=EVERY, lr=1e-2, stop_at_accuracy=1.0),
        tmp_path / "run",
        datasets=data,
    )
    assert dev_accuracy(tmp_path / "run").max() < 1.0  # precondition: 8 steps do not learn
    assert status["step"] == 8 and "stopped_early" not in read_status(tmp_path / "run")


def test_group_member_stops_alone(tmp_path: Path, data, spy: StackSpy) -> None:  # noqa: F811
    """In a stack, a member that reaches the target leaves it at that evaluation (as its
    own run would stop); the other trains on; both folders equal their one-by-one runs."""
    fast, slow = {"lr": 1e-2, "seed": 0}, {"lr": 1e-4, "seed": 1}
    probe = tmp_path / "probe"
    train(config(steps=STEPS, eval_every=EVERY, **fast), probe, datasets=data)
    target, first = target_inside(dev_accuracy(probe))
    cfgs = [
        config(steps=STEPS, eval_every=EVERY, stop_at_accuracy=target, **fast),
        config(steps=STEPS, eval_every=EVERY, stop_at_accuracy=target, **slow),
    ]
    group = spied_group(spy, cfgs, [tmp_path / "g0", tmp_path / "g1"], datasets=data, use_vmap=True)
    single = [train(cfg, tmp_path / f"s{i}", datasets=data) for i, cfg in enumerate(cfgs)]
    assert single[0]["step"] == first and single[1]["step"] == STEPS  # the slow one never stops
    assert [s["step"] for s in group] == [first, STEPS]
    assert "stopped_early" in group[0] and "stopped_early" not in group[1]
    spy.assert_stacked(STEPS, [2] * first + [1] * (STEPS - first))
    for i in range(2):
        assert_same_run(tmp_path / f"g{i}", tmp_path / f"s{i}")


def test_a_sweep_says_where_a_run_stopped(tmp_path: Path) -> None:
    """The run's outcome (the line a sweep prints when it ends) and the results table's
    reason say at which step it stopped; a run that trains to the end says nothing."""
    from small_runs import SWEEP_BASE

    from mecheval.experiments.grid import SweepSpec
    from mecheval.experiments.runners import run_sweep
    from mecheval.experiments.store import load_results

    spec = SweepSpec(
        name="s",
        base={**SWEEP_BASE, "training": {**SWEEP_BASE["training"], "lr": 1e-2}},
        grid={"training.stop_at_accuracy": [0.01, 1.0]},
    )
    outcomes = run_sweep(spec, tmp_path)
    stopped, full = outcomes
    total = SWEEP_BASE["training"]["steps"]
    every = SWEEP_BASE["training"]["eval_every"]
    assert stopped.state == full.state == "done"
    assert stopped.reason.startswith(f"stopped at step {every} of {total}: dev accuracy ")
    assert full.reason == ""
    table = load_results(tmp_path / "s")
    reasons = table.groupby("run")["reason"].first()
    assert reasons[stopped.name] == stopped.reason and reasons[full.name] == ""


def _split_rows(run_dir: Path, split: str) -> pd.DataFrame:
    rows = pd.read_csv(run_dir / "metrics.csv")
    return rows[rows["split"] == split].reset_index(drop=True)


@pytest.mark.parametrize("stops", [False, True])
def test_a_split_evaluated_at_the_end_only_gives_the_full_runs_final_metrics(
    tmp_path: Path, data, stops: bool
) -> None:
    """``training.eval_at_end``: the test split is evaluated at the run's last evaluation
    alone (its last step, or where it stops early), with the numbers and weights of the run
    that evaluates it every time; the dev curve is that run's."""
    probe, every_dir, end_dir = tmp_path / "probe", tmp_path / "every", tmp_path / "end"
    train(config(steps=STEPS, eval_every=EVERY, lr=1e-2), probe, datasets=data)
    target, last = target_inside(dev_accuracy(probe)) if stops else (None, STEPS)
    common = {"steps": STEPS, "eval_every": EVERY, "lr": 1e-2, "stop_at_accuracy": target}
    train(config(**common), every_dir, datasets=data)  # the reference, to the same stop
    status = train(
        config(**common, eval_splits=["dev"], eval_at_end=["test"]), end_dir, datasets=data
    )
    assert status["step"] == last
    test_every, test_end = _split_rows(every_dir, "test"), _split_rows(end_dir, "test")
    assert set(test_end["step"]) == {last}
    pd.testing.assert_frame_equal(
        test_end, test_every[test_every["step"] == last].reset_index(drop=True)
    )
    pd.testing.assert_frame_equal(_split_rows(end_dir, "dev"), _split_rows(every_dir, "dev"))
    assert status["metrics"]["test"] == read_status(every_dir)["metrics"]["test"]
    assert (end_dir / "model.safetensors").read_bytes() == (
        every_dir / "model.safetensors"
    ).read_bytes()


def test_a_stacked_member_evaluates_its_end_split_where_it_stops(
    tmp_path: Path,
    data,
    spy: StackSpy,  # noqa: F811
) -> None:
    """In a stack, each member evaluates its ``eval_at_end`` split at its own last
    evaluation: the one that stops early there, the other at the last step."""
    fast, slow = {"lr": 1e-2, "seed": 0}, {"lr": 1e-4, "seed": 1}
    probe = tmp_path / "probe"
    train(config(steps=STEPS, eval_every=EVERY, **fast), probe, datasets=data)
    target, first = target_inside(dev_accuracy(probe))
    common = {"steps": STEPS, "eval_every": EVERY, "stop_at_accuracy": target}
    ends = {"eval_splits": ["dev"], "eval_at_end": ["test"]}
    cfgs = [config(**common, **ends, **fast), config(**common, **ends, **slow)]
    group = spied_group(spy, cfgs, [tmp_path / "g0", tmp_path / "g1"], datasets=data, use_vmap=True)
    assert [s["step"] for s in group] == [first, STEPS]
    for i, last in enumerate((first, STEPS)):
        assert set(_split_rows(tmp_path / f"g{i}", "test")["step"]) == {last}
        train(cfgs[i], tmp_path / f"s{i}", datasets=data)
        assert_same_run(tmp_path / f"g{i}", tmp_path / f"s{i}")
