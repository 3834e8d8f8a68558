"""Interchange engine vs its baselines (issue #5 "Speed", issue #17).

All sites x the chosen roles x N documents of the paper's AR task (8192-token vocabulary, 16
pairs) for a 2-layer d = 64 model, or of a trained run's task (``--run``), timed in the same
run against:

* the engine recomputing whole sequences after a patch (``interchange(resume=False)``, the
  engine before prefix resumption);
* pyvene batched (``--pyvene``, needs ``mecheval[interop]``): one pyvene call per site x role
  over all documents, the strongest plain use of an independent library;
* the naive loop: one patched forward per (site, role, document) plus its source forward.

Each line gives the time, the engine's speed-up over it, and the largest difference between
its numbers and the engine's (restored likelihood per site x role).

    python benchmarks/bench_interventions.py [--docs 320] [--naive-docs 32] [--run RUN_DIR]
        [--arch mamba] [--roles key value query] [--pyvene]

With ``--naive-docs`` smaller than ``--docs`` the naive loop runs on that many documents and
its time is scaled linearly (the loop's cost is linear in documents), and the comparison of
numbers is made on those documents.
"""

from __future__ import annotations

import argparse
import time

import pandas as pd
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
    parser.add_argument("--roles", nargs="*", default=None, help="default: every role")
    parser.add_argument("--pyvene", action="store_true", help="also time pyvene batched")
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
    roles = args.roles or [r for r in ROLES if r in original.roles]
    print(
        f"{args.arch if not args.run else args.run}: {len(sites)} sites x {len(roles)} roles x "
        f"{args.docs} documents ({len(sites) * len(roles) * args.docs:,} interventions), "
        f"T={original.tokens.shape[1]}, {args.threads} thread(s)"
    )

    def restored(result) -> pd.Series:
        rows = result.table[
            (result.table.condition == "restored") & (result.table.metric == "likelihood")
        ]
        return rows.set_index(["site", "role"]).value

    def timed(run):
        start = time.perf_counter()
        out = run()
        return time.perf_counter() - start, out

    engine_s, fast = timed(lambda: interchange(model, original, corrupted, sites, roles))
    ours = restored(fast)
    print(f"{'engine':<22} {engine_s:8.2f} s")

    def report(name: str, seconds: float, theirs: pd.Series, reference=ours, note="") -> None:
        diff = (reference - theirs.reindex(reference.index)).abs().max()
        print(
            f"{name:<22} {seconds:8.2f} s  engine {seconds / engine_s:6.1f}x faster  "
            f"max |diff| {diff:.1e}{note}"
        )

    whole_s, whole = timed(
        lambda: interchange(model, original, corrupted, sites, roles, resume=False)
    )
    report("engine, whole rows", whole_s, restored(whole))
    if args.pyvene:
        pyvene_s, theirs = timed(lambda: pyvene_batched(model, original, corrupted, sites, roles))
        report("pyvene batched", pyvene_s, theirs)

    n_naive = args.naive_docs or args.docs
    sub_o, sub_c = original.select(slice(0, n_naive)), corrupted.select(slice(0, n_naive))
    naive_s, slow = timed(lambda: naive_interchange(model, sub_o, sub_c, sites, roles))
    naive_s *= args.docs / n_naive
    check = (
        ours if n_naive == args.docs else restored(interchange(model, sub_o, sub_c, sites, roles))
    )
    scaled = "" if n_naive == args.docs else f"  (run on {n_naive} docs, time scaled)"
    report("naive loop", naive_s, restored(slow), reference=check, note=scaled)


def pyvene_batched(model, original, corrupted, sites, roles) -> pd.Series:
    """Mean restored likelihood per (site, role) with one pyvene call per site x role over
    every document (docs/interop.md's recipe)."""
    import pyvene as pv

    values = {}
    for site in sites:
        intervenable = pv.IntervenableModel(
            {
                "component": f"{site}.output",
                "unit": "pos",
                "intervention": pv.VanillaIntervention(),
            },
            model=model,
        )
        for role in roles:
            source = [[[p] for p in original.roles[role].tolist()]]
            base = [[[p] for p in corrupted.roles[role].tolist()]]
            with torch.no_grad():
                _, logits = intervenable(
                    base={"tokens": corrupted.tokens, "at": corrupted.query},
                    sources=[{"tokens": original.tokens, "at": original.query}],
                    unit_locations={"sources->base": (source, base)},
                )
            logp = torch.log_softmax(logits.double(), dim=-1)
            values[(site, role)] = logp.gather(1, original.answer[:, None]).exp().mean().item()
    return pd.Series(values)


if __name__ == "__main__":
    main()
