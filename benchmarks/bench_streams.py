"""Several stacks side by side on one GPU: do the stacks of a Fig. 3 column (one per
architecture, K = the LRs of a cell) train faster together, each on a CUDA stream of its own,
than one stack after another?

Why: at the paper's sizes a stack's replayed step keeps the card at a few per cent of its
matmul rate (docs/performance.md): its kernels are small and wait on each other. Kernels of
different streams can run at the same time, so stacks that share nothing may fill each
other's gaps. Both ways run the same stacks (``GroupTrainer.train_step``, each step replayed
as a CUDA graph) for the same number of steps, timed in the same run:

* ``one after another``: each stack's steps, then the next stack's, on the default stream;
* ``side by side``: step s of every stack, each stack on its own stream, then step s + 1.

Every stack is warmed up and captured first (one after another), so both timings replay.
The line printed per set: the stacks' model-steps/s each way and their ratio.

    python benchmarks/bench_streams.py --device cuda --widths 64 --group 7 --steps 40
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

import torch
from bench_training import configs, sync

from mecheval.models import ARCHITECTURES
from mecheval.tasks import build_datasets
from mecheval.training.stacking.group import GroupTrainer


def on_stream(stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager:
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def stacks(args: argparse.Namespace, d: int, folder: Path) -> list[GroupTrainer]:
    """One warmed-up, captured stack of K runs per architecture at width ``d``."""
    built = []
    for arch in args.arch:
        cfgs = configs(args, arch, d)
        data = build_datasets(cfgs[0].task)
        group = GroupTrainer(cfgs, data, [folder / f"{arch}{d}-{k}" for k in range(len(cfgs))])
        for _ in range(args.warmup):
            step(group)
        built.append(group)
    sync(args.device)
    return built


def step(group: GroupTrainer) -> None:
    group.train_step()
    group.step += 1


def one_after_another(groups: list[GroupTrainer], steps: int, device: str) -> float:
    sync(device)
    start = time.perf_counter()
    for group in groups:
        for _ in range(steps):
            step(group)
    sync(device)
    return time.perf_counter() - start


def side_by_side(groups: list[GroupTrainer], steps: int, device: str) -> float:
    cuda = device.startswith("cuda")
    streams = [torch.cuda.Stream() if cuda else None for _ in groups]
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        for group, stream in zip(groups, streams, strict=True):
            with on_stream(stream):
                step(group)
    sync(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="*", default=None, help="default: Fig. 3's seven")
    parser.add_argument("--widths", type=int, nargs="+", default=[64])
    parser.add_argument("--group", type=int, default=7, help="K runs per stack")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per stack")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (capture)")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run (no streams)")
    parser.add_argument("--vocab", type=int, default=8192, help="the paper's AR shape")
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    args.arch = args.arch or [
        a for a in ("attention", "baseconv", "based", "deltanet", "h3", "hyena", "mamba")
        if a in ARCHITECTURES
    ]  # fmt: skip
    card = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(
        f"{card}: stacks of K={args.group}, "
        f"{len(args.arch)} architectures, {args.steps} timed steps each; model-steps/s"
    )
    print(f"{'d':>4} {'stacks':>6} {'one after another':>18} {'side by side':>13} {'ratio':>6}")
    for d in args.widths:
        with tempfile.TemporaryDirectory() as tmp:
            groups = stacks(args, d, Path(tmp))
            # configs() gives each run warmup + steps batches: one pass each way fits
            half = args.steps // 2
            work = len(groups) * args.group * half
            apart = work / one_after_another(groups, half, args.device)
            together = work / side_by_side(groups, half, args.device)
            ratio = together / apart
            print(f"{d:>4} {len(groups):>6} {apart:>18,.0f} {together:>13,.0f} {ratio:>6.2f}")


if __name__ == "__main__":
    main()
