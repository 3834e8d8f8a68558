"""Interchange engine vs the naive loop (issue #5 "Speed").

All sites x all roles x N documents of the paper's AR task (8192-token vocabulary, 16 pairs)
for a 2-layer d = 64 model: the batched engine and a one-forward-per-(site, role, document)
loop, timed in the same run, with the largest difference between their numbers.

    python benchmarks/bench_interventions.py [--docs 320] [--naive-docs 320] [--run RUN_DIR]

With ``--naive-docs`` smaller than ``--docs`` the naive loop runs on that many documents and
its time is scaled linearly (the loop's cost is linear in documents), and the comparison of
numbers is made on those documents.
"""

from __future__ import annotations

import argparse
import time

import torch

from mecheval.interventions import interchange, naive_interchange
from mecheval.models import ModelConfig, build_model, site_names
from mecheval.tasks import ROLES, ARConfig, build_datasets, corrupt, vocab_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=320)
    parser.add_argument("--naive-docs", type=int, default=None)
    parser.add_argument("--arch", default="attention")
    parser.add_argument("--run", default=None, help="a trained run folder (default: fresh model)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    if args.run:
        from mecheval.training.folder import load_run

        cfg, model = load_run(args.run)
        task = cfg.task
    else:
        task = ARConfig(kind="ar", n_train=0, n_dev=args.docs, n_test=0)
        torch.manual_seed(0)
        model = build_model(
            ModelConfig(architecture=args.arch, d_model=64, vocab_size=vocab_size(task), max_len=40)
        ).eval()
    task = task.model_copy(update={"n_train": 0, "n_dev": args.docs})
    original = build_datasets(task)["dev"].batch(torch.arange(args.docs))
    corrupted = corrupt(original, task, seed=1)
    sites = site_names(model)
    print(
        f"{args.arch if not args.run else args.run}: {len(sites)} sites x {len(ROLES)} roles x "
        f"{args.docs} documents ({len(sites) * len(ROLES) * args.docs:,} interventions), "
        f"T={original.tokens.shape[1]}, {args.threads} thread(s)"
    )

    start = time.perf_counter()
    fast = interchange(model, original, corrupted)
    engine_s = time.perf_counter() - start

    n_naive = args.naive_docs or args.docs
    sub_o, sub_c = original.select(slice(0, n_naive)), corrupted.select(slice(0, n_naive))
    start = time.perf_counter()
    slow = naive_interchange(model, sub_o, sub_c)
    naive_s = (time.perf_counter() - start) * args.docs / n_naive

    check = fast if n_naive == args.docs else interchange(model, sub_o, sub_c)
    diff = (check.table.value - slow.table.value).abs().max()
    scaled = "" if n_naive == args.docs else f" (measured on {n_naive} docs, scaled)"
    print(f"engine     {engine_s:8.2f} s")
    print(f"naive loop {naive_s:8.2f} s{scaled}")
    print(f"speed-up   {naive_s / engine_s:8.1f}x")
    print(f"max |engine - naive| over {len(slow.table)} table values: {diff:.2e}")


if __name__ == "__main__":
    main()
