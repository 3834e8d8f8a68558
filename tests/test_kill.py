"""Stopping a `mecheval sweep --workers 2` every way a person or a scheduler does (kill -9 of
the main process alone, of one worker alone, of the whole process group; Ctrl-C), then running
it again: no process outlives the sweep, no temp or lock file is left after the rerun, and its
results table equals that of a sweep nobody interrupted. A second process that tries to train
a run folder another process is training is refused, naming the holder.

Timing-free, as test_signals.py: the runs block at a gate right after their checkpoint at
step 3 and the test waits for their marks before it signals.
"""

from __future__ import annotations

import os
import shlex
import signal
from pathlib import Path

import pandas as pd
import pytest
import yaml
from cli_processes import Program, run_command
from small_runs import SWEEP_BASE
from test_signals import finish, group_processes, marks, mecheval, temp_files, wait_for

from mecheval.experiments.grid import SweepSpec, load_sweep
from mecheval.experiments.runners import run_sweep
from mecheval.experiments.store import load_results
from mecheval.training import read_status

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="POSIX signals and /proc (Linux)"
)

SPEC = {
    "name": "s",
    "base": {**SWEEP_BASE, "training": {**SWEEP_BASE["training"], "checkpoint_every": 3}},
    "grid": {"training.lr": [1e-3, 2e-3, 3e-3]},
}
ARGS = ("sweep", "spec.yaml", "--out", "runs", "--workers", "2", "-q", "--no-interventions")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> pd.DataFrame:
    out = tmp_path_factory.mktemp("uninterrupted")
    outcomes = run_sweep(SweepSpec.model_validate(SPEC), out)
    assert [o.state for o in outcomes] == ["done"] * 3
    return load_results(out / "s")


def kill_main(process: Program, started: dict[str, int]) -> None:
    os.kill(process.pid, signal.SIGKILL)  # the workers are left without their parent


def kill_worker(process: Program, started: dict[str, int]) -> None:
    os.kill(min(started.values()), signal.SIGKILL)


def kill_group(process: Program, started: dict[str, int]) -> None:
    os.killpg(process.pid, signal.SIGKILL)


def ctrl_c(process: Program, started: dict[str, int]) -> None:
    os.killpg(process.pid, signal.SIGINT)  # as a terminal does, to the whole foreground job


@pytest.mark.slow
@pytest.mark.parametrize("stop", [kill_main, kill_worker, kill_group, ctrl_c])
def test_a_stopped_sweep_reruns_to_the_uninterrupted_results(
    tmp_path: Path, uninterrupted: pd.DataFrame, stop
) -> None:
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(SPEC))
    with mecheval(tmp_path, *ARGS, gate_step=3) as process:
        wait_for(lambda: len(marks(tmp_path)) == 2, "two runs at step 3", process)
        started = marks(tmp_path)
        stop(process, started)
        wait_for(lambda: process.poll() is not None, "the main process to end")
        # Orphans included: workers whose parent was killed end by themselves.
        wait_for(lambda: not group_processes(process.pid), "every process of the sweep to end")
        err = finish(process)
    assert "Traceback" not in err
    sweep = tmp_path / "runs" / "s"
    for name in started:
        assert read_status(sweep / name)["state"] != "done"
    # A process killed with -9 cannot remove its lock file (the kernel drops the lock itself).
    assert {p.name for p in temp_files(sweep)} <= {".lock"}

    outcomes = run_sweep(load_sweep(tmp_path / "spec.yaml"), tmp_path / "runs")
    assert [o.state for o in outcomes] == ["done"] * 3
    assert temp_files(sweep) == []  # the rerun took over the locks and removed them
    pd.testing.assert_frame_equal(load_results(sweep), uninterrupted)


def test_a_run_folder_being_trained_is_refused_to_a_second_process(tmp_path: Path) -> None:
    args = ["train", "--preset", "tiny", "--name", "t", "--out", "runs", "-q"]
    args += ["--set", "training.checkpoint_every=10", "--set", "training.threads=1"]
    with mecheval(tmp_path, *args, gate_step=10) as holder:
        wait_for(lambda: "t" in marks(tmp_path), "checkpoint at step 10", holder)
        before = (tmp_path / "runs" / "t" / "status.json").read_bytes()
        second = run_command(shlex.join(["mecheval", *args]), tmp_path)
        assert second.returncode == 2
        run = Path("runs", "t")
        assert second.stderr == (
            f"error: {run}: being trained by process {holder.pid}; wait for it to finish or "
            "stop it\n"
        )
        assert (tmp_path / "runs" / "t" / "status.json").read_bytes() == before
