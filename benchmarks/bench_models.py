"""Forward + backward time per architecture (and with bf16 autocast).

Times one training step's forward and backward (loss at the query position only, as training
computes it) for every registered architecture, and prints each one's time as a ratio
against attention measured in the same run. ``--bf16`` also times the same step under the
``training.precision: bf16`` autocast and prints the fp32/bf16 speed ratio (> 1: bf16 faster);
``--fused`` (CUDA, with ``mecheval[cuda]``) does the same for ``training.kernels: fused``, and
``--compile`` for ``training.compile`` (the first, compiling step is timed apart), and
``--pytorch-forms`` for the PyTorch forms of the C kernels (``MECHEVAL_NATIVE=0``, what runs
without a C compiler; models/native.py): the column is their time over the default's.

``--adamw`` adds the optimizer step, so a step is what training does (forward,
backward, AdamW). ``--flops`` counts each step's matrix arithmetic (matmuls, convolutions,
attention; ``torch.utils.flop_counter``, which does not count elementwise work such as a
scan's products) and prints it against the throughput of one large matmul measured at the
start of the same run: how far each architecture's step is from the hardware's limit, and
how much of it is not matrix arithmetic at all.

    python benchmarks/bench_models.py [--widths 64 256] [--batch 32] [--length 70] [--threads 1]
        [--device cpu|cuda] [--bf16] [--fused] [--compile] [--pytorch-forms] [--adamw] [--flops]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Iterator

import torch
from torch.utils.flop_counter import FlopCounterMode

from mecheval.models import ARCHITECTURES, ModelConfig, build_model, count_parameters, kernels
from mecheval.training.config import Precision
from mecheval.training.precision import autocast


def time_step(
    arch: str,
    d: int,
    args: argparse.Namespace,
    precision: Precision = "fp32",
    fused: bool = False,
    compiled: bool = False,
) -> tuple[float, int, int]:
    """(median seconds per step, parameters, matrix FLOPs of one step or 0 without --flops)."""
    torch.manual_seed(0)
    device = torch.device(args.device)
    cfg = ModelConfig(
        architecture=arch,
        d_model=d,
        n_layers=2,
        vocab_size=args.vocab,
        max_len=max(args.length, 64),
    )
    model = build_model(cfg).to(device)
    if compiled:
        torch._dynamo.reset()  # each model compiles afresh, never hitting the recompile limit
    forward = torch.compile(model) if compiled else model
    tokens = torch.randint(0, args.vocab, (args.batch, args.length), device=device)
    at = torch.full((args.batch,), args.length - 1, device=device)
    answer = torch.randint(0, args.vocab, (args.batch,), device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3) if args.adamw else None

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with autocast(precision, device), kernels.fused_kernels(fused):
            logits = forward(tokens, at=at)
        loss = torch.nn.functional.cross_entropy(logits.float(), answer)
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()

    start = time.perf_counter()
    step()  # warm-up: allocator, kernels, compilation
    warm_up = time.perf_counter() - start
    if compiled:
        print(f"  ({arch} d={d}: first compiled step {warm_up:.1f} s)", flush=True)
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    flops = 0
    if args.flops:
        with FlopCounterMode(display=False) as counter:
            step()
        flops = counter.get_total_flops()
    return statistics.median(times), count_parameters(model), flops


@contextlib.contextmanager
def pytorch_forms() -> Iterator[None]:
    """Within: the C kernels are off (models/native.py reads the switch at every call)."""
    saved = os.environ.get("MECHEVAL_NATIVE")
    os.environ["MECHEVAL_NATIVE"] = "0"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["MECHEVAL_NATIVE"]
        else:
            os.environ["MECHEVAL_NATIVE"] = saved


def matmul_throughput(device: str, size: int = 1024, repeats: int = 10) -> float:
    """FLOP/s of a [size, size] @ [size, size] float32 matmul on this device and thread count:
    the roof the --flops column is read against."""
    a, b = (torch.randn(size, size, device=device) for _ in range(2))
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        torch.mm(a, b)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=70)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true", help="also time bf16 autocast")
    parser.add_argument("--fused", action="store_true", help="also time the fused kernels")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    parser.add_argument(
        "--pytorch-forms", action="store_true", help="also time without the C kernels"
    )
    parser.add_argument("--adamw", action="store_true", help="include the AdamW step")
    parser.add_argument("--flops", action="store_true", help="matrix FLOPs against a matmul")
    parser.add_argument("--arch", nargs="*", default=None, help="default: every architecture")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    archs = args.arch or sorted(ARCHITECTURES)
    peak = matmul_throughput(args.device) if args.flops else 0.0
    print(
        f"forward+backward{' + AdamW' if args.adamw else ''}, 2 layers, B={args.batch}, "
        f"T={args.length}, vocab={args.vocab}, "
        f"{args.threads} thread(s), {args.device}, median of {args.repeats}"
    )
    if args.flops:
        print(f"matmul roof (1024 x 1024 x 1024, float32): {peak / 1e9:.1f} GFLOP/s")
    header = f"{'architecture':<12} {'d':>4} {'params':>10} {'ms/step':>9} {'x attention':>12}"
    header += f" {'GFLOP':>7} {'GFLOP/s':>8} {'% roof':>7}" if args.flops else ""
    header += f" {'bf16 ms':>9} {'fp32/bf16':>10}" if args.bf16 else ""
    header += f" {'fused ms':>9} {'ref/fused':>10}" if args.fused else ""
    header += f" {'comp. ms':>9} {'eager/comp':>10}" if args.compile else ""
    print(header + (f" {'PyTorch ms':>10} {'PyTorch/C':>10}" if args.pytorch_forms else ""))
    for d in args.widths:
        # The process's first steps run slower (allocator, caches, lazy init): a base timed
        # cold made every ratio look smaller, attention's own row down to 0.84.
        time_step("attention", d, args)
        base = time_step("attention", d, args)[0]
        for arch in archs:
            t, n, flops = time_step(arch, d, args)
            line = f"{arch:<12} {d:>4} {n:>10,} {t * 1e3:>9.2f} {t / base:>12.2f}"
            if args.flops:
                rate = flops / t
                line += f" {flops / 1e9:>7.3f} {rate / 1e9:>8.1f} {100 * rate / peak:>6.1f}%"
            if args.bf16:
                half = time_step(arch, d, args, "bf16")[0]
                line += f" {half * 1e3:>9.2f} {t / half:>10.2f}"
            if args.fused:
                fast = time_step(arch, d, args, fused=True)[0]
                line += f" {fast * 1e3:>9.2f} {t / fast:>10.2f}"
            if args.compile:
                comp = time_step(arch, d, args, compiled=True)[0]
                line += f" {comp * 1e3:>9.2f} {t / comp:>10.2f}"
            if args.pytorch_forms:
                with pytorch_forms():
                    plain = time_step(arch, d, args)[0]
                line += f" {plain * 1e3:>10.2f} {plain / t:>10.2f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
