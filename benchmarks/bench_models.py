"""Forward + backward time per architecture on the CPU (issue #3 "Speed").

Times one training step's forward and backward (loss at the query position only, as training
computes it) for every registered architecture, and prints each one's time as a ratio
against attention measured in the same run.

    python benchmarks/bench_models.py [--widths 64 256] [--batch 32] [--length 70] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mecheval.models import ARCHITECTURES, ModelConfig, build_model, count_parameters


def time_step(
    arch: str, d: int, batch: int, length: int, vocab: int, repeats: int
) -> tuple[float, int]:
    torch.manual_seed(0)
    cfg = ModelConfig(
        architecture=arch, d_model=d, n_layers=2, vocab_size=vocab, max_len=max(length, 64)
    )
    model = build_model(cfg)
    tokens = torch.randint(0, vocab, (batch, length))
    at = torch.full((batch,), length - 1)
    answer = torch.randint(0, vocab, (batch,))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(tokens, at=at), answer)
        loss.backward()

    step()  # warm-up: allocator, kernels
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times), count_parameters(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=70)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--arch", nargs="*", default=None, help="default: every architecture")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    archs = args.arch or sorted(ARCHITECTURES)
    print(
        f"forward+backward, 2 layers, B={args.batch}, T={args.length}, vocab={args.vocab}, "
        f"{args.threads} thread(s), median of {args.repeats}"
    )
    print(f"{'architecture':<12} {'d':>4} {'params':>10} {'ms/step':>9} {'x attention':>12}")
    for d in args.widths:
        base, _ = time_step("attention", d, args.batch, args.length, args.vocab, args.repeats)
        for arch in archs:
            t, n = time_step(arch, d, args.batch, args.length, args.vocab, args.repeats)
            print(f"{arch:<12} {d:>4} {n:>10,} {t * 1e3:>9.2f} {t / base:>12.2f}")


if __name__ == "__main__":
    main()
