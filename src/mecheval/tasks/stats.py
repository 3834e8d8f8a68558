"""Corpus statistics, as the paper's code logged them: lengths, tree shape, distances."""

from __future__ import annotations

import torch

from mecheval.tasks.dataset import TaskDataset


def summarise(values: torch.Tensor) -> dict[str, float]:
    v = values.double()
    if v.numel() == 0:
        return {"mean": float("nan"), "min": float("nan"), "median": float("nan"),
                "p90": float("nan"), "max": float("nan")}  # fmt: skip
    return {
        "mean": float(v.mean()),
        "min": float(v.min()),
        "median": float(v.quantile(0.5)),
        "p90": float(v.quantile(0.9)),
        "max": float(v.max()),
    }


def _tree_shape(ds: TaskDataset) -> tuple[list[int], list[float], list[float]]:
    """Per document: tree depth (edges on the longest root-leaf path), mean branching factor
    (children per terminal that has any) and share of yield positions whose terminal repeats."""
    assert ds.trees is not None
    depths, branching, repeated = [], [], []
    for i in range(len(ds)):
        par = ds.trees.parent_list(i)
        n = len(par)
        deepest = 0
        for j in range(n):
            # Walk up to the root; trees are shallow (at most d_max rule levels).
            d = 0
            while par[j] >= 0:
                j, d = par[j], d + 1
            deepest = max(deepest, d)
        depths.append(deepest)
        kids: dict[int, int] = {}
        for p in par:
            if p >= 0:
                kids[p] = kids.get(p, 0) + 1
        branching.append(sum(kids.values()) / len(kids) if kids else 0.0)
        ys = ds.tokens[i, 1 : 1 + n].tolist()
        counts: dict[int, int] = {}
        for t in ys:
            counts[t] = counts.get(t, 0) + 1
        repeated.append(sum(1 for t in ys if counts[t] > 1) / n)
    return depths, branching, repeated


def dataset_stats(ds: TaskDataset) -> dict[str, dict[str, float]]:
    """Statistic name -> summary (mean, min, median, p90, max) over the dataset's documents."""
    roles = ds.roles
    out = {
        "document length (tokens)": summarise(ds.lengths),
        "content length (symbols before <div>)": summarise(roles["divider"] - 1),
        "key-value distance": summarise((roles["value"] - roles["key"]).abs()),
        "key-query distance": summarise(roles["query"] - roles["key"]),
        "value-query distance": summarise(roles["query"] - roles["value"]),
    }
    if ds.trees is not None:
        depths, branching, repeated = _tree_shape(ds)
        out["tree depth (edges)"] = summarise(torch.tensor(depths))
        out["branching factor"] = summarise(torch.tensor(branching))
        out["share of non-unique terminals"] = summarise(torch.tensor(repeated))
        answer_is_query = (ds.answer == ds.tokens[torch.arange(len(ds)), roles["query"]]).double()
        out["answer equals query"] = summarise(answer_is_query)
    return out
