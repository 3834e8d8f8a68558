"""Interchange engine vs its baselines.

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

"work" is what the engine computes, in forward passes over the N documents: the positions
each block's mixer reads (rows x window length at ``layers.{i}.mixer.input``) over N x T x
layers, the original and corrupted runs included (2.0). pyvene batched runs about two
forward passes per site x role; an exact engine that must compute this much cannot beat it
by more than (2 x sites x roles) / work, however small its overheads.

    python benchmarks/bench_interventions.py [--docs 320] [--naive-docs 32]
        [--arch attention mamba ... | --run RUN_DIR ...] [--roles key value query] [--pyvene]

One line per baseline and model, then a table of all models (× = the baseline's time over
the engine's). Every model first runs one small untimed intervention (allocator, kernels).

With ``--naive-docs`` smaller than ``--docs`` the naive loop runs on that many documents and
its time is scaled linearly (the loop's cost is linear in documents), and the comparison of
numbers is made on those documents.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from mecheval.interventions import interchange, naive_interchange
from mecheval.models import ModelConfig, build_model, site_names
from mecheval.models.sites import get_site, layer_site
from mecheval.tasks import ROLES, ARConfig, build_datasets, corrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=320)
    parser.add_argument("--naive-docs", type=int, default=None)
    parser.add_argument("--arch", nargs="+", default=["attention"], help="fresh paper-scale models")
    parser.add_argument("--run", nargs="+", default=None, help="trained run folders instead")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--roles", nargs="*", default=None, help="default: every role")
    parser.add_argument("--pyvene", action="store_true", help="also time pyvene batched")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    summary = [measure(args, name, run) for name, run in models(args)]
    print("\n| model | T | work | engine s | whole rows s | × | pyvene s | × | naive s | × |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in summary:
        cells = [row["model"], str(row["T"]), f"{row['work']:.1f}", f"{row['engine']:.2f}"]
        for baseline in ("whole rows", "pyvene batched", "naive loop"):
            seconds = row.get(baseline)
            cells += (
                ["—", "—"]
                if seconds is None
                else [f"{seconds:.2f}", f"{seconds / row['engine']:.1f}"]
            )
        print("| " + " | ".join(cells) + " |")


def models(args: argparse.Namespace):
    """(name, run folder or None) per model to measure."""
    if args.run:
        return [(Path(run).name, run) for run in args.run]
    return [(arch, None) for arch in args.arch]


def measure(args: argparse.Namespace, name: str, run: str | None) -> dict:
    if run:
        from mecheval.training.folder import load_run

        cfg, model = load_run(run)
        task = cfg.task
    else:
        task = ARConfig(kind="ar", n_train=0, n_dev=args.docs, n_test=0)
        torch.manual_seed(0)
        model = build_model(
            ModelConfig(architecture=name, d_model=64, vocab_size=task.vocab_size(), max_len=40)
        ).eval()
    task = task.model_copy(update={"n_train": 0, "n_dev": args.docs})
    original = build_datasets(task)["dev"].batch(torch.arange(args.docs))
    corrupted = corrupt(original, task, seed=1)
    sites = site_names(model)
    roles = args.roles or [r for r in ROLES if r in original.roles]
    length = original.tokens.shape[1]
    print(
        f"\n{run or name}: {len(sites)} sites x {len(roles)} roles x "
        f"{args.docs} documents ({len(sites) * len(roles) * args.docs:,} interventions), "
        f"T={length}, {args.threads} thread(s)"
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

    warm = original.select(slice(0, 4)), corrupted.select(slice(0, 4))
    interchange(model, *warm, sites, roles)
    interchange(model, *warm, sites, roles, resume=False)
    if args.pyvene:  # the import and pyvene's first call are not part of its time either
        pyvene_batched(model, *warm, sites[:1], roles[:1])
    engine_s, fast = timed(lambda: interchange(model, original, corrupted, sites, roles))
    ours = restored(fast)
    work = forward_equivalents(model, original, corrupted, sites, roles)
    print(f"{'engine':<22} {engine_s:8.2f} s  work {work:.1f} forward passes")
    row = {"model": name, "T": length, "engine": engine_s, "work": work}

    def report(label: str, seconds: float, theirs: pd.Series, reference=ours, note="") -> None:
        diff = (reference - theirs.reindex(reference.index)).abs().max()
        row[label] = seconds
        print(
            f"{label:<22} {seconds:8.2f} s  engine {seconds / engine_s:6.1f}x faster  "
            f"max |diff| {diff:.1e}{note}"
        )

    whole_s, whole = timed(
        lambda: interchange(model, original, corrupted, sites, roles, resume=False)
    )
    report("whole rows", whole_s, restored(whole))
    if args.pyvene:
        pyvene_s, theirs = timed(lambda: pyvene_batched(model, original, corrupted, sites, roles))
        report("pyvene batched", pyvene_s, theirs)

    n_naive = args.naive_docs or args.docs
    sub_o, sub_c = original.select(slice(0, n_naive)), corrupted.select(slice(0, n_naive))
    naive_s, slow = timed(lambda: naive_interchange(model, sub_o, sub_c, sites, roles))
    naive_s *= args.docs / n_naive
    check = ours
    if n_naive != args.docs:
        check = restored(interchange(model, sub_o, sub_c, sites, roles))
    scaled = "" if n_naive == args.docs else f"  (run on {n_naive} docs, time scaled)"
    report("naive loop", naive_s, restored(slow), reference=check, note=scaled)
    return row


def forward_equivalents(model, original, corrupted, sites, roles) -> float:
    """The engine's work on these documents in forward passes (see the module doc), from an
    untimed run with a counting hook on every block's ``mixer.input`` site."""
    counted = [0]

    def count(module, inputs, output) -> None:
        counted[0] += output.shape[0] * output.shape[1]

    names = [layer_site(i, "mixer.input") for i in range(len(model.layers))]
    handles = [get_site(model, name).register_forward_hook(count) for name in names]
    try:
        interchange(model, original, corrupted, sites, roles)
    finally:
        for handle in handles:
            handle.remove()
    return counted[0] / (original.tokens.numel() * len(model.layers))


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
