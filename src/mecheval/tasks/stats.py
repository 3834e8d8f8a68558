"""Corpus statistics, as the paper's code logged them: lengths, role distances, and what the
task adds (ATR: tree shape)."""

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


def dataset_stats(ds: TaskDataset) -> dict[str, dict[str, float]]:
    """Statistic name -> summary (mean, min, median, p90, max) over the dataset's documents."""
    roles = ds.roles
    values = {"document length (tokens)": ds.lengths}
    if "divider" in roles:
        values["content length (symbols before <div>)"] = roles["divider"] - 1
    if "value" in roles:  # stacked MQAR's value shares its key's position: no value role
        values["key-value distance"] = (roles["value"] - roles["key"]).abs()
    values["key-query distance"] = roles["query"] - roles["key"]
    if "value" in roles:
        values["value-query distance"] = roles["query"] - roles["value"]
    values.update(ds.cfg.stats(ds))
    return {name: summarise(v) for name, v in values.items()}
