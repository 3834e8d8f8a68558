"""Project the paper-scale AR sweep's cost from a measured sample of training steps.

For every (architecture, width) of the paper's AR grid, one process builds the paper's model
(2 layers, vocabulary 8192, 16 pairs: T = 35, batch 32), times ``--steps`` full training
steps (forward, backward, AdamW) after a warm-up, and records its peak memory (RSS on the
CPU; ``torch.cuda.max_memory_allocated`` on CUDA). The projection multiplies the median step
by the steps of one run (100,032 documents / 32 x 16 epochs = 50,016) and by ``--lrs`` runs
per (architecture, width), and sets the total beside the paper's "< 10,000 GPU-hours, about
200 models per experiment at 0.5-5 GPU-hours each".

    python benchmarks/bench_paper_scale.py [--device cpu|cuda] [--steps 5] [--lrs 5]
        [--widths 16 32 64 128 256] [--arch mamba h3] [--threads 1] [--workers 2]

``--workers N`` also projects the wall time on N cores (one run per core, longest first, as
``reproduce --workers N`` schedules them): the larger of the thread-hours / N and the
longest run. The steps are timed one process at a time; runs side by side share the memory
bandwidth, and per-run evaluation (emergence tracking, interventions) is not counted.

Each configuration runs in its own process so that peak memory is its own.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

from mecheval.models import ARCHITECTURES, ModelConfig, build_model, count_parameters

VOCAB = 8192
PAIRS = 16
LENGTH = 2 * PAIRS + 3  # <bos> k v ... <div> q
BATCH = 32
STEPS_PER_RUN = 100_032 // BATCH * 16
PAPER_WIDTHS = [16, 32, 64, 128, 256]
PAPER_GPU_HOURS_PER_MODEL = (0.5, 5.0)


def measure_one(arch: str, d: int, steps: int, device: str) -> dict:
    """Median training-step time and peak memory of one (architecture, width)."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        architecture=arch, d_model=d, n_layers=2, vocab_size=VOCAB, max_len=LENGTH + 1
    )
    model = build_model(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    tokens = torch.randint(0, VOCAB, (BATCH, LENGTH), device=device)
    at = torch.full((BATCH,), LENGTH - 1, device=device)
    answer = torch.randint(0, VOCAB, (BATCH,), device=device)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(tokens, at=at), answer).backward()
        optimizer.step()

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    step()  # warm-up: allocator, kernels
    sync()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    if device == "cuda":
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:  # ru_maxrss is in KiB on Linux; the increase over the process before the model
        peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    return {
        "arch": arch,
        "d": d,
        "params": count_parameters(model),
        "step_s": statistics.median(times),
        "peak_mb": peak_mb,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lrs", type=int, default=5, help="runs per (architecture, width)")
    parser.add_argument("--widths", type=int, nargs="+", default=PAPER_WIDTHS)
    parser.add_argument("--arch", nargs="*", default=None, help="default: every architecture")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1, help="project the wall time on N cores")
    parser.add_argument("--one", nargs=2, metavar=("ARCH", "D"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), args.steps, args.device)))
        return
    archs = args.arch or sorted(ARCHITECTURES)
    unit = "GPU" if args.device == "cuda" else f"CPU ({args.threads} thread)"
    print(
        f"paper-scale AR: 2 layers, vocab {VOCAB}, T={LENGTH}, batch {BATCH}, "
        f"{STEPS_PER_RUN} steps/run, {args.lrs} runs per (arch, width); device {args.device}"
    )
    print("| architecture | d | params | ms/step | peak MB | h/run | h for the LRs |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    total_hours, n_runs, run_hours = 0.0, 0, []
    for arch in archs:
        for d in args.widths:
            command = [
                sys.executable,
                __file__,
                "--one",
                arch,
                str(d),
                "--steps",
                str(args.steps),
                "--device",
                args.device,
                "--threads",
                str(args.threads),
            ]
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            hours = row["step_s"] * STEPS_PER_RUN / 3600
            total_hours += hours * args.lrs
            n_runs += args.lrs
            run_hours += [hours] * args.lrs
            print(
                f"| {arch} | {d} | {row['params']:,} | {1000 * row['step_s']:.1f} | "
                f"{row['peak_mb']:.0f} | {hours:.2f} | {hours * args.lrs:.1f} |",
                flush=True,
            )
    low, high = (n_runs * h for h in PAPER_GPU_HOURS_PER_MODEL)
    print(
        f"\nprojected: {total_hours:,.1f} {unit}-hours for {n_runs} runs, one at a time "
        f"({total_hours / n_runs:.2f} h/run); the paper: {low:,.0f}-{high:,.0f} GPU-hours "
        f"for as many runs at 0.5-5 GPU-hours each; ratio to the paper's low end "
        f"{total_hours / low:.2f}x"
    )
    if args.workers > 1:
        print(
            f"on {args.workers} cores: {longest_first_makespan(run_hours, args.workers):,.1f} h "
            f"of wall time (longest run {max(run_hours):.2f} h)"
        )


def longest_first_makespan(hours: list[float], workers: int) -> float:
    """Wall time of runs handed longest first to whichever of ``workers`` frees first."""
    free = [0.0] * workers
    for h in sorted(hours, reverse=True):
        free[free.index(min(free))] += h
    return max(free)


if __name__ == "__main__":
    main()
