"""Ctrl-C (SIGINT) and SIGTERM during `mecheval train` and `mecheval sweep --workers 2`: no
traceback, a non-zero exit, runs marked failed ("crashed: interrupted") and resumable, no temp
files, no process left behind. kill -9 is test_experiments.py::test_kill_9_mid_sweep_*.

No test here waits on the clock. The CLI loads GATE through its own --plugin option: right
after the checkpoint at step $GATE_STEP (of run $GATE_RUN, or of every run) a run leaves a mark
in $GATE_MARKS and blocks. The tests wait for those marks, then signal: the signal always lands
in a run that has a checkpoint and is not done, however slow the machine. Every wait polls a
condition; its deadline is only a safety net against a hang, never an assertion on time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
import yaml
from cli_processes import Program, group_processes

from mecheval.experiments.grid import load_sweep
from mecheval.experiments.runners import run_sweep
from mecheval.io import read_json
from mecheval.training import read_status, train
from mecheval.training.config import load_config
from mecheval.training.trainer import Trainer

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="POSIX signals and /proc (Linux)"
)

#: Generous: two busy cores may take a while to start Python and import torch.
DEADLINE_S = 300.0

GATE = """
import os
import time
from pathlib import Path

from mecheval.training import trainer

_save = trainer.save_checkpoint


def gated_save(folder, step, *args, **kwargs):
    path = _save(folder, step, *args, **kwargs)
    run = Path(folder).parent.name
    if step == int(os.environ["GATE_STEP"]) and os.environ.get("GATE_RUN", run) == run:
        marks = Path(os.environ["GATE_MARKS"])
        marks.mkdir(exist_ok=True)
        (marks / f".{run}").write_text(str(os.getpid()))
        os.replace(marks / f".{run}", marks / run)  # the mark is whole when it appears
        while True:
            time.sleep(1)
    return path


trainer.save_checkpoint = gated_save
"""


@contextmanager
def mecheval(
    cwd: Path, *args: str, gate_step: int, gate_run: str | None = None
) -> Iterator[Program]:
    """`mecheval --plugin GATE ARGS` in its own process group (killed at exit if still there),
    forked from the tests' command server (tests/cli_processes.py) rather than a new
    interpreter that imports torch again."""
    (cwd / "gate.py").write_text(GATE)
    env = {**os.environ, "GATE_STEP": str(gate_step), "GATE_MARKS": str(cwd / "marks")}
    if gate_run is not None:
        env["GATE_RUN"] = gate_run
    process = Program(["--plugin", "gate.py", *args], cwd, env)
    try:
        yield process
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


def wait_for(condition: Callable[[], object], what: str, process: Program | None = None) -> None:
    """Poll ``condition``; fail if ``process`` exits first, or at the safety-net deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if process is not None and process.poll() is not None:
            _, err = process.communicate()
            pytest.fail(f"mecheval exited ({process.returncode}) before {what}:\n{err}")
        if time.monotonic() > deadline:  # a safety net against a hang, not a timing check
            pytest.fail(f"no {what} after {DEADLINE_S:.0f} s")
        time.sleep(0.05)


def finish(process: Program) -> str:
    """Wait for ``process`` to exit (safety-net deadline); return its stderr."""
    try:
        return process.communicate(timeout=DEADLINE_S)[1]
    except subprocess.TimeoutExpired:
        pytest.fail(f"mecheval (or a child holding its output) still running {DEADLINE_S:.0f} s on")


def marks(cwd: Path) -> dict[str, int]:
    """The runs that reached the gate, and the PIDs of the processes blocked in them."""
    folder = cwd / "marks"
    if not folder.is_dir():
        return {}
    return {p.name: int(p.read_text()) for p in folder.iterdir() if not p.name.startswith(".")}


def temp_files(folder: Path) -> list[Path]:
    """Leftovers of atomic writes (mecheval.io writes ``.<name>.<random>.tmp`` then renames)."""
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".")]


def spy_resumes(monkeypatch) -> dict[str, int | None]:
    """Record, per run folder name, the step each Trainer resumed from (None: from scratch)."""
    resumed: dict[str, int | None] = {}
    real = Trainer.resume

    def resume(self: Trainer) -> bool:
        did = real(self)
        resumed[self.run_dir.name] = self.step if did else None
        return did

    monkeypatch.setattr(Trainer, "resume", resume)
    return resumed


def send(process: Program, signum: int) -> None:
    if signum == signal.SIGINT:
        os.killpg(process.pid, signum)  # Ctrl-C: the terminal signals the whole foreground job
    else:
        os.kill(process.pid, signum)  # `kill PID`, a job scheduler: the main process alone


CASES = [
    pytest.param(signal.SIGINT, "crashed: interrupted", id="SIGINT"),
    pytest.param(signal.SIGTERM, "crashed: interrupted (SIGTERM)", id="SIGTERM"),
]


@pytest.mark.parametrize(("signum", "reason"), CASES)
def test_signal_during_train(tmp_path: Path, signum: int, reason: str) -> None:
    args = ["train", "--preset", "tiny", "--name", "t", "--out", "runs", "-q"]
    args += ["--set", "training.eval_every=10", "--set", "training.checkpoint_every=10"]
    args += ["--set", "training.threads=1"]
    run = tmp_path / "runs" / "t"
    with mecheval(tmp_path, *args, gate_step=10) as process:
        wait_for(lambda: "t" in marks(tmp_path), "checkpoint at step 10", process)
        send(process, signum)
        err = finish(process)
    assert process.returncode == 128 + signum  # 130 for Ctrl-C, 143 for SIGTERM
    assert err == f"interrupted: {Path('runs', 't')} at step 10; run again to resume\n"
    status = read_status(run)
    assert status["state"] == "failed" and status["reason"] == reason and status["step"] == 10
    assert read_json(run / "checkpoint" / "state.json")["step"] == 10
    assert temp_files(run) == []
    assert group_processes(process.pid) == []

    # The rerun resumes from the checkpoint: no evaluation at steps 0 and 10, which a run from
    # scratch would make first (tiny: 40 steps; evaluations every 10, as set above).
    evaluated: list[int] = []
    status = train(
        load_config(run / "config.yaml"),
        run,
        callbacks=[lambda step, model, run_dir: evaluated.append(step)],
    )
    assert status["state"] == "done" and status["step"] == 40
    assert evaluated == [20, 30, 40]


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "reason"), CASES)
def test_signal_during_sweep_with_two_workers(
    tmp_path: Path, monkeypatch, signum: int, reason: str
) -> None:
    spec = {
        "name": "s",
        "base": {
            "task": {"kind": "ar", "n_keys": 8, "n_values": 8, "n_pairs": 2, "n_train": 64}
            | {"n_dev": 16, "n_test": 16},
            "model": {"architecture": "attention", "d_model": 16, "n_layers": 1},
            "training": {"steps": 12, "batch_size": 8, "eval_every": 3, "threads": 1},
        },
        "grid": {"training.lr": [1e-3, 2e-3, 3e-3]},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    args = ["sweep", "spec.yaml", "--out", "runs", "--workers", "2", "-q", "--no-interventions"]
    sweep = tmp_path / "runs" / "s"
    with mecheval(tmp_path, *args, gate_step=3) as process:
        # Both workers hold a run past its first checkpoint; the third run waits in the queue.
        wait_for(lambda: len(marks(tmp_path)) == 2, "two runs at step 3", process)
        started = marks(tmp_path)
        everyone = group_processes(process.pid)  # the CLI, its workers, its helper processes
        assert set(started.values()) <= set(everyone)
        send(process, signum)
        err = finish(process)
        # No orphans: the workers (and the manager, the resource tracker) end with the sweep.
        wait_for(lambda: not group_processes(process.pid), "end of every child")
    assert process.returncode == 128 + signum  # 130 for Ctrl-C, 143 for SIGTERM
    queued = ({"lr1e-3", "lr2e-3", "lr3e-3"} - set(started)).pop()
    # One line, from the main process only (no traceback from any): what stopped, how to resume.
    stopped = ", ".join(sorted(started))
    resume = "run the same command again to resume"
    assert err == f"interrupted: {Path('runs', 's')}: {stopped}; {resume}\n"
    for name in started:
        status = read_status(sweep / name)
        assert status["state"] == "failed" and status["reason"] == reason
        assert read_json(sweep / name / "checkpoint" / "state.json")["step"] == 3
    assert not (sweep / queued).exists()  # an interrupted sweep starts no more runs
    assert temp_files(sweep) == []

    resumed = spy_resumes(monkeypatch)
    outcomes = run_sweep(load_sweep(tmp_path / "spec.yaml"), tmp_path / "runs")
    assert [o.state for o in outcomes] == ["done", "done", "done"]
    assert resumed == {**{name: 3 for name in started}, queued: None}
