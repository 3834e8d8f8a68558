"""Where a stacked training step's time goes: the kernels of K stacked models' step, per
architecture, with their counts and device time per step.

A replayed step (a CUDA graph) costs about the sum of its kernels' device times, so this
table says which kernels to fuse or remove first. The step is profiled eagerly
(``MECHEVAL_CUDA_GRAPH=0``: inside a replay the profiler sees one graph launch, not its
kernels), after ``--warmup`` untimed steps, over ``--steps`` steps. On a CPU it lists aten
operators by their own CPU time instead.

    python benchmarks/profile_step.py --paper --device cuda --arch h3 gla --group 49
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch
from bench_training import configs
from torch.profiler import ProfilerActivity, profile

from mecheval.tasks import build_datasets
from mecheval.training.stacking.group import GroupTrainer

#: Operators that launch no kernel of their own (views, shape queries): left out on a CPU.
NO_KERNEL = {
    "aten::" + name
    for name in [
        "as_strided",
        "view",
        "resolve_conj",
        "resolve_neg",
        "empty",
        "empty_strided",
        "_reshape_alias",
        "expand",
        "t",
        "transpose",
        "permute",
        "unsqueeze",
        "squeeze",
        "slice",
        "select",
        "detach",
        "alias",
        "unbind",
        "reshape",
        "_unsafe_view",
        "split",
        "narrow",
        "empty_like",
        "unflatten",
        "flatten",
        "lift_fresh",
        "split_with_sizes",
        "movedim",
        "diagonal",
        "contiguous",
        "result_type",
        "item",
        "_local_scalar_dense",
    ]
}


def profile_group(arch: str, d: int, args: argparse.Namespace, folder: Path) -> list[tuple]:
    """(name, calls per step, device microseconds per step) of every kernel (CUDA) or operator
    (CPU) of the stack's step, the most time first."""
    cfgs = configs(args, arch, d)
    data = build_datasets(cfgs[0].task)
    os.environ["MECHEVAL_CUDA_GRAPH"] = "0"
    group = GroupTrainer(cfgs, data, [folder / f"{arch}{k}" for k in range(len(cfgs))])
    for _ in range(args.warmup):
        group.train_step()
        group.step += 1
    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            group.train_step()
            group.step += 1
        if cuda:
            torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        if cuda:
            if event.device_type.name != "CUDA":
                continue
            micros = event.self_device_time_total
        else:
            if not event.key.startswith("aten::") or event.key in NO_KERNEL:
                continue
            micros = event.self_cpu_time_total
        rows.append((event.key, event.count / args.steps, micros / args.steps))
    return sorted(rows, key=lambda row: -row[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", nargs="+", default=["h3", "gla", "deltanet", "attention"])
    parser.add_argument("--widths", type=int, nargs="+", default=[64])
    parser.add_argument("--group", type=int, default=7, help="K models in the stack")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--top", type=int, default=8, help="kernels listed per architecture")
    parser.add_argument("--paper", action="store_true", help="vocabulary 8192, 16 pairs")
    args = parser.parse_args()
    args.vocab, args.pairs = (8192, 16) if args.paper else (1024, 8)
    args.batch = 32
    if args.device == "cpu":
        torch.set_num_threads(1)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    unit, clock = ("kernels", "device") if args.device.startswith("cuda") else ("operators", "CPU")
    print(f"{where}: stack of {args.group}, batch {args.batch}, per step ({unit}, microseconds)")
    with tempfile.TemporaryDirectory() as tmp:
        for d in args.widths:
            for arch in args.arch:
                rows = profile_group(arch, d, args, Path(tmp))
                calls = sum(row[1] for row in rows)
                micros = sum(row[2] for row in rows)
                print(f"\n{arch} d={d}: {calls:.0f} {unit}, {micros:,.0f} us of {clock} time")
                for name, count, us in rows[: args.top]:
                    print(f"  {us:9,.0f} us {100 * us / micros:5.1f} %  x{count:<5.0f} {name[:90]}")


if __name__ == "__main__":
    main()
