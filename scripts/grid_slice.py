"""One slice of an experiment's grid, run within a time limit and brought back small.

A card is lent in short slices (one command there runs at most 10 minutes, and only a few tens
of MB come back), so a paper grid runs in pieces: each piece a `mecheval reproduce` of some
architectures, widths and LRs. This runs one piece into a working folder, stops it at
``--seconds`` if it is still going (its unfinished runs then read as interrupted), and copies every
run's small files (config, status, metrics, interventions, emergence, mechanism, provenance:
everything but the weights, the checkpoint and the lock) under ``--dest``, where `mecheval
results` and `mecheval report` merge the pieces of many machines (docs/sweeps.md).

    . .gpu/env.sh && python scripts/grid_slice.py --archs mamba --widths 128 --dest $OUT/slices
    mecheval report slice-a/ar-paper slice-b/ar-paper --html      # back here, the pieces merged
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from mecheval.training.folder import CHECKPOINT_DIR, CONFIG_FILE, LOCK_FILE, MODEL_FILE

#: What stays behind: the weights, the resumable checkpoint and the lock.
LEFT_BEHIND = {MODEL_FILE, CHECKPOINT_DIR, LOCK_FILE}


def reproduce_command(args: argparse.Namespace) -> list[str]:
    """The `mecheval reproduce` command line of the slice."""
    command = [sys.executable, "-c", "from mecheval.cli import main; main()"]
    command += ["reproduce", args.experiment]
    command += ["--preset", args.preset, "--device", args.device, "--out", str(args.work)]
    command += ["--workers", str(args.workers), "-q"]
    for option in ("archs", "widths", "lrs", "seeds"):
        value = getattr(args, option)
        if value:
            command += [f"--{option}", value]
    for override in args.set:
        command += ["--set", override]
    return command


def run_within(command: list[str], seconds: float) -> tuple[int | None, float]:
    """Run ``command``; past ``seconds``, stop it with SIGTERM, which a sweep takes as Ctrl-C
    (what it was training is recorded as interrupted; SIGINT would not reach a command started
    in the background, which ignores it), and kill it 30 s later. (exit status, None if it
    was stopped; wall seconds)."""
    start = time.monotonic()
    process = subprocess.Popen(command)
    try:
        return process.wait(timeout=seconds), time.monotonic() - start
    except subprocess.TimeoutExpired:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        return None, time.monotonic() - start


def copy_small_files(work: Path, dest: Path) -> list[Path]:
    """Every run folder under ``work`` (a folder with a config.yaml) into the same place under
    ``dest``, without :data:`LEFT_BEHIND`. Returns the run folders copied (under ``dest``)."""
    copied = []
    for config in sorted(work.rglob(CONFIG_FILE)):
        run = config.parent
        target = dest / run.relative_to(work)
        target.mkdir(parents=True, exist_ok=True)
        for item in run.iterdir():
            if item.name not in LEFT_BEHIND and item.is_file():
                shutil.copy2(item, target / item.name)
        copied.append(target)
    return copied


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="ar")
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--archs", help="as reproduce's --archs")
    parser.add_argument("--widths", help="as reproduce's --widths")
    parser.add_argument("--lrs", help="as reproduce's --lrs")
    parser.add_argument("--seeds", help="as reproduce's --seeds")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="as reproduce's --set"
    )
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=540.0, help="stop the slice after")
    parser.add_argument("--work", type=Path, default=Path("/tmp/grid-slice"))
    parser.add_argument("--dest", type=Path, required=True, help="where the small files go")
    args = parser.parse_args()
    command = reproduce_command(args)
    print("$ mecheval", " ".join(command[3:]), flush=True)
    status, seconds = run_within(command, args.seconds)
    runs = copy_small_files(args.work, args.dest)
    ending = f"exit {status}" if status is not None else f"stopped at {args.seconds:.0f} s"
    print(f"{ending} after {seconds:.0f} s; {len(runs)} runs' small files under {args.dest}")
    return 0 if status == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
