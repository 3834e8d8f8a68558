"""How fast could a stacked training step go without its host work? One stacked AR step
(GroupTrainer's vmapped forward and backward, per-model clipping, AdamW) rewritten with every
per-model number on the device, timed eager and replayed as one captured CUDA graph.

This measures the ceiling of the CUDA-graph lever before it is wired into the trainer: the
eager rewrite is checked here against ``GroupTrainer.train_step`` (same parameters after
``--check`` steps, float32 tolerance) on any device; the capture and its replay need CUDA.
Model-steps/s = K x steps / seconds; each line names the card.

    python benchmarks/bench_graph_step.py --device cuda --group 7 49 [--arch mamba attention]
    python benchmarks/bench_graph_step.py --device cpu --group 3 --arch attention --check 3
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from bench_training import configs

from mecheval.models import ARCHITECTURES
from mecheval.tasks import build_datasets
from mecheval.training.group import GroupTrainer


class DeviceStep:
    """GroupTrainer's step on static tensors: learning rates, clip limits and the step count
    live on the device, so one call launches kernels only (no host round trip)."""

    def __init__(self, group: GroupTrainer) -> None:
        self.group = group
        device = group.device
        members = group.members
        lrs = [
            [m.optimizer.param_groups[g]["lr"] for m in members]
            for g in range(len(members[0].optimizer.param_groups))
        ]
        self.lr = torch.tensor(lrs, dtype=torch.float32, device=device)  # [G, K]
        self.decay = 1 - self.lr * group.optimizer.weight_decay.to(self.lr)
        limits = [m.t.grad_clip or float("inf") for m in members]
        self.limit = torch.tensor(limits, dtype=torch.float32, device=device)
        self.count = torch.zeros((), dtype=torch.float32, device=device)
        batches = [m.batch_at(0) for m in members]
        self.tokens = torch.stack([b.tokens for b in batches])
        self.query = torch.stack([b.query for b in batches])
        self.answer = torch.stack([b.answer for b in batches])
        self.losses = torch.zeros(len(members), device=device)

    def __call__(self) -> None:
        g, opt = self.group, self.group.optimizer
        grads, losses = g._grad_fn(g.params, g.buffers, self.tokens, self.query, self.answer)
        self.losses.copy_(losses)
        norms = torch.stack([torch.linalg.vector_norm(x.flatten(1), dim=1) for x in grads.values()])
        total = torch.linalg.vector_norm(norms, dim=0)
        coef = (self.limit / (total + 1e-6)).clamp(max=1.0)
        self.count.add_(1)
        beta1, beta2 = opt.betas
        step_size = self.lr / (1 - beta1**self.count)  # [G, K]
        bias2_sqrt = (1 - beta2**self.count).sqrt()
        with torch.no_grad():
            for name, p in g.params.items():
                k = opt.group_of[name]
                shape = (p.shape[0],) + (1,) * (p.dim() - 1)
                grad = grads[name] * coef.view(shape)
                m, v = opt.exp_avg[name], opt.exp_avg_sq[name]
                p.mul_(self.decay[k].view(shape))
                m.lerp_(grad, 1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                p.sub_(m / (v.sqrt() / bias2_sqrt + opt.eps) * step_size[k].view(shape))


def at_peak(group: GroupTrainer) -> GroupTrainer:
    """Every member at its peak LR, held there (step 0 of the warm-up has LR 0, which would
    leave the parameters unchanged and the check below empty)."""
    for m in group.members:
        for param_group in m.optimizer.param_groups:
            param_group["lr"] = param_group["initial_lr"]
        m.scheduler.step = lambda: None
    return group


def seconds(fn, steps: int, device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def check(arch: str, k: int, args: argparse.Namespace, folder: Path) -> float:
    """Largest parameter difference after ``args.check`` steps: DeviceStep vs train_step,
    both from the same models, on the same first batch."""
    cfgs = configs(args, arch, args.width)[:k]
    data = build_datasets(cfgs[0].task)
    reference = at_peak(GroupTrainer(cfgs, data, [folder / f"r{j}" for j in range(k)]))
    for m in reference.members:  # every step on the first batch, as ours
        first = m.batch_at(0)
        m.batch_at = lambda step, first=first: first
    ours = DeviceStep(at_peak(GroupTrainer(cfgs, data, [folder / f"o{j}" for j in range(k)])))
    before = {n: p.clone() for n, p in ours.group.params.items()}
    for _ in range(args.check):
        reference.train_step()
        reference.step += 1
        ours()
    moved = max((ours.group.params[n] - before[n]).abs().max().item() for n in before)
    if moved == 0:
        raise RuntimeError("the parameters did not move: nothing was compared")
    return max(
        (reference.params[n] - ours.group.params[n]).abs().max().item() for n in reference.params
    )


def measure(arch: str, k: int, args: argparse.Namespace, folder: Path) -> str:
    cfgs = configs(args, arch, args.width)[:k]
    data = build_datasets(cfgs[0].task)
    step = DeviceStep(at_peak(GroupTrainer(cfgs, data, [folder / f"g{j}" for j in range(k)])))
    for _ in range(3):
        step()
    eager = seconds(step, args.steps, args.device)
    line = f"{arch:<15} {k:>3} {k * args.steps / eager:>10.0f}"
    if not args.device.startswith("cuda"):
        return line + f" {'-':>10} {'-':>8}"
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    replay = seconds(graph.replay, args.steps, args.device)
    if not torch.isfinite(step.losses).all():
        raise RuntimeError("non-finite loss after replay")
    return line + f" {k * args.steps / replay:>10.0f} {eager / replay:>8.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="*", default=None, help="default: every architecture")
    parser.add_argument("--group", type=int, nargs="+", default=[7, 49], help="K per stack")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--check", type=int, default=0, help="steps compared to train_step")
    args = parser.parse_args()
    # The paper's AR shape; configs() reads these as bench_training's --paper sets them.
    args.vocab, args.pairs, args.batch, args.warmup = 8192, 16, 32, 3
    groups, args.group = args.group, max(args.group)
    card = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"AR step at d={args.width}, vocab 8192, 16 pairs, B=32 on {card}; model-steps/s")
    print(f"{'architecture':<15} {'K':>3} {'eager':>10} {'graph':>10} {'ratio':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.arch or sorted(ARCHITECTURES):
            for k in groups:
                try:
                    if args.check:
                        diff = check(arch, k, args, Path(tmp))
                        print(f"{arch:<15} {k:>3} max |param diff| vs train_step: {diff:.2e}")
                    print(measure(arch, k, args, Path(tmp)), flush=True)
                except Exception as err:  # noqa: BLE001 - one architecture's failure is a row
                    print(f"{arch:<15} {k:>3} failed: {str(err).splitlines()[0][:120]}")


if __name__ == "__main__":
    main()
