"""The mechanism matrix: architectures (rows) by tasks (columns), each cell the run's
mechanism label (its colour) with its accuracy and the fraction recovered at its best role.

Input is one row per run (``experiments.store.label_records``: run, task, architecture,
status, reason, label, accuracy, best role, recovered, dev accuracy); the CLI reads it from
the run folders and hands it here. A cell with several runs (seeds, LRs) shows the run with
the highest dev accuracy, as the figures LR-tune.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from mecheval.models.registry import architecture_label, architecture_rank
from mecheval.report.render import FigureResult, md_table
from mecheval.tasks import TASKS

NAME = "task-matrix"
#: A colour per label (interventions/labels.py), in the legend's order.
LABEL_COLOURS = {
    "induction": "#4c72b0",
    "induction (next key)": "#8fb1e0",
    "direct retrieval, layer 0": "#dd8452",
    "direct retrieval, layer >= 1": "#c44e52",
    "unclear": "#ccb974",
    "candidates only (no binding)": "#8172b3",
    "inconclusive": "#bbbbbb",
    "not learned": "#eeeeee",
}
NO_LABEL = "#ffffff"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _percent(value: Any) -> str:
    return "–" if _missing(value) else f"{100 * float(value):.0f}"


def best_runs(records: pd.DataFrame) -> pd.DataFrame:
    """One run per (task, architecture): the one with the highest dev accuracy (failed and
    unmeasured runs last), in the registries' orders (architectures as the paper's figures,
    tasks as registered)."""
    if records.empty:
        return records
    ranked = records.assign(
        _done=records["status"] == "done",
        _dev=records["dev accuracy"].astype(float).fillna(-1.0),
    ).sort_values(["_done", "_dev"], ascending=False, kind="stable")
    best = ranked.drop_duplicates(["task", "architecture"]).drop(columns=["_done", "_dev"])
    task_order = {kind: i for i, kind in enumerate(TASKS)}
    return best.sort_values(
        ["architecture", "task"],
        key=lambda c: c.map(architecture_rank if c.name == "architecture" else task_order.get),
        kind="stable",
    ).reset_index(drop=True)


def cell_text(row: pd.Series) -> str:
    """``label`` / ``acc 97, value 95%`` (or the run's state where it has no label)."""
    if _missing(row["label"]):
        return str(row["status"])
    return f"{row['label']}; acc {_percent(row['accuracy'])}%, {_best_role(row)}"


def _best_role(row: pd.Series) -> str:
    """``value 95%``: the role that recovers most, or that none recovers anything."""
    if _missing(row["best role"]) or _missing(row["recovered"]) or row["recovered"] <= 0:
        return "no role recovers"
    return f"{row['best role']} {_percent(row['recovered'])}%"


def _axes(best: pd.DataFrame) -> tuple[list[str], list[str]]:
    archs = list(dict.fromkeys(best["architecture"]))
    tasks = sorted(
        dict.fromkeys(best["task"]),
        key=lambda k: list(TASKS).index(k) if k in TASKS else len(TASKS),
    )
    return archs, tasks


def _task_label(kind: str) -> str:
    return TASKS[kind].label if kind in TASKS else kind


def matrix_markdown(best: pd.DataFrame) -> str:
    archs, tasks = _axes(best)
    cells = {(r["architecture"], r["task"]): cell_text(r) for _, r in best.iterrows()}
    rows = [[architecture_label(a), *(cells.get((a, t), "") for t in tasks)] for a in archs]
    lines = [
        f"## {NAME}: mechanism per architecture and task",
        "",
        "Each cell: the mechanism label, the accuracy on the documents it was measured on "
        "(test split), and the role whose restore at the label site recovers most of what "
        "corrupting the key removed, with that fraction. Where a cell had several runs, the "
        "one with the highest final dev accuracy.",
        "",
        *md_table(["architecture", *(_task_label(t) for t in tasks)], rows),
    ]
    return "\n".join(lines) + "\n"


def matrix_figure(best: pd.DataFrame) -> Figure:
    archs, tasks = _axes(best)
    width = 1.9 * len(tasks) + 1.6
    height = 0.55 * len(archs) + 1.9
    fig = Figure(figsize=(width, height), layout="constrained")
    fig.suptitle(f"{NAME}: mechanism label per architecture and task", fontsize=10)
    ax = fig.subplots()
    by_cell = {(r["architecture"], r["task"]): r for _, r in best.iterrows()}
    for i, arch in enumerate(archs):
        for j, task in enumerate(tasks):
            row = by_cell.get((arch, task))
            label = None if row is None or _missing(row["label"]) else str(row["label"])
            colour = LABEL_COLOURS.get(label, NO_LABEL) if label else NO_LABEL
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=colour, edgecolor="white", lw=1.5))
            if row is None:
                continue
            if label is None:
                text = str(row["status"])
            else:
                text = f"acc {_percent(row['accuracy'])}%\n{_best_role(row)}"
            ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=6.5)
    ax.set_xlim(0, len(tasks))
    ax.set_ylim(len(archs), 0)
    ax.set_xticks([j + 0.5 for j in range(len(tasks))], [_task_label(t) for t in tasks], fontsize=7)
    ax.set_yticks(
        [i + 0.5 for i in range(len(archs))], [architecture_label(a) for a in archs], fontsize=7
    )
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    shown = [lab for lab in LABEL_COLOURS if lab in set(best["label"].dropna())]
    if shown:
        fig.legend(
            handles=[Patch(facecolor=LABEL_COLOURS[lab], label=lab) for lab in shown],
            loc="outside lower center",
            ncols=min(3, len(shown)),
            fontsize=6.5,
            frameon=False,
        )
    return fig


def render_matrix(records: pd.DataFrame) -> FigureResult:
    """The matrix of ``records`` (``experiments.store.label_records``) as a figure result."""
    best = best_runs(records)
    return FigureResult(
        name=NAME, markdown=matrix_markdown(best), figure=matrix_figure(best), data=best
    )
