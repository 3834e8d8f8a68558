"""The hybrids' matrix: for two-layer models, layer 0's architecture (rows) by layer 1's
(columns), a panel per task, each cell coloured by the architecture of the layer that
carries the retrieval, with what that layer reads and the model's test accuracy; the pure
forms sit on the diagonal, carried by their one architecture where they read a retrieval
label. Deeper models follow, a panel per depth and task: a row per model, a cell per layer
(its architecture), the carrying layer in its architecture's colour.

Input is ``experiments.store.label_records`` (a run's architecture, e.g. ``mamba+attention``,
its layer count, its label and its carrier).
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from mecheval.models.config import HYBRID_JOIN, PARALLEL_JOIN
from mecheval.models.registry import architecture_label, architecture_rank
from mecheval.report.matrix import best_first, best_runs
from mecheval.report.render import FigureResult, md_table
from mecheval.report.results import is_missing
from mecheval.tasks import task_label
from mecheval.tasks.readings import RETRIEVAL

#: One colour per carrying architecture, in order of first appearance; no carrier: grey.
_PALETTE = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3"]
NO_CARRIER = "#e4e4e4"
CAPTION = (
    "Which layer type does the retrieval in each model. Two layers: rows are layer 0's "
    "architecture, columns layer 1's; a cell's colour is the architecture of the layer that "
    "brings the answer to the query, its text what that layer reads and the test accuracy. "
    "Deeper models: a row per model, a cell per layer, the carrying layer coloured."
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
    pure = HYBRID_JOIN not in str(row["architecture"])
    retrieves = head in RETRIEVAL.at_label_site.values()
    return str(row["architecture"]) if pure and retrieves else None


def _of_depth(records: pd.DataFrame, two: bool) -> pd.DataFrame:
    """The records of two-layer models (``two``) or of the others, by their ``layers``."""
    return records[(records["layers"] == 2) == two]


def layer_cells(records: pd.DataFrame) -> pd.DataFrame:
    """The best run (by dev accuracy) of each task and two-layer model, with its ``layer 0``,
    ``layer 1`` and ``carried by``."""
    if records.empty:
        return records
    best = best_runs(_of_depth(records, two=True))
    layers = best["architecture"].map(two_layers)
    best = best[layers.notna()].copy()
    best["layer 0"] = layers[layers.notna()].map(lambda pair: pair[0])
    best["layer 1"] = layers[layers.notna()].map(lambda pair: pair[1])
    best["carried by"] = best.apply(carried_by, axis=1) if len(best) else []
    return best.reset_index(drop=True)


def deeper_models(records: pd.DataFrame) -> pd.DataFrame:
    """The best run (by dev accuracy) of each task and model of other than two layers, in
    the records' order, with its ``depth``, ``pairs``, ``model`` (its layers' names), the
    ``layer names`` and ``carried by``."""
    deeper = _of_depth(records, two=False) if len(records) else records
    if deeper.empty:
        return deeper
    best = best_first(deeper).drop_duplicates(["task", "architecture", "layers", "pairs"])
    best = best.loc[[i for i in deeper.index if i in best.index]]  # in the records' order
    best = best.assign(depth=best["layers"].astype(int))
    best["layer names"] = [
        layer_names(a, d) for a, d in zip(best["architecture"], best["depth"], strict=True)
    ]
    best["model"] = ["+".join(names) for names in best["layer names"]]
    best["carried by"] = best.apply(carried_by, axis=1)
    return best.reset_index(drop=True)


def layer_names(architecture: str, depth: int) -> list[str]:
    """Each layer's architecture name (a parallel layer's ``attention~mamba``), from the
    model's name and its layer count (a pure form's one name ``depth`` times)."""
    parts = str(architecture).split(HYBRID_JOIN)
    return parts if len(parts) == depth else parts * depth


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


def layer_markdown(cells: pd.DataFrame, name: str, deeper: pd.DataFrame | None = None) -> str:
    lines = [
        f"## {name}: which layer carries the retrieval",
        "",
        "Each cell: the model's label (a hybrid's names the layer that brings the answer to "
        "the query and its architecture) and its test accuracy in %; rows are layer 0, "
        "columns layer 1. Where a cell had several runs, the one with the highest final dev "
        "accuracy.",
    ]
    if not cells.empty:
        lines += _pairs_markdown(cells)
    for title, group in _deeper_groups(deeper):
        rows = [[f"`{r['model']}`", cell_text(r)] for _, r in group.iterrows()]
        lines += ["", f"**{title}**", "", *md_table(["model", "label; test accuracy %"], rows)]
    return "\n".join(lines) + "\n"


def _deeper_groups(deeper: pd.DataFrame | None) -> list[tuple[str, pd.DataFrame]]:
    """The deeper models by depth, task and pairs, each group with its title (``4 layers,
    MQAR, 8 pairs``)."""
    if deeper is None or deeper.empty:
        return []
    keys = deeper[["depth", "task", "pairs"]].astype(str).agg("/".join, axis=1)
    groups = []
    for key in dict.fromkeys(keys):
        group = deeper[keys == key]
        first = group.iloc[0]
        pairs = "" if is_missing(first["pairs"]) else f", {int(first['pairs'])} pairs"
        title = f"{first['depth']} layers, {task_label(str(first['task']))}{pairs}"
        groups.append((title, group))
    return groups


def _pairs_markdown(cells: pd.DataFrame) -> list[str]:
    axis = _axis(cells)
    lines: list[str] = []
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
    return lines


def layer_figure(cells: pd.DataFrame, name: str, deeper: pd.DataFrame | None = None) -> Figure:
    axis = _axis(cells) if not cells.empty else []
    tasks = list(dict.fromkeys(cells["task"])) if not cells.empty else []
    groups = _deeper_groups(deeper)
    size = 1.35 * len(axis) + 1.4
    deepest = max((int(g["depth"].max()) for _, g in groups), default=0)
    widths = [size] * len(tasks) + [0.9 * deepest + 2.6] * len(groups)
    height = max([size + 0.8, *(0.42 * len(g) + 1.8 for _, g in groups)])
    fig = Figure(figsize=(sum(widths), height), layout="constrained")
    fig.suptitle(f"{name}: which layer type carries the retrieval", fontsize=10)
    shown = [cells[["carried by"]]] + [g[["carried by"]] for _, g in groups]
    carriers = [a for a in dict.fromkeys(pd.concat(shown)["carried by"]) if isinstance(a, str)]
    colour = {
        a: _PALETTE[i % len(_PALETTE)]
        for i, a in enumerate(sorted(carriers, key=architecture_rank))
    }
    axes = fig.subplots(1, len(widths), squeeze=False, width_ratios=widths)[0]
    for ax, task in zip(axes, tasks, strict=False):
        _pairs_panel(ax, cells[cells["task"] == task], axis, colour)
        ax.set_title(task_label(str(task)), fontsize=9)
    for ax, (title, group) in zip(axes[len(tasks) :], groups, strict=True):
        _deeper_panel(ax, group, colour)
        ax.set_title(title, fontsize=9)
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


def _pairs_panel(ax, of_task: pd.DataFrame, axis: list[str], colour: dict[str, str]) -> None:
    """One task's two-layer matrix: layer 0 by layer 1, each cell coloured by its carrier."""
    at = {(r["layer 0"], r["layer 1"]): r for _, r in of_task.iterrows()}
    for i, first in enumerate(axis):
        for j, second in enumerate(axis):
            row = at.get((first, second))
            fill = NO_CARRIER if row is None else colour.get(row["carried by"], NO_CARRIER)
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=fill, edgecolor="white", lw=1.5))
            if row is not None:
                ax.text(j + 0.5, i + 0.5, _short(row), ha="center", va="center", fontsize=6)
    ticks = [k + 0.5 for k in range(len(axis))]
    names = [architecture_label(a) for a in axis]
    ax.set_xticks(ticks, names, fontsize=7, rotation=30, ha="right")
    ax.set_yticks(ticks, names, fontsize=7)
    ax.set_xlim(0, len(axis))
    ax.set_ylim(len(axis), 0)
    ax.set_xlabel("layer 1", fontsize=7)
    ax.set_ylabel("layer 0", fontsize=7)
    _bare(ax)


def _deeper_panel(ax, group: pd.DataFrame, colour: dict[str, str]) -> None:
    """Deeper models of one depth and task: a row per model, a cell per layer with its
    architecture; the carrying layer (every layer of a pure form that retrieves) in its
    architecture's colour; the test accuracy at the row's end."""
    depth = int(group["depth"].max())
    for i, (_, row) in enumerate(group.iterrows()):
        carrier = row["carrier layer"]
        for j, layer in enumerate(row["layer names"]):
            carries = not is_missing(row["carried by"]) and (
                is_missing(carrier) or int(carrier) == j
            )
            fill = colour.get(row["carried by"], NO_CARRIER) if carries else "white"
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor=fill, edgecolor=NO_CARRIER, lw=1))
            text = "\n~ ".join(architecture_label(b) for b in layer.split(PARALLEL_JOIN))
            ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=5.5)
        accuracy = row["test accuracy"]
        shown = "–" if is_missing(accuracy) else f"{100 * accuracy:.0f}%"
        ax.text(depth + 0.15, i + 0.5, shown, ha="left", va="center", fontsize=6.5)
    ax.set_xticks([k + 0.5 for k in range(depth)], [f"layer {k}" for k in range(depth)])
    ax.tick_params(axis="x", labelsize=7)
    ax.set_yticks([])
    ax.set_xlim(0, depth + 1)
    ax.set_ylim(len(group), 0)
    _bare(ax)


def _bare(ax) -> None:
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)


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
    """The models of ``records`` as a figure result: the two-layer ones layer 0 by layer 1
    per task, then the deeper ones by depth and task, a row per model."""
    cells = layer_cells(records)
    deeper = deeper_models(records)
    return FigureResult(
        name=name,
        markdown=layer_markdown(cells, name, deeper),
        figure=layer_figure(cells, name, deeper),
        data=pd.concat([cells, deeper.drop(columns=["layer names"], errors="ignore")]),
        caption=CAPTION,
    )
