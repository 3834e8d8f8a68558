"""Training throughput (model-steps/s) per architecture: one model at a time vs a vmapped
group of K (training/stacking/group.py), and a naive baseline with full-vocabulary logits
everywhere.

Ways to do the same optimizer steps of AR training, timed in the same run:

* ``naive``: one model at a time, logits at every position ([B, T, V]) and a cross-entropy
  masked to the answer (what a generic LM training loop computes);
* ``single``: one model at a time, each as a lone run trains: on a GPU a stack of one whose
  step is replayed as a CUDA graph (training/stacking/group.py), elsewhere the Trainer's own
  step (logits at the query only, ``metrics.answer_loss``);
* ``trainer``: one model at a time with the Trainer's own step, eagerly, on every device
  (only with ``--modes``; on a GPU, what a lone run's graph replaces);
* ``group``: the K models stacked and trained by ``GroupTrainer.train_step`` (one vmapped
  forward/backward, stacked AdamW, per-model clipping), each on its own data order; on a GPU
  its step is replayed as a CUDA graph (training/stacking/captured.py);
* ``eager``: the same stack with the graph off (``MECHEVAL_CUDA_GRAPH=0``), only with
  ``--modes``.

``--flops`` adds each architecture's matrix arithmetic per model-step
(``torch.utils.flop_counter``) and the rate the group reaches against a float32 matmul timed
on the same device in the same run (4096^3 on a GPU, 1024^3 on a CPU).

Ratios ``single/naive``, ``single/trainer`` and ``group/single`` are throughput ratios (> 1:
faster). The one-at-a-time ways time the first ``--alone`` of the K models (default: all). With
``--memory`` each way runs in a process of its own and its peak memory is printed too: the
growth of the process's peak RSS over its state before the first model (CPU), or
``torch.cuda.max_memory_allocated`` (CUDA), so a stack's cost in memory shows beside its
speed (what bounds ``--group-size`` on a GPU). Default sizes
take a couple of minutes on a 2-core CPU; ``--paper`` sets the paper's scale (d 64..256,
vocabulary 8192, 16 pairs, batch 32), which takes much longer. The last lines project the
paper's AR grid over the (architecture, width) pairs measured: ``--lrs`` runs each, every
run the paper preset's steps, trained one at a time vs in stacks of K.

    python benchmarks/bench_training.py [--arch attention mamba] [--widths 64] [--group 5]
    python benchmarks/bench_training.py --paper --widths 64 128 256 --steps 10 [--memory]
    python benchmarks/bench_training.py --paper --widths 64 --device cuda --group 7 \
        --modes single group eager --warmup 5 --flops
    python benchmarks/bench_training.py --paper --widths 64 --device cuda --group 49 \
        --alone 3 --modes single trainer group --steps 30 --warmup 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from bench_models import matmul_throughput
from torch.utils.flop_counter import FlopCounterMode

from mecheval.models import ARCHITECTURES, build_model, count_parameters
from mecheval.tasks import Batch, build_datasets
from mecheval.training import resolve, total_steps
from mecheval.training.config import RunConfig, config_from_data
from mecheval.training.presets import preset
from mecheval.training.stacking.captured import graphs_enabled
from mecheval.training.stacking.group import GroupTrainer
from mecheval.training.trainer import Trainer

LRS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2)  # the paper's LR grid spans these


def configs(args: argparse.Namespace, arch: str, d: int) -> list[RunConfig]:
    n_train = args.batch * (args.steps + args.warmup)
    data = {
        "task": {
            "kind": "ar",
            "n_keys": args.vocab // 2,
            "n_values": args.vocab // 2,
            "n_pairs": args.pairs,
            "n_train": n_train,
            "n_dev": args.batch,
            "n_test": args.batch,
        },
        "model": {"architecture": arch, "d_model": d, "n_layers": 2},
        "training": {"batch_size": args.batch, "steps": 1000, "device": args.device},
    }
    return [
        resolve(config_from_data(data, [f"training.lr={LRS[k % len(LRS)]}", f"training.seed={k}"]))
        for k in range(args.group)
    ]


def naive_step(trainer: Trainer, batch: Batch) -> None:
    """The Trainer's step, but with [B, T, V] logits and the loss masked to the answer."""
    model = trainer.model
    logits = model(batch.tokens)
    targets = torch.full_like(batch.tokens, -100)
    targets[torch.arange(len(batch)), batch.query] = batch.answer
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
    trainer.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    trainer.optimizer.step()
    trainer.scheduler.step()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_alone(cfgs, data, folder: Path, args) -> float:
    """Seconds for steps x len(cfgs) model-steps, each model as a lone run trains."""
    if not graphs_enabled(torch.device(args.device)):
        return time_one_at_a_time(cfgs, data, folder, args, naive=False)
    return sum(time_group([cfg], data, folder / f"a{k}", args) for k, cfg in enumerate(cfgs))


def time_one_at_a_time(cfgs, data, folder: Path, args, naive: bool) -> float:
    """Seconds for steps x len(cfgs) model-steps, one model after another, each with the
    Trainer's eager step (or the naive one)."""
    total = 0.0
    for k, cfg in enumerate(cfgs):
        trainer = Trainer(cfg, data, folder / f"{'n' if naive else 's'}{k}")
        for step in range(args.warmup + args.steps):
            batch = trainer.batch_at(step)
            if step == args.warmup:
                sync(args.device)
                start = time.perf_counter()
            if naive:
                naive_step(trainer, batch)
            else:
                trainer.train_step(batch)
            trainer.step += 1
        sync(args.device)
        total += time.perf_counter() - start
    return total


def time_group(cfgs, data, folder: Path, args, graph: bool = True) -> float:
    saved = os.environ.get("MECHEVAL_CUDA_GRAPH")
    os.environ["MECHEVAL_CUDA_GRAPH"] = "1" if graph else "0"
    try:
        group = GroupTrainer(cfgs, data, [folder / f"g{k}" for k in range(len(cfgs))])
    finally:
        if saved is None:
            del os.environ["MECHEVAL_CUDA_GRAPH"]
        else:
            os.environ["MECHEVAL_CUDA_GRAPH"] = saved
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            sync(args.device)
            start = time.perf_counter()
        group.train_step()
        group.step += 1
    sync(args.device)
    group.check()
    if len(group.live) != len(cfgs):
        raise RuntimeError("a group member diverged during the benchmark")
    return time.perf_counter() - start


def step_flops(cfg: RunConfig, data, folder: Path) -> int:
    """Matrix FLOPs of one model's training step (forward, backward; AdamW does none)."""
    trainer = Trainer(cfg, data, folder / "flops")
    batch = trainer.batch_at(0)
    with FlopCounterMode(display=False) as counter:
        trainer.train_step(batch)
    return counter.get_total_flops()


MODES = ("naive", "single", "trainer", "group", "eager")
ALONE = ("naive", "single", "trainer")  # the ways that train one model at a time


def measure(mode: str, arch: str, d: int, args: argparse.Namespace, folder: Path) -> dict:
    """Seconds for K x steps model-steps done ``mode``'s way, and the peak memory it took (MB;
    NaN unless ``args.memory``, as a shared process's peak says nothing of one way)."""
    cfgs = configs(args, arch, d)
    data = build_datasets(cfgs[0].task)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    if mode in ("group", "eager"):
        seconds = time_group(cfgs, data, folder, args, graph=mode == "group")
    elif mode == "single":
        seconds = time_alone(cfgs[: args.alone], data, folder, args)
    else:
        seconds = time_one_at_a_time(cfgs[: args.alone], data, folder, args, mode == "naive")
    peak_mb = float("nan")
    if args.memory and args.device.startswith("cuda"):
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    elif args.memory:  # ru_maxrss is in KiB on Linux
        peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    return {"seconds": seconds, "peak_mb": peak_mb}


def measure_apart(mode: str, arch: str, d: int, argv: list[str]) -> dict:
    """:func:`measure` in a fresh process of its own, so that the peak memory is its own."""
    command = [sys.executable, __file__, *argv, "--one", mode, arch, str(d)]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="*", default=None, help="default: every architecture")
    parser.add_argument("--widths", type=int, nargs="+", default=None, help="default: 64")
    parser.add_argument("--vocab", type=int, default=None, help="default: 1024 (paper 8192)")
    parser.add_argument("--pairs", type=int, default=None, help="default: 8 (paper 16)")
    parser.add_argument("--batch", type=int, default=None, help="default: 32, as in the paper")
    parser.add_argument("--group", type=int, default=5, help="K models per group")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model")
    parser.add_argument(
        "--alone", type=int, default=None, help="models timed one at a time (default: K)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lrs", type=int, default=5, help="runs per (architecture, width)")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive baseline")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=None, help="ways to time")
    parser.add_argument("--flops", action="store_true", help="matrix FLOPs and %% of a matmul")
    parser.add_argument(
        "--memory", action="store_true", help="each way in its own process, with its peak memory"
    )
    parser.add_argument("--one", nargs=3, metavar=("MODE", "ARCH", "D"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--paper", action="store_true", help="paper scale: widths 64 128 256, vocab 8192, ..."
    )
    args = parser.parse_args()
    paper = {"widths": [64, 128, 256], "vocab": 8192, "pairs": 16, "batch": 32}
    small = {"widths": [64], "vocab": 1024, "pairs": 8, "batch": 32}
    for key, value in (paper if args.paper else small).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    torch.set_num_threads(args.threads)
    if args.one:
        mode, arch, d = args.one
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(measure(mode, arch, int(d), args, Path(tmp))))
        return
    archs = args.arch or sorted(ARCHITECTURES)
    default = ("single", "group") if args.no_naive else ("naive", "single", "group")
    modes = args.modes or list(default)
    args.alone = min(args.alone or args.group, args.group)
    if "single" not in modes or "group" not in modes:
        parser.error("--modes: expected at least single and group")
    card = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(
        f"AR training, 2 layers, vocab={args.vocab}, {args.pairs} pairs, B={args.batch}, "
        f"K={args.group} ({args.alone} one at a time), {args.steps} timed steps per model, "
        f"{args.threads} thread(s), "
        f"{args.device} ({card}); throughput in model-steps/s"
        + ("; peak memory in MB, each way in its own process" if args.memory else "")
    )
    roof = 0.0
    if args.flops:
        size = 4096 if args.device.startswith("cuda") else 1024
        roof = matmul_throughput(args.device, size)
        print(f"float32 matmul {size}^3 on this device: {roof / 1e9:,.0f} GFLOP/s")
    # (title, width) of each column after architecture, d and parameters
    columns = [(m, 8) for m in modes] + [("group/single", 13)]
    columns += [("single/naive", 13)] if "naive" in modes else []
    columns += [("single/trainer", 15)] if "trainer" in modes else []
    columns += [("graph/eager", 12)] if "eager" in modes else []
    columns += [("MFLOP", 8), ("% matmul", 9)] if args.flops else []
    columns += [(f"MB {m}", 10) for m in modes] if args.memory else []

    def line(first: str, cells: list[str]) -> str:
        return first + "".join(f" {c:>{w}}" for c, (_, w) in zip(cells, columns, strict=True))

    print(line(f"{'architecture':<15} {'d':>4} {'params':>10}", [t for t, _ in columns]))
    seconds = {"single": 0.0, "group": 0.0}  # the projected grid, one way and the other
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for d in args.widths:
            for arch in archs:
                if args.memory:
                    rows = {m: measure_apart(m, arch, d, sys.argv[1:]) for m in modes}
                else:
                    rows = {m: measure(m, arch, d, args, folder) for m in modes}
                speed = {
                    m: (args.alone if m in ALONE else args.group) * args.steps / rows[m]["seconds"]
                    for m in modes
                }
                single, group = speed["single"], speed["group"]
                cfg = configs(args, arch, d)[0]
                n = count_parameters(build_model(cfg.model))
                cells = [f"{speed[m]:.1f}" for m in modes] + [f"{group / single:.2f}"]
                if "naive" in modes:
                    cells.append(f"{single / speed['naive']:.2f}")
                if "trainer" in modes:
                    cells.append(f"{single / speed['trainer']:.2f}")
                if "eager" in modes:
                    cells.append(f"{group / speed['eager']:.2f}")
                if args.flops:
                    flops = step_flops(cfg, build_datasets(cfg.task), folder)
                    cells += [f"{flops / 1e6:.0f}", f"{100 * flops * group / roof:.2f}"]
                if args.memory:
                    cells += [f"{rows[m]['peak_mb']:.0f}" for m in modes]
                print(line(f"{arch:<15} {d:>4} {n:>10,}", cells), flush=True)
                work_per_shape = args.lrs * total_steps(
                    config_from_data(preset("paper", "ar", arch))
                )
                seconds["single"] += work_per_shape / single
                seconds["group"] += work_per_shape / group
    unit = "GPU" if args.device.startswith("cuda") else f"CPU-thread ({args.threads} thread)"
    print(
        f"paper AR grid over these {len(archs) * len(args.widths)} (architecture, width) pairs "
        f"x {args.lrs} LRs, projected {unit}-hours: one at a time "
        f"{seconds['single'] / 3600:.1f}, stacked K={args.group} {seconds['group'] / 3600:.1f}"
        + ("" if args.paper else " (measured at the small sizes: use --paper)")
    )


if __name__ == "__main__":
    main()
