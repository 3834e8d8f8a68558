"""The two-layer hybrids' matrix: layer 0's architecture (rows) by layer 1's (columns), a
panel per task, each cell coloured by the architecture of the layer that carries the
retrieval, with what that layer reads and the model's test accuracy. The pure forms sit on
the diagonal, carried by their one architecture where they read a retrieval label.

Input is ``experiments.store.label_records`` (a run's architecture, e.g. ``mamba+attention``,
its label and its carrier); runs that are not two-layer models are left out.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from mecheval.models.config import HYBRID_JOIN
from mecheval.models.registry import architecture_label, architecture_rank
from mecheval.report.matrix import best_runs
from mecheval.report.render import FigureResult, md_table
from mecheval.report.results import is_missing
from mecheval.tasks import task_label
from mecheval.tasks.readings import RETRIEVAL

#: One colour per carrying architecture, in order of first appearance; no carrier: grey.
_PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3"]
NO_CARRIER = "#e4e4e4"
CAPTION = (
    "Which layer type does the retrieval in each two-layer model: rows are layer 0's "
    "architecture, columns layer 1's; a cell's colour is the architecture of the layer that "
    "brings the answer to the query, its text what that layer reads and the test accuracy."
)


def two_layers(architecture: str) -> tuple[str, str] | None:
    """(layer 0, layer 1) of a model's architecture name: a pure form is its one architecture
    twice; None for a model of other than two layers named by its parts."""
    parts = str(architecture).split(HYBRID_JOIN)
    if len(parts) == 1:
        return parts[0], parts[0]
    return (parts[0], parts[1]) if len(parts) == 2 else None


def carried_by(row: pd.Series) -> str | None:
    """The architecture of the layer that carries the retrieval: a hybrid's carrier, a pure
    form's architecture where its label is a retrieval label, else None."""
    if not is_missing(row.get("carrier architecture")):
        return str(row["carrier architecture"])
    label = row.get("label")
    if is_missing(label):
        return None
    head = str(label).split(";")[0]
    layers = two_layers(row["architecture"])
    pure = layers is not None and layers[0] == layers[1]
    return layers[0] if pure and head in RETRIEVAL.at_label_site.values() else None


def layer_cells(records: pd.DataFrame) -> pd.DataFrame:
    """The best run (by dev accuracy) of each task and two-layer model, with its ``layer 0``,
    ``layer 1`` and ``carried by``."""
    if records.empty:
        return records
    best = best_runs(records)
    layers = best["architecture"].map(two_layers)
    best = best[layers.notna()].copy()
    best["layer 0"] = layers[layers.notna()].map(lambda pair: pair[0])
    best["layer 1"] = layers[layers.notna()].map(lambda pair: pair[1])
    best["carried by"] = best.apply(carried_by, axis=1) if len(best) else []
    return best.reset_index(drop=True)


def _axis(cells: pd.DataFrame) -> list[str]:
    names = {*cells["layer 0"], *cells["layer 1"]}
    return sorted(names, key=lambda a: (architecture_rank(a), a))


def cell_text(row: pd.Series) -> str:
    """``induction in layer 1 (attention); 99.7``: the label and the test accuracy in %, or
    the run's state where it has no label."""
    if is_missing(row["label"]):
        return str(row["status"])
    accuracy = row["test accuracy"]
    return f"{row['label']}; " + ("–" if is_missing(accuracy) else f"{100 * accuracy:.1f}")


def layer_markdown(cells: pd.DataFrame, name: str) -> str:
    axis = _axis(cells)
    lines = [
        f"## {name}: which layer carries the retrieval",
        "",
        "Each cell: the model's label (a hybrid's names the layer that brings the answer to "
        "the query and its architecture) and its test accuracy in %; rows are layer 0, "
        "columns layer 1. Where a cell had several runs, the one with the highest final dev "
        "accuracy.",
    ]
    for task in dict.fromkeys(cells["task"]):
        of_task = cells[cells["task"] == task]
        at = {(r["layer 0"], r["layer 1"]): r for _, r in of_task.iterrows()}
        header = ["layer 0 ↓ / layer 1 →", *(architecture_label(a) for a in axis)]
        rows = [
            [
                f"**{architecture_label(first)}**",
                *(cell_text(at[first, second]) if (first, second) in at else "" for second in axis),
            ]
            for first in axis
        ]
        lines += ["", f"**{task_label(str(task))}**", "", *md_table(header, rows)]
    return "\n".join(lines) + "\n"


def layer_figure(cells: pd.DataFrame, name: str) -> Figure:
    axis = _axis(cells)
    tasks = list(dict.fromkeys(cells["task"]))
    size = 1.35 * len(axis) + 1.4
    fig = Figure(figsize=(size * len(tasks), size + 0.8), layout="constrained")
    fig.suptitle(f"{name}: which layer type carries the retrieval", fontsize=10)
    carriers = [a for a in dict.fromkeys(cells["carried by"]) if isinstance(a, str)]
    colour = {
        a: _PALETTE[i % len(_PALETTE)]
        for i, a in enumerate(sorted(carriers, key=architecture_rank))
    }
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, task in zip(axes, tasks, strict=True):
        of_task = cells[cells["task"] == task]
        at = {(r["layer 0"], r["layer 1"]): r for _, r in of_task.iterrows()}
        for i, first in enumerate(axis):
            for j, second in enumerate(axis):
                row = at.get((first, second))
                fill = NO_CARRIER if row is None else colour.get(row["carried by"], NO_CARRIER)
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor=fill, edgecolor="white", lw=1.5))
                if row is not None:
                    ax.text(j + 0.5, i + 0.5, _short(row), ha="center", va="center", fontsize=6)
        ax.set_title(task_label(str(task)), fontsize=9)
        ticks = [k + 0.5 for k in range(len(axis))]
        names = [architecture_label(a) for a in axis]
        ax.set_xticks(ticks, names, fontsize=7, rotation=30, ha="right")
        ax.set_yticks(ticks, names, fontsize=7)
        ax.set_xlim(0, len(axis))
        ax.set_ylim(len(axis), 0)
        ax.set_xlabel("layer 1", fontsize=7)
        ax.set_ylabel("layer 0", fontsize=7)
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
    handles = [
        Patch(facecolor=c, label=f"{architecture_label(a)} carries") for a, c in colour.items()
    ]
    handles.append(Patch(facecolor=NO_CARRIER, label="no layer carries it"))
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncols=min(4, len(handles)),
        fontsize=6.5,
        frameon=False,
    )
    return fig


def _short(row: pd.Series) -> str:
    """A cell's two lines: what the carrier reads (or the label) and the accuracy."""
    if is_missing(row["label"]):
        return str(row["status"])
    read = row.get("reads")
    head = (
        str(row["label"]).split(";")[0]
        if is_missing(read)
        else f"{read}, layer {int(row['carrier layer'])}"
    )
    if "held in the state" in str(row["label"]):
        head += "\nheld in a state"
    accuracy = row["test accuracy"]
    return f"{head}\n" + ("–" if is_missing(accuracy) else f"{100 * accuracy:.0f}%")


def render_layer_matrix(records: pd.DataFrame, name: str) -> FigureResult:
    """The two-layer models of ``records`` as a figure result: layer 0 by layer 1 per task."""
    cells = layer_cells(records)
    return FigureResult(
        name=name,
        markdown=layer_markdown(cells, name),
        figure=layer_figure(cells, name),
        data=cells,
        caption=CAPTION,
    )
