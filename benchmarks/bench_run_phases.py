"""Where a sweep's wall time goes: training steps, reading the losses back, evaluations,
the emergence restores at each evaluation, the final interventions, and the rest (building
data and models, probing and capturing a stack, writing files, the report).

Runs ``mecheval reproduce EXPERIMENT`` in this process with ``--workers 1`` (the sweep then
trains in this process, so its phases can be timed) and prints each phase's seconds and share.
Each phase's time is its own (a phase called inside another is subtracted from the outer
one); on a GPU the device is synchronised at each phase's ends, so the kernels a phase
launched count to it (which costs a little speed: the total is printed beside the plain
command's, run first in the same process unless ``--no-plain``, so it also pays the first
run's costs: imports, building the task's documents into their cache).

    python benchmarks/bench_run_phases.py ar --preset quick --device cuda
    python benchmarks/bench_run_phases.py ar --preset tiny --archs attention,mamba
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from mecheval.experiments import mechanisms
from mecheval.training.stacking.group_trainer import GroupTrainer
from mecheval.training.trainer import Trainer


class PhaseClock:
    """Seconds per phase, each phase's own (nested phases subtracted)."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.own: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._nested: list[float] = []  # time spent in inner phases, per open phase

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def wrap(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.sync()
            start = time.perf_counter()
            self._nested.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                self.sync()
                spent = time.perf_counter() - start
                inner = self._nested.pop()
                self.own[phase] += spent - inner
                self.calls[phase] += 1
                if self._nested:
                    self._nested[-1] += spent

        return timed


#: (phase, owner, attribute): what each phase times
PHASES = (
    ("training steps", Trainer, "train_step"),
    ("training steps", GroupTrainer, "train_step"),
    ("loss reads", GroupTrainer, "check"),
    ("evaluations", Trainer, "evaluate_now"),
    ("emergence restores", mechanisms.EmergenceCallback, "__call__"),
    ("final interventions", mechanisms, "intervene_run"),
)


def reproduce(argv: list[str]) -> float:
    """Seconds for ``mecheval reproduce ARGV`` (a fresh output folder), in this process."""
    from mecheval.cli import main

    with tempfile.TemporaryDirectory() as out:
        sys.argv = ["mecheval", "reproduce", *argv, "--workers", "1", "-q", "--out", out]
        start = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # its tables
                main()
        except SystemExit as done:
            if done.code not in (0, None):
                raise
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--archs", default=None)
    parser.add_argument("--no-plain", action="store_true", help="skip the untimed-phases run")
    args = parser.parse_args()
    argv = [args.experiment, "--preset", args.preset, "--device", args.device]
    argv += ["--archs", args.archs] if args.archs else []
    card = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"mecheval reproduce {' '.join(argv)} --workers 1 on {args.device} ({card})")
    plain = None if args.no_plain else reproduce(argv)
    clock = PhaseClock(args.device)
    for phase, owner, name in PHASES:
        setattr(owner, name, clock.wrap(phase, getattr(owner, name)))
    total = reproduce(argv)
    if plain is not None:
        print(f"plain command, first: {plain:.1f} s; then with its phases timed: {total:.1f} s")
    rest = total - sum(clock.own.values())
    print(f"{'phase':<22} {'calls':>7} {'seconds':>9} {'share':>7}")
    for phase in dict.fromkeys(p for p, _, _ in PHASES):
        own = clock.own.get(phase, 0.0)
        print(f"{phase:<22} {clock.calls.get(phase, 0):>7} {own:>9.2f} {own / total:>7.1%}")
    print(f"{'the rest':<22} {'':>7} {rest:>9.2f} {rest / total:>7.1%}")


if __name__ == "__main__":
    main()
