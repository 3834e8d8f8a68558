"""Summaries of an interchange table: the paper's Fig. 3-style view."""

from __future__ import annotations

import pandas as pd

from mecheval.tasks.batch import ROLES


def restore_view(table: pd.DataFrame, metric: str = "likelihood") -> pd.DataFrame:
    """Rows: sites (forward order); columns: Original, Corrupted, Restored @ <role>; in %."""
    rows = table[table.metric == metric]
    original = float(rows[rows.condition == "original"].value.iloc[0])
    corrupted = float(rows[rows.condition == "corrupted"].value.iloc[0])
    restored = rows[rows.condition == "restored"]
    order = list(dict.fromkeys(restored.site))
    present = list(dict.fromkeys(restored.role))
    roles = [r for r in ROLES if r in present] + [r for r in present if r not in ROLES]
    view = restored.pivot(index="site", columns="role", values="value").reindex(order)[roles]
    view.columns = [f"@ {r}" for r in roles]
    view.insert(0, "Corrupted", corrupted)
    view.insert(0, "Original", original)
    return (view * 100).round(1)
