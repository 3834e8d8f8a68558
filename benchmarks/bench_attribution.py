"""The gradient estimators (attribution patching of p and of log p, with AtP*'s attention
fix, integrated gradients)
against the exact interchange engine: time and agreement, on the same documents, in the
same run.

For each architecture, a fresh model at a preset's AR shape (``--preset quick``: d = 64, the
quick task; ``paper``: d = 64, the paper's task, 8192-token vocabulary, T = 35), every
module site x every role of N test documents (``--docs``, default the preset's test
split), timed after one small untimed call of each method (allocator, kernels), the
fastest of ``--repeats``:

* ``exact``: interventions/engine.py's ``interchange``;
* ``attribution``: one forward of the original, one forward and backward of the corrupted
  documents;
* ``integrated-gradients``: ``--steps`` forwards and backwards on the embedding path;
* ``attribution-log``: attribution's passes, its readout log p(answer);
* ``attribution-qk``: ``attribution-log``'s, and at each attention layer's input a
  vector-Jacobian product through its pattern and the pattern recomputed per cell.

Each line gives the seconds, the exact engine's time over the method's (x: how much faster
the estimate is) and the largest difference of restored likelihood per (site, role) cell.
A fresh model answers at chance, so its differences are small; the grading of trained
models is ``mecheval reproduce attribution``'s.

    python benchmarks/bench_attribution.py [--preset quick|paper] [--arch mamba ...]
        [--docs N] [--steps 5] [--threads 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import pandas as pd
import torch

from mecheval.interventions import attribution_patching, interchange
from mecheval.interventions.attribution import METHODS
from mecheval.interventions.grading import cell_values
from mecheval.models import build_model
from mecheval.models.registry import BUILTIN_ARCHITECTURES
from mecheval.tasks import build_datasets, corrupt
from mecheval.training.config import config_from_data, resolve
from mecheval.training.presets import preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=["quick", "paper"], default="quick")
    parser.add_argument("--arch", nargs="+", default=list(BUILTIN_ARCHITECTURES))
    parser.add_argument("--docs", type=int, default=None, help="default: the test split")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="the fastest of these is kept")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [measure(args, arch) for arch in args.arch]
    heads = "".join(f" | {method} s | x | max diff" for method in METHODS)
    print(f"\n| architecture | T | docs | exact s{heads} |")
    print("|---|---:|---:|---:" + "|---:|---:|---:" * len(METHODS) + "|")
    for row in rows:
        cells = [row["arch"], str(row["T"]), str(row["docs"]), f"{row['exact']:.2f}"]
        for method in METHODS:
            seconds = row[method]
            cells += [
                f"{seconds:.2f}",
                f"{row['exact'] / seconds:.1f}",
                f"{row[method + ' diff']:.3f}",
            ]
        print("| " + " | ".join(cells) + " |")


def measure(args: argparse.Namespace, arch: str) -> dict:
    cfg = resolve(config_from_data(preset(args.preset, "ar", arch)))
    task = cfg.task.model_copy(update={"n_train": 0})
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    test = build_datasets(task)["test"]
    n = args.docs or len(test)
    original = test.batch(torch.arange(n))
    corrupted = corrupt(original, task, seed=1)
    print(f"\n{arch}: {args.preset} shape, T={original.tokens.shape[1]}, {n} documents")

    methods = {"exact": lambda o, c: interchange(model, o, c)}
    for method in METHODS:
        methods[method] = partial(attribution_patching, model, method=method, steps=args.steps)
    warm = original.select(slice(0, 4)), corrupted.select(slice(0, 4))
    row: dict = {"arch": arch, "T": original.tokens.shape[1], "docs": n}
    cells: dict[str, pd.Series] = {}
    for name, run in methods.items():
        run(*warm)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            result = run(original, corrupted)
            times.append(time.perf_counter() - start)
        row[name] = min(times)
        cells[name] = cell_values(result)
        if name == "exact":
            print(f"{name:<22} {row[name]:8.2f} s")
            continue
        row[f"{name} diff"] = float((cells[name] - cells["exact"]).abs().max())
        print(
            f"{name:<22} {row[name]:8.2f} s  {row['exact'] / row[name]:6.1f}x faster than exact  "
            f"max |diff| {row[f'{name} diff']:.3f}"
        )
    return row


if __name__ == "__main__":
    main()
