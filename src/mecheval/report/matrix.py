"""The mechanism matrix: architectures (rows) by tasks, or by short-conv settings (columns),
each cell the run's mechanism label (its colour) with its accuracy and the fraction recovered
at its best role.

Input is one row per run (``experiments.store.label_records``: run, task, short conv,
architecture, status, reason, label, accuracy, best role, recovered, dev accuracy); the CLI
reads it from the run folders and hands it here. A cell with several runs (seeds, LRs) shows
the run with the highest dev accuracy, as the figures LR-tune.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from mecheval.models.registry import architecture_label, architecture_rank
from mecheval.report.render import FigureResult, md_table
from mecheval.report.results import is_missing
from mecheval.tasks import TASKS, task_label


@dataclass(frozen=True)
class Columns:
    """What the matrix's columns are: a column of the records (or one ``derive`` makes from
    them), its order and labels."""

    column: str
    name: str  # the figure's name
    what: str  # "task"
    order: Callable[[Any], Any]
    label: Callable[[Any], str]
    derive: Callable[[pd.DataFrame], pd.Series] | None = None
    #: the split the labels were read on, as the table's note names it
    split: str = "test split"
    #: a second table: each cell's dev and test accuracy (trained and longer documents)
    accuracies: bool = False
    #: one line under the figure: what to read from it
    caption: str = (
        "Which mechanism each architecture uses for each column: the cell's colour is its "
        "label (read from the best run by dev accuracy), its number that run's accuracy; a "
        "column whose colours change along a row is a setting that changes the mechanism."
    )


def _task_order(kind: Any) -> int:
    return list(TASKS).index(kind) if kind in TASKS else len(TASKS)


def _task_label(kind: Any) -> str:
    return task_label(str(kind))


def _conv_order(value: Any) -> tuple[int, float]:
    if is_missing(value):
        return (1, 0.0)
    return (0, 0.0) if value == "none" else (2, float(value))


def _conv_label(value: Any) -> str:
    if is_missing(value):
        return "default"
    return "no short conv" if value == "none" else f"short conv {int(float(value))}"


def _eigenvalue_setting(records: pd.DataFrame) -> pd.Series:
    """``parity|[-1, 1]``: a run's task and its transitions' eigenvalue range."""
    ranges = records["negative eigenvalues"].map(lambda v: "[-1, 1]" if v is True else "[0, 1]")
    return records["task"].astype(str) + "|" + ranges


def _setting_order(value: Any) -> tuple[int, bool]:
    kind, _, eigenvalues = str(value).partition("|")
    return _task_order(kind), eigenvalues == "[-1, 1]"


def _setting_label(value: Any) -> str:
    kind, _, eigenvalues = str(value).partition("|")
    return f"{_task_label(kind)}, {eigenvalues}"


TASK_COLUMNS = Columns("task", "task-matrix", "task", _task_order, _task_label)
CONV_COLUMNS = Columns("short conv", "conv-switch", "short-conv setting", _conv_order, _conv_label)
EIGENVALUE_COLUMNS = Columns(
    "task and eigenvalues",
    "state-tracking",
    "task and eigenvalue range",
    _setting_order,
    _setting_label,
    derive=_eigenvalue_setting,
    split="dev split: the trained lengths",
    accuracies=True,
    caption=(
        "Which architectures track state, and how: each cell's colour is the label read on "
        "the trained lengths, its number the accuracy; the second table's test accuracy on "
        "longer documents tells a learned rule from a memorised length."
    ),
)
#: The matrices an experiment can ask for (``Experiment.matrix``).
MATRICES = {"task": TASK_COLUMNS, "short conv": CONV_COLUMNS, "eigenvalues": EIGENVALUE_COLUMNS}
#: A colour per label (interventions/labels.py, tasks/readings.py), in the legend's order;
#: no two alike, since one matrix may hold every task's labels.
LABEL_COLOURS = {
    "induction": "#4c72b0",
    "induction (next key)": "#8fb1e0",
    "direct retrieval, layer 0": "#dd8452",
    "direct retrieval, layer >= 1": "#c44e52",
    "in the state after it": "#55a868",
    "at the element": "#64b5cd",
    "only at the query": "#da8bc3",
    "unclear": "#ccb974",
    "candidates only (no binding)": "#8172b3",
    "inconclusive": "#bbbbbb",
    "not learned": "#eeeeee",
}
NO_LABEL = "#ffffff"


def _percent(value: Any) -> str:
    return "–" if is_missing(value) else f"{100 * float(value):.0f}"


def best_runs(records: pd.DataFrame, columns: Columns = TASK_COLUMNS) -> pd.DataFrame:
    """One run per (column value, architecture): the one with the highest dev accuracy (failed
    and unmeasured runs last), architectures in the paper's order, columns in ``columns``'."""
    if records.empty:
        return records
    key = records[columns.column].map(lambda v: "<default>" if is_missing(v) else str(v))
    best = best_first(records.assign(_key=key)).drop_duplicates(["_key", "architecture"])
    order = best[columns.column].map(columns.order)
    best = best.assign(_rank=best["architecture"].map(architecture_rank), _order=order)
    best = best.sort_values(["_rank", "_order"], kind="stable")
    return best.drop(columns=["_key", "_rank", "_order"]).reset_index(drop=True)


def best_first(records: pd.DataFrame) -> pd.DataFrame:
    """``records`` ranked best first: finished runs before failed and unmeasured ones, then
    by dev accuracy (stable: ties keep their order), so the first of each key is its best."""
    keys = pd.DataFrame(
        {
            "done": (records["status"] == "done").to_numpy(),
            "dev": records["dev accuracy"].astype(float).fillna(-1.0).to_numpy(),
        }
    )
    return records.iloc[keys.sort_values(["done", "dev"], ascending=False, kind="stable").index]


def cell_text(row: pd.Series) -> str:
    """``label`` / ``acc 97, value 95%`` (or the run's state where it has no label)."""
    if is_missing(row["label"]):
        return str(row["status"])
    return f"{row['label']}; acc {_percent(row['accuracy'])}%, {_best_role(row)}"


def _best_role(row: pd.Series) -> str:
    """``value 95%``: the role that recovers most, or that none recovers anything."""
    if is_missing(row["best role"]) or is_missing(row["recovered"]) or row["recovered"] <= 0:
        return "no role recovers"
    return f"{row['best role']} {_percent(row['recovered'])}%"


def _axes(best: pd.DataFrame, columns: Columns) -> tuple[list[str], list[Any]]:
    archs = list(dict.fromkeys(best["architecture"]))
    values = sorted(
        {_cell_key(v): v for v in best[columns.column]}.values(),
        key=columns.order,
    )
    return archs, values


def _cell_key(value: Any) -> str:
    return "<default>" if is_missing(value) else str(value)


def _cells(best: pd.DataFrame, columns: Columns) -> dict[tuple[str, str], pd.Series]:
    return {(r["architecture"], _cell_key(r[columns.column])): r for _, r in best.iterrows()}


def matrix_markdown(best: pd.DataFrame, columns: Columns = TASK_COLUMNS) -> str:
    archs, values = _axes(best, columns)
    cells = _cells(best, columns)
    rows = [
        [
            architecture_label(a),
            *(
                cell_text(cells[a, _cell_key(v)]) if (a, _cell_key(v)) in cells else ""
                for v in values
            ),
        ]
        for a in archs
    ]
    lines = [
        f"## {columns.name}: mechanism per architecture and {columns.what}",
        "",
        "Each cell: the mechanism label, the accuracy on the documents it was measured on "
        f"({columns.split}), and the role whose restore at the label site recovers most of what "
        "corrupting the key removed, with that fraction. Where a cell had several runs, the "
        "one with the highest final dev accuracy.",
        "",
        *md_table(["architecture", *(columns.label(v) for v in values)], rows),
    ]
    if columns.accuracies:
        lines += ["", *_accuracy_table(archs, values, cells, columns)]
    return "\n".join(lines) + "\n"


def _accuracy_table(
    archs: list[str], values: list[Any], cells: dict[tuple[str, str], pd.Series], columns: Columns
) -> list[str]:
    """Each cell's final dev accuracy (trained lengths) / test accuracy (longer documents)."""

    def text(arch: str, value: Any) -> str:
        row = cells.get((arch, _cell_key(value)))
        if row is None:
            return ""
        return f"{_percent(row['dev accuracy'])} / {_percent(row['test accuracy'])}"

    header = ["architecture", *(columns.label(v) for v in values)]
    rows = [[architecture_label(a), *(text(a, v) for v in values)] for a in archs]
    return [
        "Accuracy in %: final dev (the trained lengths) / test (longer documents).",
        "",
        *md_table(header, rows),
    ]


def matrix_figure(best: pd.DataFrame, columns: Columns = TASK_COLUMNS) -> Figure:
    archs, values = _axes(best, columns)
    width = 1.9 * len(values) + 1.6
    height = 0.55 * len(archs) + 1.9
    fig = Figure(figsize=(width, height), layout="constrained")
    fig.suptitle(
        f"{columns.name}: mechanism label per architecture and {columns.what}", fontsize=10
    )
    ax = fig.subplots()
    cells = _cells(best, columns)
    for i, arch in enumerate(archs):
        for j, value in enumerate(values):
            row = cells.get((arch, _cell_key(value)))
            label = None if row is None or is_missing(row["label"]) else str(row["label"])
            colour = LABEL_COLOURS.get(label, NO_LABEL) if label else NO_LABEL
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=colour, edgecolor="white", lw=1.5))
            if row is None:
                continue
            if label is None:
                text = str(row["status"])
            else:
                text = f"acc {_percent(row['accuracy'])}%\n{_best_role(row)}"
            ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=6.5)
    ax.set_xlim(0, len(values))
    ax.set_ylim(len(archs), 0)
    ax.set_xticks(
        [j + 0.5 for j in range(len(values))], [columns.label(v) for v in values], fontsize=7
    )
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


def render_matrix(records: pd.DataFrame, columns: Columns = TASK_COLUMNS) -> FigureResult:
    """The matrix of ``records`` (``experiments.store.label_records``) as a figure result:
    architectures by ``columns`` (tasks, short-conv settings, ...)."""
    if columns.derive is not None and not records.empty:
        records = records.assign(**{columns.column: columns.derive(records)})
    best = best_runs(records, columns)
    return FigureResult(
        name=columns.name,
        markdown=matrix_markdown(best, columns),
        figure=matrix_figure(best, columns),
        data=best,
        caption=columns.caption,
    )
