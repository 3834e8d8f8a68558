"""Sweeps: grid expansion, resumable local runs, failure handling, the results store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from small_runs import SWEEP_BASE

from mecheval.errors import ConfigError
from mecheval.experiments.execution import scheduling
from mecheval.experiments.execution.jobs import Job, Outcome, RunProgress
from mecheval.experiments.execution.scheduling import (
    GPU_GROUP_SIZE,
    auto_group_size,
    estimated_seconds,
    gpu_share,
    group_jobs,
    longest_first,
)
from mecheval.experiments.grid import SweepSpec, expand, load_sweep
from mecheval.experiments.mechanisms import InterventionPlan
from mecheval.experiments.plan import plan_runs, restrict, run_values, with_overrides
from mecheval.experiments.runners import make_jobs, run_sweep
from mecheval.experiments.store import load_results
from mecheval.models.sites import describe_site, parse_site, resolve_site
from mecheval.tasks import build_datasets
from mecheval.training.folder import load_run
from mecheval.training.metrics import evaluate

TINY_BASE = SWEEP_BASE


def tiny_spec(name: str = "tiny", **grid) -> SweepSpec:
    return SweepSpec(name=name, base=TINY_BASE, grid=grid or {"training.lr": [1e-3, 3e-3]})


def test_names_are_readable_stable_and_unique() -> None:
    spec = SweepSpec(
        name="x",
        grid={
            "model.architecture": ["attention", "mamba"],
            "model.d_model": [64],
            "training.lr": [1e-3, 3e-4],
            "training.seed": [0],
        },
        per_architecture={"mamba": {"model.mixer.d_conv": None}},
        set={"task.n_pairs": 4},
    )
    runs = expand(spec)
    assert [r.name for r in runs] == [
        "attention-d64-lr1e-3-s0",
        "attention-d64-lr3e-4-s0",
        "mamba-d64-lr1e-3-s0",
        "mamba-d64-lr3e-4-s0",
    ]
    values = [run_values(spec, run) for run in runs]
    assert values[2]["model.mixer.d_conv"] is None
    assert "model.mixer.d_conv" not in values[0]
    assert all(v["task.n_pairs"] == 4 for v in values)
    assert [r.name for r in expand(spec)] == [r.name for r in runs]


def test_floats_one_digit_would_round_are_named_exactly() -> None:
    # 0.95 and 0.99 both round to 1e0: named so, two sweeps would share their run folders.
    spec = SweepSpec(name="x", grid={"training.stop_at_accuracy": [0.95, 0.99, 1.0, 0.5]})
    assert [r.name for r in expand(spec)] == [
        "stop_at_accuracy0.95",
        "stop_at_accuracy0.99",
        "stop_at_accuracy1e0",
        "stop_at_accuracy5e-1",
    ]


def test_one_runs_overrides_do_not_leak_into_the_next() -> None:
    spec = SweepSpec(
        name="x",
        base=TINY_BASE,
        grid={"model.architecture": ["mamba", "attention"]},
        per_architecture={"mamba": {"training.device": "mps", "model.mixer.d_conv": 2}},
    )
    before = json.dumps(TINY_BASE, sort_keys=True)
    mamba, attention = (run.cfg for run in plan_runs(spec))
    assert mamba.training.device == "mps" and attention.training.device == "cpu"
    assert json.dumps(TINY_BASE, sort_keys=True) == before


def test_planned_configs_carry_the_grid_values() -> None:
    planned = plan_runs(tiny_spec())
    assert [run.cfg.training.lr for run in planned] == [1e-3, 3e-3]
    assert [run.cfg.name for run in planned] == ["lr1e-3", "lr3e-3"]
    assert [run.run_dir for run in planned] == [Path("runs/tiny/lr1e-3"), Path("runs/tiny/lr3e-3")]


def test_a_grid_value_reaches_its_config_as_written() -> None:
    """The merge is typed: no value is written out as text and parsed back, so an LR with
    more digits than ``%g`` keeps (0.000316228 of 0.00031622776601683794) is the grid's."""
    lr = 10**-3.5
    planned = plan_runs(tiny_spec(**{"training.lr": [lr], "training.betas": [[0.9, 0.95]]}))
    assert [run.cfg.training.lr for run in planned] == [lr]
    assert [run.cfg.training.betas for run in planned] == [(0.9, 0.95)]


def test_each_source_of_a_value_wins_over_the_ones_before_it() -> None:
    """plan.py's order: preset < base section < set < per_architecture < grid point, and
    the command line's values over the set and per-architecture ones."""
    spec = SweepSpec(
        name="order",
        base={"preset": "tiny", "task": "ar", "training": {"eval_every": 7, "seed": 3}},
        set={"training.eval_every": 8, "training.lr": 2e-3, "training.batch_size": 8},
        per_architecture={"mamba": {"training.eval_every": 9, "training.lr": 4e-3}},
        grid={"model.architecture": ["mamba", "attention"], "training.batch_size": [4]},
    )
    mamba, attention = (run.cfg.training for run in plan_runs(spec))
    assert (mamba.seed, mamba.eval_every, mamba.lr, mamba.batch_size) == (3, 9, 4e-3, 4)
    assert (attention.eval_every, attention.lr, attention.steps) == (8, 2e-3, 40)  # 40: tiny's
    mine = with_overrides(spec, {"training.lr": 5e-3})
    assert mine.name == "order-lr5e-3"
    assert [run.cfg.training.lr for run in plan_runs(mine)] == [5e-3, 5e-3]
    # A field the grid varies cannot be set over it: each run would keep its grid value.
    with pytest.raises(ConfigError, match=r"--set training.batch_size: the sweep's grid varies"):
        with_overrides(spec, {"training.batch_size": 2})
    # Runtime fields keep the sweep's folder.
    assert with_overrides(spec, {"training.threads": 1}).name == "order"


def test_unnamed_values_leave_a_run_named_as_without_the_axis() -> None:
    spec = SweepSpec(
        name="seeds",
        base={"preset": "tiny", "task": "ar"},
        grid={"model.architecture": ["mamba"], "training.seed": [0, 1]},
        unnamed={"training.seed": 0},
    )
    assert [run.name for run in expand(spec)] == ["mamba", "mamba-s1"]
    assert [run.cfg.training.seed for run in plan_runs(spec)] == [0, 1]
    # Only a value of the same type is left out: an unnamed True is not the seed 1.
    as_bool = spec.model_copy(update={"unnamed": {"training.seed": True}})
    assert [run.name for run in expand(as_bool)] == ["mamba-s0", "mamba-s1"]
    lone = spec.model_copy(update={"grid": {"training.seed": [0]}})
    assert [run.name for run in expand(lone)] == ["seeds"]  # no name part left: the sweep's
    stray = spec.model_copy(update={"unnamed": {"training.lr": 1e-3}})
    with pytest.raises(ConfigError, match=r"^sweep.unnamed.training.lr: no grid of this sweep"):
        expand(stray)


def test_a_further_grid_joins_the_sweep_with_its_own_values() -> None:
    """``also``: its runs follow the sweep's own, each grid's ``set`` over the sweep's, the
    command line's values over both; a field any grid varies cannot be set; a subset cuts
    every grid."""
    spec = SweepSpec(
        name="parts",
        base={"preset": "tiny", "task": "ar"},
        set={"training.eval_every": 8, "training.lr": 2e-3},
        grid={"model.architecture": ["mamba", "attention"]},
        also=[
            {"set": {"training.lr": 4e-3}, "grid": {"model.layers": [["mamba", "attention"]]}},
            {"grid": {"model.n_layers": [3], "training.seed": [0, 1]}},
        ],
    )
    planned = plan_runs(spec)
    assert [run.cfg.name for run in planned] == [
        "mamba",
        "attention",
        "mamba+attention",
        "L3-s0",
        "L3-s1",
    ]
    assert [run.cfg.training.lr for run in planned] == [2e-3, 2e-3, 4e-3, 2e-3, 2e-3]
    assert {run.cfg.training.eval_every for run in planned} == {8}
    assert [run.cfg.model.n_layers for run in planned] == [2, 2, 2, 3, 3]
    mine = with_overrides(spec, {"training.lr": 5e-3})
    assert [run.cfg.training.lr for run in plan_runs(mine)] == [5e-3] * 5
    with pytest.raises(ConfigError, match=r"--set training.seed: the sweep's grid varies"):
        with_overrides(spec, {"training.seed": 2})
    one_seed = restrict(spec, "parts", {"--seeds": [1]})
    assert [run.name for run in expand(one_seed)] == [
        "mamba-s1",
        "attention-s1",
        "mamba+attention-s1",
        "L3-s1",
    ]
    with pytest.raises(ConfigError, match="--seeds: 2 not in the grid"):
        restrict(spec, "parts", {"--seeds": [0, 2]})
    clash = SweepSpec(name="clash", grid=spec.grid, also=[{"grid": spec.grid}])
    with pytest.raises(ConfigError, match="two runs would both be named 'mamba'"):
        expand(clash)


def test_bad_sweep_spec_is_one_line(tmp_path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: s\ngrid: {training.lr: []}\n")
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert "grid" in str(err.value) and "\n" not in str(err.value)
    path.write_text("name: s\ngird: {}\n")
    with pytest.raises(ConfigError, match="gird"):
        load_sweep(path)


def test_sweep_runs_skips_and_resumes(tmp_path) -> None:
    outcomes = run_sweep(tiny_spec(), tmp_path)
    assert [o.state for o in outcomes] == ["done", "done"]
    assert not any(o.skipped for o in outcomes)
    first = (tmp_path / "tiny" / "lr1e-3" / "metrics.csv").read_text()

    # Done runs are skipped on a rerun, their folders untouched.
    again = run_sweep(tiny_spec(), tmp_path)
    assert all(o.skipped for o in again)

    # A run whose status vanished (killed before it finished) is redone to the same result.
    (tmp_path / "tiny" / "lr1e-3" / "status.json").unlink()
    (tmp_path / "tiny" / "lr1e-3" / "model.safetensors").unlink()
    redo = run_sweep(tiny_spec(), tmp_path)
    assert [o.skipped for o in redo] == [False, True]
    assert (tmp_path / "tiny" / "lr1e-3" / "metrics.csv").read_text() == first


def test_a_rerun_with_every_run_over_starts_no_worker_and_one_left_does(
    tmp_path, monkeypatch
) -> None:
    """A sweep rerun to see its results reads each run's outcome in this process, also with
    --workers 2 (no pool of fresh interpreters for nothing); a run still to do (or whose
    planned interventions are missing) goes to the workers."""
    from mecheval.experiments.execution import pool

    plan = InterventionPlan(sites=("layers.0.output",), n_docs=4)
    run_sweep(tiny_spec(), tmp_path, plan=plan)

    class NoPool:
        def __init__(self, *args, **kwargs) -> None:
            raise AssertionError("a worker pool started")

    monkeypatch.setattr(pool, "ProcessPoolExecutor", NoPool)
    again = run_sweep(tiny_spec(), tmp_path, workers=2, plan=plan)
    assert [(o.state, o.skipped) for o in again] == [("done", True)] * 2
    # A run's interventions missing: a worker has something to do; so has a run to train.
    (tmp_path / "tiny" / "lr3e-3" / "interventions.csv").unlink()
    with pytest.raises(AssertionError, match="a worker pool started"):
        run_sweep(tiny_spec(), tmp_path, workers=2, plan=plan)
    (tmp_path / "tiny" / "lr1e-3" / "status.json").unlink()
    with pytest.raises(AssertionError, match="a worker pool started"):
        run_sweep(tiny_spec(), tmp_path, workers=2, plan=plan)


def test_a_finished_run_of_another_config_stops_the_sweep_before_anything_runs(tmp_path) -> None:
    run_sweep(tiny_spec(), tmp_path)
    folder = tmp_path / "tiny" / "lr1e-3"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    # The same run names, another config (as after an upgrade that changes a preset): its
    # finished runs are not this sweep's results, and reporting them as done would say so.
    changed = tiny_spec(**{"training.lr": [1e-3, 3e-3, 1e-2]})
    changed = changed.model_copy(update={"set": {"training.steps": 18}})
    with pytest.raises(ConfigError, match=r"lr1e-3: holds a run with a different config"):
        run_sweep(changed, tmp_path)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert not (tmp_path / "tiny" / "lr1e-2").exists()


def test_a_diverging_run_fails_and_the_sweep_goes_on(tmp_path) -> None:
    spec = tiny_spec(**{"training.lr": [1e-3, 1e6]})
    outcomes = run_sweep(spec, tmp_path)
    states = {o.name: o for o in outcomes}
    assert states["lr1e6"].state == "failed" and "diverged" in states["lr1e6"].reason
    assert states["lr1e-3"].state == "done"
    status = json.loads((tmp_path / "tiny" / "lr1e6" / "status.json").read_text())
    assert status["state"] == "failed"
    # Failed runs stay failed on a plain rerun and are retried only when asked.
    status_path = tmp_path / "tiny" / "lr1e6" / "status.json"
    written = status_path.stat().st_mtime_ns
    run_sweep(spec, tmp_path)
    assert status_path.stat().st_mtime_ns == written
    run_sweep(spec, tmp_path, retry_failed=True)
    assert status_path.stat().st_mtime_ns != written
    assert json.loads(status_path.read_text())["state"] == "failed"


def test_two_worker_processes_give_the_same_results(tmp_path) -> None:
    one = run_sweep(tiny_spec(), tmp_path / "a")
    two = run_sweep(tiny_spec(), tmp_path / "b", workers=2)
    assert [o.name for o in two] == [o.name for o in one]
    for o in one:
        a = (tmp_path / "a" / "tiny" / o.name / "metrics.csv").read_text()
        b = (tmp_path / "b" / "tiny" / o.name / "metrics.csv").read_text()
        assert a == b


def test_results_table_has_config_and_behavioural_columns(tmp_path) -> None:
    run_sweep(tiny_spec(), tmp_path)
    table = load_results(tmp_path / "tiny")
    assert set(table["run"]) == {"lr1e-3", "lr3e-3"}
    assert {"model.architecture", "training.lr", "task.n_pairs", "metric", "value"} <= set(
        table.columns
    )
    assert set(table["source"]) == {"behavioural"}
    # Each run's final dev rows are its own final model's scores on its own dev set, under
    # its own config columns (not another run's, step's or split's).
    for name, lr in (("lr1e-3", 1e-3), ("lr3e-3", 3e-3)):
        cfg, model = load_run(tmp_path / "tiny" / name)
        dev = build_datasets(cfg.task)["dev"]
        expected = evaluate(model, dev, cfg.training.eval_batch_size)
        rows = table[(table.run == name) & (table.step == 12) & (table.split == "dev")]
        assert set(rows["training.lr"]) == {lr} and set(rows["task.n_pairs"]) == {2}
        assert sorted(rows.metric) == sorted(expected)
        for metric, value in expected.items():
            assert rows[rows.metric == metric]["value"].item() == pytest.approx(value, abs=1e-9)
    # The two runs' models differ, so the check above tells them apart.
    finals = table[(table.step == 12) & (table.split == "dev") & (table.metric == "loss")]
    assert finals["value"].nunique() == 2


def test_site_grammar() -> None:
    assert parse_site("layers.1.mixer.conv.output") == (1, "conv", "output")
    assert parse_site("layers.0.input") == (0, "block", "input")
    assert parse_site("layers.12.mlp.output") == (12, "mlp", "output")
    assert parse_site("final_norm.input") == (-1, "final_norm", "input")
    assert resolve_site("layers.{last}.input", 3) == "layers.2.input"
    assert describe_site("layers.{last}.input") == "the last layer's input"
    assert describe_site("layers.0.mixer.conv.output") == "layer 0's mixer conv output"


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray cluster of this machine for the module's Ray tests (in one test
    process: xdist_group "ray"); it declares a GPU, which this machine needs not have."""
    if torch.cuda.is_available():
        ray = pytest.importorskip("ray")  # a GPU machine may lack it
    else:
        import ray  # the `ray` extra: `make setup` installs it, so CI always runs these tests
    ray.init(
        num_cpus=2,
        num_gpus=1,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
    )
    yield ray
    ray.shutdown()


@pytest.mark.xdist_group("ray")
def test_ray_backend_on_a_local_instance(tmp_path, local_ray) -> None:
    outcomes = run_sweep(tiny_spec(), tmp_path / "ray", backend="ray")
    local = run_sweep(tiny_spec(), tmp_path / "local")
    assert [o.state for o in outcomes] == ["done", "done"]
    for o in local:
        a = (tmp_path / "ray" / "tiny" / o.name / "metrics.csv").read_text()
        assert a == (tmp_path / "local" / "tiny" / o.name / "metrics.csv").read_text()


def test_gpu_groups_ask_ray_for_a_share_of_a_card() -> None:
    def job(device: str) -> Job:
        return Job(name=device, run_dir="", config={"training": {"device": device}}, threads=1)

    cpu, gpu = [job("cpu")], [job("cuda")]
    assert gpu_share([cpu, cpu], cards=0) == 0.0
    assert gpu_share([gpu, cpu, gpu], cards=2) == 1.0
    assert gpu_share([gpu, gpu, gpu], cards=2) == 0.5
    assert gpu_share([gpu] * 3, cards=1) == 0.3333
    with pytest.raises(ConfigError, match="declares no GPU"):
        gpu_share([gpu], cards=0)


@pytest.mark.xdist_group("ray")
def test_a_cuda_sweep_on_ray_asks_for_gpus_and_each_worker_checks_its_device(
    tmp_path, monkeypatch, local_ray
) -> None:
    """A local Ray that declares one GPU (this machine needs none): three runs on cuda, one
    group each, ask for a third of the card each; where the worker has no CUDA, each run
    fails with the device's one-line reason and the sweep goes on."""
    from ray.remote_function import RemoteFunction

    asked: list[float] = []
    options = RemoteFunction.options

    def spy(self, **kwargs):
        asked.append(kwargs.get("num_gpus"))
        return options(self, **kwargs)

    monkeypatch.setattr(RemoteFunction, "options", spy)
    spec = tiny_spec().model_copy(update={"set": {"training.device": "cuda"}})
    spec = spec.model_copy(update={"grid": {"training.seed": [0, 1, 2]}})
    outcomes = run_sweep(spec, tmp_path, backend="ray", group_size=1)
    stacked = run_sweep(spec, tmp_path / "stacked", backend="ray")
    # Three groups of one share the card; stacked (a GPU's default), one group has it whole.
    assert asked == [0.3333] * 3 + [1.0]
    for o in [*outcomes, *stacked]:
        if torch.cuda.is_available():
            assert o.state == "done"
        else:
            assert o.state == "failed" and "this machine has no CUDA device" in o.reason, o


def test_kill_9_mid_sweep_loses_no_finished_run(tmp_path, monkeypatch) -> None:
    # Timing-free (see test_signals.py): the sweep's second run blocks right after its
    # checkpoint at step 6 and marks it; the test waits for that mark, then kills.
    import os
    import signal

    import torch
    import yaml
    from safetensors.torch import load_file
    from test_signals import marks, mecheval, spy_resumes, temp_files, wait_for

    from mecheval.training import read_status

    spec = {
        "name": "killed",
        "base": {**TINY_BASE, "training": {**TINY_BASE["training"], "checkpoint_every": 3}},
        "grid": {"training.lr": [1e-3, 2e-3, 3e-3]},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    args = ["sweep", "spec.yaml", "--out", "runs", "-q", "--no-interventions"]
    with mecheval(tmp_path, *args, gate_step=6, gate_run="lr2e-3") as process:
        wait_for(lambda: "lr2e-3" in marks(tmp_path), "the second run at step 6", process)
        os.killpg(process.pid, signal.SIGKILL)  # mid-way through the second run
        process.wait()

    sweep = tmp_path / "runs" / "killed"
    assert read_status(sweep / "lr1e-3")["state"] == "done"
    # A killed process updates nothing: the status still says running; the checkpoint counts.
    assert read_status(sweep / "lr2e-3")["state"] == "running"
    assert json.loads((sweep / "lr2e-3" / "checkpoint" / "state.json").read_text())["step"] == 6
    assert not (sweep / "lr3e-3").exists()
    # Only the lock file of the killed run, which cannot remove it (the kernel drops the lock).
    assert [p.relative_to(sweep) for p in temp_files(sweep)] == [Path("lr2e-3", ".lock")]
    for folder in sweep.iterdir():
        for name in ("config.yaml", "status.json"):
            if (folder / name).exists():  # whatever was written is whole
                assert yaml.safe_load((folder / name).read_text())

    resumed = spy_resumes(monkeypatch)
    outcomes = run_sweep(load_sweep(tmp_path / "spec.yaml"), tmp_path / "runs")
    assert [o.state for o in outcomes] == ["done", "done", "done"]
    assert outcomes[0].skipped
    assert resumed == {"lr2e-3": 6, "lr3e-3": None}  # the killed run resumed from step 6
    assert temp_files(sweep) == []  # its rerun took the lock over and removed it
    # ... and ends as an uninterrupted run: same metrics rows, same final weights.
    clean = run_sweep(load_sweep(tmp_path / "spec.yaml"), tmp_path / "clean")
    for o in clean:
        a, b = sweep / o.name, tmp_path / "clean" / "killed" / o.name
        assert (a / "metrics.csv").read_text() == (b / "metrics.csv").read_text()
        wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_the_pool_starts_the_longest_runs_first(tmp_path, monkeypatch) -> None:
    # A step's cost stands in for the timing, which on models this small is noise: the test
    # is of the ordering, not of the stopwatch.
    timed = []

    def step_cost(cfg) -> float:
        timed.append(cfg.model.d_model)
        return float(cfg.model.d_model)

    monkeypatch.setattr(scheduling, "step_seconds", step_cost)
    spec = tiny_spec(**{"model.d_model": [8, 64], "training.steps": [12, 200]})
    jobs = make_jobs(spec, tmp_path, workers=2, plan=None, retry_failed=False, cache_dir=None)
    assert estimated_seconds(jobs) == {
        "d8-steps12": 8 * 12,
        "d8-steps200": 8 * 200,
        "d64-steps12": 64 * 12,
        "d64-steps200": 64 * 200,
    }
    assert sorted(timed) == [8, 64]  # one timing per model shape
    ordered = [group[0].name for group in longest_first([[job] for job in jobs])]
    assert ordered[0] == "d64-steps200" and ordered[-1] == "d8-steps12"
    # A group costs its runs' sum: d8-steps12 and d64-steps12 together outweigh the latter.
    pair = [jobs[0], jobs[2]]
    assert [job.name for job in pair] == ["d8-steps12", "d64-steps12"]
    assert longest_first([[jobs[2]], pair])[0] == pair
    # A finished run costs nothing, however big.
    (tmp_path / "tiny" / "d64-steps200").mkdir(parents=True)
    (tmp_path / "tiny" / "d64-steps200" / "status.json").write_text('{"state": "done"}')
    assert longest_first([[job] for job in jobs])[-1][0].name == "d64-steps200"


def test_runs_are_grouped_by_shape_and_capped(tmp_path) -> None:
    spec = tiny_spec(
        **{"model.d_model": [8, 16], "training.lr": [1e-3, 2e-3, 3e-3], "training.seed": [0]}
    )
    jobs = make_jobs(spec, tmp_path, workers=1, plan=None, retry_failed=False, cache_dir=None)
    names = [[job.name for job in group] for group in group_jobs(jobs, 2)]
    assert names == [
        ["d8-lr1e-3-s0", "d8-lr2e-3-s0"],
        ["d8-lr3e-3-s0"],
        ["d16-lr1e-3-s0", "d16-lr2e-3-s0"],
        ["d16-lr3e-3-s0"],
    ]
    assert [len(group) for group in group_jobs(jobs, 1)] == [1] * 6
    # Stacks only where they pay: on a GPU, not on a CPU.
    assert auto_group_size(jobs) == 1
    gpu = make_jobs(
        spec.model_copy(update={"set": {"training.device": "cuda"}}),
        tmp_path,
        workers=1,
        plan=None,
        retry_failed=False,
        cache_dir=None,
        check_machine=False,  # planned here, trained on a machine with a GPU
    )
    assert auto_group_size(gpu) == GPU_GROUP_SIZE > 1
    with pytest.raises(ConfigError, match="--group-size"):
        run_sweep(spec, tmp_path, group_size=0)


def test_a_grouped_sweep_equals_one_run_at_a_time(tmp_path, monkeypatch) -> None:
    from mecheval.training.stacking import group

    stacks = []
    original = group.GroupTrainer.run

    def counting_run(self, *args, **kwargs):
        stacks.append(len(self.members))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(group.GroupTrainer, "run", counting_run)
    spec = tiny_spec(**{"training.lr": [1e-3, 3e-3, 1e6]})
    plan = InterventionPlan(sites=("layers.0.input",), roles=("value",), n_docs=8)
    progress = []
    stacked = run_sweep(spec, tmp_path / "g", group_size=3, plan=plan, on_progress=progress.append)
    assert stacks == [3]  # one stack of all three, not three runs
    steps = [e for e in progress if isinstance(e, RunProgress)]
    assert {e.runs for e in steps} == {3}  # progress counts the stack's runs
    # Each run's outcome comes too, as its stack ends.
    assert sorted(e.name for e in progress if isinstance(e, Outcome)) == sorted(
        r.name for r in expand(spec)
    )
    single = run_sweep(spec, tmp_path / "s", group_size=1, plan=plan)
    assert stacks == [3]
    assert [(o.name, o.state) for o in stacked] == [(o.name, o.state) for o in single]
    assert stacked[2].state == "failed" and "diverged" in stacked[2].reason
    for o in single[:2]:
        a = load_results(tmp_path / "g" / "tiny").query(f"run == '{o.name}'")
        b = load_results(tmp_path / "s" / "tiny").query(f"run == '{o.name}'")
        assert len(a) == len(b) > 0
        assert (a["metric"].values == b["metric"].values).all()
        assert a["value"].to_numpy() == pytest.approx(b["value"].to_numpy(), rel=1e-4, abs=1e-5)
    # A rerun skips the stack's finished runs.
    assert all(o.skipped for o in run_sweep(spec, tmp_path / "g", group_size=3)[:2])


def test_a_sweep_resolves_each_run_once_and_trains_a_lone_run_alone(tmp_path, monkeypatch) -> None:
    """One resolution per run, where it is planned (each builds the model on the meta
    device); the worker, the run folder, the trainer and the interventions read the
    resolved record. A run with nothing to stack, on a CPU, goes to the single-run trainer."""
    from mecheval.training import config as config_module
    from mecheval.training.stacking import group

    resolved = []
    check_buildable = config_module.check_buildable

    def counting(model, length):
        resolved.append(model.architecture)
        return check_buildable(model, length)

    def no_stacking(*args, **kwargs):
        raise AssertionError("a lone run on a CPU was stacked")

    monkeypatch.setattr(config_module, "check_buildable", counting)
    monkeypatch.setattr(group, "GroupTrainer", no_stacking)
    spec = tiny_spec()
    plan = InterventionPlan(sites=("layers.0.input",), roles=("value",), n_docs=8)
    outcomes = run_sweep(spec, tmp_path, group_size=1, plan=plan)
    assert [(o.name, o.state) for o in outcomes] == [(r.name, "done") for r in expand(spec)]
    for o in outcomes:  # intervened, from the record
        assert (tmp_path / spec.name / o.name / "interventions.csv").is_file()
    assert len(resolved) == len(outcomes) == 2
