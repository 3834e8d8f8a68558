"""Groups side by side in one process (training/turns.py,
experiments/execution/side_by_side.py): the threads take turns one step at a time, their runs
equal one worker's byte for byte, an interrupt reaches every thread, and a sweep on one CUDA
device takes this road."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from small_runs import SWEEP_BASE

from mecheval.experiments import runners
from mecheval.experiments.execution import pool, side_by_side
from mecheval.experiments.execution.jobs import RunProgress
from mecheval.experiments.execution.scheduling import group_jobs
from mecheval.experiments.grid import SweepSpec
from mecheval.experiments.mechanisms import InterventionPlan
from mecheval.training import turns
from mecheval.training.folder import peek_status


def _threads_taking_turns(steps: int, baton: turns.Baton, log: list[str]) -> list[threading.Thread]:
    def work() -> None:
        try:
            baton.take()
            for _ in range(steps):
                log.append(threading.current_thread().name)
                turns.pass_turn()
        except KeyboardInterrupt:
            log.append(f"{threading.current_thread().name} stopped")
        finally:
            baton.give()

    return [threading.Thread(target=work, name=name) for name in "abc"]


def _wait_for_line(baton: turns.Baton, length: int) -> None:
    deadline = time.monotonic() + 30
    while len(baton._line) < length:
        assert time.monotonic() < deadline, "the threads never queued"
        time.sleep(0.001)


def test_threads_holding_a_baton_take_turns_one_step_each_in_a_fixed_order() -> None:
    baton, log = turns.Baton(), []
    threads = _threads_taking_turns(4, baton, log)
    baton.take()  # hold it until all three wait in line
    for thread in threads:
        thread.start()
    _wait_for_line(baton, 3)
    baton.give()
    for thread in threads:
        thread.join(30)
    first = log[:3]
    assert sorted(first) == ["a", "b", "c"]
    assert log == first * 4  # round robin: nobody runs twice while another waits


def test_pass_turn_goes_on_at_once_alone_and_does_nothing_without_a_baton() -> None:
    turns.pass_turn()  # this thread holds no baton
    baton = turns.Baton()
    baton.take()
    baton.pass_on()  # nobody waits: still the holder
    assert baton._holder == threading.get_ident()
    baton.give()
    assert baton._holder is None


def test_a_stop_reaches_every_waiting_thread_once_it_has_the_baton() -> None:
    baton, log = turns.Baton(), []
    threads = _threads_taking_turns(100, baton, log)
    baton.take()
    for thread in threads:
        thread.start()
    _wait_for_line(baton, 3)
    baton.stop = KeyboardInterrupt
    baton.give()
    for thread in threads:
        thread.join(30)
    assert sorted(log) == ["a stopped", "b stopped", "c stopped"]


def _files(root: Path, name: str) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob(name))
    }


SPEC = SweepSpec(
    name="s",
    base={**SWEEP_BASE, "training": {**SWEEP_BASE["training"], "steps": 24}},
    grid={"model.architecture": ["attention", "mamba", "hyena"], "training.lr": [1e-3, 3e-3]},
)


def test_groups_side_by_side_train_what_one_worker_trains_byte_for_byte(
    tmp_path: Path, monkeypatch
) -> None:
    plan = InterventionPlan(n_docs=4, during_training=True)
    alone = runners.run_sweep(SPEC, tmp_path / "alone", plan=plan, group_size=2)

    turns_taken: list[str] = []
    original = turns.Baton.pass_on

    def pass_on(self):
        if self._line:  # a real hand-over: another thread waits
            turns_taken.append(threading.current_thread().name)
        return original(self)

    monkeypatch.setattr(turns.Baton, "pass_on", pass_on)
    jobs = runners.make_jobs(SPEC, tmp_path / "side", 3, plan, False, None)
    groups = group_jobs(jobs, 2)
    assert [len(g) for g in groups] == [2, 2, 2]
    events = []
    results = side_by_side.run_side_by_side(groups, 3, events.append)

    outcomes = [o for group in results for o in group]
    assert [(o.name, o.state, o.label) for o in outcomes] == [
        (o.name, o.state, o.label) for o in alone
    ]
    assert all(o.state == "done" for o in outcomes)
    assert _files(tmp_path / "alone", "model.safetensors") == _files(
        tmp_path / "side", "model.safetensors"
    )
    assert len(_files(tmp_path / "side", "model.safetensors")) == 6
    assert _files(tmp_path / "alone", "interventions.csv") == _files(
        tmp_path / "side", "interventions.csv"
    )
    # The stacks did train in turns: every thread handed over, many times, in the middle.
    assert len(set(turns_taken)) == 3 and len(turns_taken) >= 3 * 20
    # Every run's progress and outcome reached the callback.
    assert {e.name for e in events if not isinstance(e, RunProgress)} == {o.name for o in alone}


def test_single_runs_side_by_side_hand_on_after_each_step_too(tmp_path, monkeypatch) -> None:
    # Groups of one run train with the single-run Trainer, which hands the baton on as well.
    spec = SweepSpec(
        name="one", base=SPEC.base, grid={"model.architecture": ["attention", "mamba"]}
    )
    alone = runners.run_sweep(spec, tmp_path / "alone", group_size=1)
    holders: list[str] = []
    original = turns.Baton.pass_on

    def pass_on(self):
        holders.append(threading.current_thread().name)
        return original(self)

    monkeypatch.setattr(turns.Baton, "pass_on", pass_on)
    jobs = runners.make_jobs(spec, tmp_path / "side", 2, None, False, None)
    results = side_by_side.run_side_by_side(group_jobs(jobs, 1), 2)
    assert [(o.name, o.state) for g in results for o in g] == [(o.name, "done") for o in alone]
    assert _files(tmp_path / "alone", "model.safetensors") == _files(
        tmp_path / "side", "model.safetensors"
    )
    # Each run's 24 steps hand on, then each thread once more after its group.
    assert sorted(holders.count(name) for name in set(holders)) == [25, 25]


@pytest.mark.parametrize("signals", [1, 2])
def test_an_interrupt_stops_every_thread_with_its_runs_resumable(
    tmp_path, monkeypatch, signals: int
) -> None:
    # Two signals: `timeout` sends SIGTERM to the command and then to its process group. The
    # second arrives while the threads are still stopping; the sweep must wait for them.
    from mecheval.training.stacking import group_trainer

    original = group_trainer.GroupTrainer.train_step

    def train_step(self) -> None:
        if self.cfgs[0].model.architecture == "mamba" and self.step == 5:
            for _ in range(signals):
                os.kill(os.getpid(), signal.SIGTERM)  # handled in the sweep's thread
                time.sleep(0.3)  # let it: this thread's next turn then stops
        original(self)

    monkeypatch.setattr(group_trainer.GroupTrainer, "train_step", train_step)
    jobs = runners.make_jobs(SPEC, tmp_path, 2, None, False, None)
    # (Not default_int_handler: a shell's background job starts Python with SIGINT ignored.)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(pool.Terminated), pool.stop_on_sigterm():
        side_by_side.run_side_by_side(group_jobs(jobs, 2), 2)
    states = [peek_status(Path(job.run_dir)) for job in jobs]
    # Both threads' stacks (attention's, mamba's) stopped and said how; hyena's never started.
    assert [s and (s["state"], s["reason"]) for s in states] == [
        ("failed", "crashed: interrupted (SIGTERM)")
    ] * 4 + [None, None]
    # The handlers in place before are back.
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_sweep_on_one_cuda_device_runs_its_workers_side_by_side(tmp_path, monkeypatch) -> None:
    jobs = runners.make_jobs(SPEC, tmp_path, 2, None, False, None)
    assert not side_by_side.on_one_gpu(jobs)
    for job in jobs[1:]:
        job.config["training"]["device"] = "cuda:0"
    assert not side_by_side.on_one_gpu(jobs)  # a CPU run among them: worker processes
    jobs[0].config["training"]["device"] = "cuda:0"
    assert side_by_side.on_one_gpu(jobs)
    called = []

    def run_side_by_side(groups, workers, on_progress):
        called.append((len(groups), workers))
        return [[] for _ in groups]

    monkeypatch.setattr(pool, "run_side_by_side", run_side_by_side)
    monkeypatch.setattr(pool, "in_job_order", lambda jobs, groups, results: results)
    pool.run_local(jobs, 2, None, 2)
    assert called == [(3, 2)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_stacks_side_by_side_on_streams_equal_one_worker(tmp_path) -> None:
    base = {**SPEC.base, "training": {**SPEC.base["training"], "device": "cuda"}}
    spec = SweepSpec(name="c", base=base, grid=SPEC.grid)
    alone = runners.run_sweep(spec, tmp_path / "alone", group_size=2)
    side = runners.run_sweep(spec, tmp_path / "side", group_size=2, workers=3)
    assert [(o.name, o.state) for o in side] == [(o.name, o.state) for o in alone]
    assert all(o.state == "done" for o in side)
    assert _files(tmp_path / "alone", "model.safetensors") == _files(
        tmp_path / "side", "model.safetensors"
    )


def test_lone_runs_on_one_card_train_one_after_another(tmp_path, monkeypatch) -> None:
    """A sweep of lone runs on one card, where their steps replay, runs them in this
    process one after another (side by side they would train eagerly), whatever --workers;
    stacks among them keep the threads."""
    jobs = runners.make_jobs(SPEC, tmp_path, 2, None, False, None)
    for job in jobs:
        job.config["training"]["device"] = "cuda:0"
    executed, beside = [], []

    def execute_group(group, sink):
        executed.append([job.name for job in group])
        return []

    def run_side_by_side(groups, workers, on_progress):
        beside.append((len(groups), workers))
        return [[] for _ in groups]

    monkeypatch.setattr(pool, "execute_group", execute_group)
    monkeypatch.setattr(pool, "run_side_by_side", run_side_by_side)
    monkeypatch.setattr(pool, "in_job_order", lambda jobs, groups, results: results)
    monkeypatch.setattr(pool, "graphs_enabled", lambda device: True)
    pool.run_local(jobs, 3, None, 1)
    assert executed == [[job.name] for job in jobs] and beside == []
    pool.run_local(jobs, 3, None, 2)  # stacks of two: side by side
    assert beside == [(3, 3)]
    monkeypatch.setattr(pool, "graphs_enabled", lambda device: False)  # MECHEVAL_CUDA_GRAPH=0
    executed.clear()
    pool.run_local(jobs, 3, None, 1)
    assert executed == [] and beside == [(3, 3), (6, 3)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_more_stacks_than_threads_equal_one_worker(tmp_path) -> None:
    """Threads that each train several captured stacks in turn (a graph freed and another
    captured while the other threads' graphs replay) leave what one worker leaves."""
    base = {**SPEC.base, "training": {**SPEC.base["training"], "device": "cuda"}}
    spec = SweepSpec(name="c", base=base, grid=SPEC.grid)
    alone = runners.run_sweep(spec, tmp_path / "alone", group_size=2)
    side = runners.run_sweep(spec, tmp_path / "side", group_size=2, workers=2)
    assert [(o.name, o.state) for o in side] == [(o.name, o.state) for o in alone]
    assert _files(tmp_path / "alone", "model.safetensors") == _files(
        tmp_path / "side", "model.safetensors"
    )
