"""Summaries of an interchange table: the paper's Fig. 3-style view, and its intervals."""

from __future__ import annotations

import pandas as pd

from mecheval.interventions.intervals import BOOTSTRAP, Bootstrap, restore_intervals
from mecheval.tasks.batch import ROLES


def restore_view(table: pd.DataFrame, metric: str = "likelihood") -> pd.DataFrame:
    """Rows: sites (forward order); columns: Original, Corrupted, Restored @ <role>; in %."""
    rows = table[table.metric == metric]
    original = float(rows[rows.condition == "original"].value.iloc[0])
    corrupted = float(rows[rows.condition == "corrupted"].value.iloc[0])
    restored = rows[rows.condition == "restored"]
    order = list(dict.fromkeys(restored.site))
    roles = _role_order(restored.role)
    view = restored.pivot(index="site", columns="role", values="value").reindex(order)[roles]
    view.columns = [f"@ {r}" for r in roles]
    view.insert(0, "Corrupted", corrupted)
    view.insert(0, "Original", original)
    return (view * 100).round(1)


def _role_order(roles: pd.Series) -> list[str]:
    present = list(dict.fromkeys(roles))
    return [r for r in ROLES if r in present] + [r for r in present if r not in ROLES]


def interval_view(per_example: pd.DataFrame, bootstrap: Bootstrap = BOOTSTRAP) -> pd.DataFrame:
    """:func:`restore_view`'s restores (likelihood) as their bootstrap intervals over the
    documents, ``[low, high]`` in %: rows sites, columns ``@ <role>``."""
    bounds = restore_intervals(per_example, bootstrap)
    bounds["text"] = [
        f"[{100 * low:.1f}, {100 * high:.1f}]"
        for low, high in zip(bounds.restored_low, bounds.restored_high, strict=True)
    ]
    roles = _role_order(bounds.role)
    view = bounds.pivot(index="site", columns="role", values="text")
    view = view.reindex(list(dict.fromkeys(bounds.site)))[roles]
    view.columns = [f"@ {r}" for r in roles]
    return view.fillna("")
