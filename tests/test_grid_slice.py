"""scripts/grid_slice.py, how a piece of a paper grid comes back from a card: only a run's small
files are copied (never its weights, checkpoint or lock), a slice past its time is stopped as
Ctrl-C stops a sweep, and the copied folder is a sweep folder that `mecheval results` reads."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from small_runs import run_cli

from mecheval.training.folder import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    LOCK_FILE,
    METRICS_FILE,
    MODEL_FILE,
    STATUS_FILE,
)

ROOT = Path(__file__).resolve().parents[1]


def grid_slice():
    spec = importlib.util.spec_from_file_location("grid_slice", ROOT / "scripts" / "grid_slice.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_the_small_files_of_each_run_are_copied(tmp_path) -> None:
    work, dest = tmp_path / "work", tmp_path / "dest"
    for name in ("mamba-d128-lr1e-3", "hyena-d128-lr1e-3"):
        run = work / "ar-paper" / name
        (run / CHECKPOINT_DIR).mkdir(parents=True)
        (run / CHECKPOINT_DIR / "state.pt").write_text("big")
        for file in (CONFIG_FILE, STATUS_FILE, METRICS_FILE, MODEL_FILE, LOCK_FILE):
            (run / file).write_text(f"{name} {file}")
    (work / "ar-paper" / "report").mkdir()
    (work / "ar-paper" / "report" / "fig.png").write_text("not a run")

    copied = grid_slice().copy_small_files(work, dest)

    assert [p.relative_to(dest).as_posix() for p in copied] == [
        "ar-paper/hyena-d128-lr1e-3",
        "ar-paper/mamba-d128-lr1e-3",
    ]
    for run in copied:
        assert sorted(p.name for p in run.iterdir()) == sorted(
            [CONFIG_FILE, METRICS_FILE, STATUS_FILE]
        )
        assert (run / STATUS_FILE).read_text() == f"{run.name} {STATUS_FILE}"
    assert not (dest / "ar-paper" / "report").exists()


def test_a_slice_past_its_time_is_stopped_and_a_finished_one_gives_its_status() -> None:
    module = grid_slice()
    status, _ = module.run_within([sys.executable, "-c", "import time; time.sleep(60)"], 0.5)
    assert status is None
    status, _ = module.run_within([sys.executable, "-c", "raise SystemExit(3)"], 30)
    assert status == 3


def test_the_slice_reaches_reproduce_with_its_options() -> None:
    module = grid_slice()
    args = module.argparse.Namespace(
        experiment="ar", preset="paper", device="cuda", archs="mamba,hyena", widths="128",
        lrs=None, seeds="0", workers=2, work=Path("/tmp/w"), set=["model.mixer.num_heads=4"],
    )  # fmt: skip
    command = module.reproduce_command(args)
    assert command[3:] == [
        "reproduce", "ar", "--preset", "paper", "--device", "cuda", "--out", "/tmp/w",
        "--workers", "2", "-q", "--archs", "mamba,hyena", "--widths", "128", "--seeds", "0",
        "--set", "model.mixer.num_heads=4",
    ]  # fmt: skip


@pytest.mark.slow
def test_a_tiny_slice_comes_back_as_a_sweep_folder_results_reads(
    tmp_path, monkeypatch, capsys
) -> None:
    script = ROOT / "scripts" / "grid_slice.py"
    work, dest = tmp_path / "work", tmp_path / "dest"
    argv = ["--preset", "tiny", "--device", "cpu", "--archs", "attention", "--widths", "16"]
    done = subprocess.run(
        [sys.executable, str(script), *argv, "--work", str(work), "--dest", str(dest)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 runs' small files under" in done.stdout
    run = dest / "ar-tiny" / "attention"
    assert (run / "mechanism.json").is_file() and not (run / MODEL_FILE).exists()
    assert (work / "ar-tiny" / "attention" / MODEL_FILE).is_file()
    code, table, _ = run_cli(
        monkeypatch, capsys, "results", str(dest / "ar-tiny"), "--format", "csv"
    )
    assert code == 0 and table.splitlines()[1].startswith("attention,done,")
