"""One function per paper figure: ``(results table) -> FigureResult``.

Each function picks the runs its figure is about from the tidy results table, LR-tunes them
per cell as the paper does (best mean final dev likelihood over seeds, unless said
otherwise), summarises seeds (mean ± 95 % t-interval) and returns the figure in the paper's
layout -- heatmaps with architecture (or LR, or conv size) rows and d_model columns, one panel
per condition, numbers printed in the cells -- together with the same numbers as markdown
tables and as a tidy DataFrame.

Which runs a figure uses. The ablation knobs have *default* values (2 layers, position
embeddings on, Mamba ``d_conv`` 4, Based short conv, parent queries, no train/test split).
A figure that is not about a knob keeps only runs at its default: strictly for the task
knobs (``task.query``, ``task.split``), and per architecture only where the default occurs
for the model knobs (so a sweep of 3-layer models still has an ``ar-restore``). If several
settings still share a cell, the best one by dev likelihood is shown, like the LR.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from mecheval.errors import ConfigError
from mecheval.models.registry import ARCHITECTURES, architecture_label
from mecheval.report.tables import (
    ARCH,
    D_MODEL,
    LR,
    N_LAYERS,
    RESTORE_SITE,
    Measure,
    _key,
    _na,
    behaviour,
    best_lr,
    cell_summary,
    corrupted,
    format_cell,
    has_site,
    measure_values,
    normalise,
    original,
    restore_measures,
    restored,
    run_info,
    seed_summary,
    setting_columns,
)

KIND = "task.kind"
QUERY = "task.query"
TASK_SPLIT = "task.split"
PE = "model.position_embedding"
D_CONV = "model.mixer.d_conv"
LONG_CONV = "model.mixer.long_conv"
#: Where Based's short-conv kernel size may live in its mixer options.
BASED_KERNEL_COLUMNS = (
    "model.mixer.kernel_size",
    "model.mixer.conv_kernel_size",
    "model.mixer.short_conv_size",
    "model.mixer.d_conv",
)
_ROW = "_row"  # derived, per-figure row label column (not a config column, so never tuned)
_CMAP = matplotlib.colormaps["viridis"].with_extremes(bad="#eeeeee")


@dataclass
class FigureResult:
    name: str
    markdown: str
    figure: Figure
    data: pd.DataFrame


@dataclass
class Section:
    """One row of panels sharing rows and columns (one sub-figure of a paper figure)."""

    title: str
    data: pd.DataFrame  # cell_summary output
    panels: list[str]
    rows: list[Any]
    cols: list[Any]
    row_label: str
    col_label: str = "d_model"
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- selection


def _prepare(df: pd.DataFrame, name: str) -> pd.DataFrame:
    df = normalise(df)
    if df.empty:
        raise ConfigError(f"figure {name}: the results table is empty")
    for column in (ARCH, D_MODEL):
        if column not in df.columns:
            raise ConfigError(f"figure {name}: the results table has no {column} column")
    return df.assign(_arch=df[ARCH].map(lambda a: architecture_label(str(a))))


def _task(df: pd.DataFrame, kind: str, name: str) -> pd.DataFrame:
    if KIND not in df.columns:
        raise ConfigError(f"figure {name}: the results table has no {KIND} column")
    return df[df[KIND].astype(str).str.lower() == kind]


def _runs_where(df: pd.DataFrame, keep: pd.Series) -> pd.DataFrame:
    info = run_info(df)
    return df[df["run"].isin(set(info.loc[keep.to_numpy(), "run"]))]


def _is(values: pd.Series, test: Callable[[Any], bool]) -> pd.Series:
    return values.map(lambda v: bool(test(v)))


def _standard(df: pd.DataFrame, keep: Iterable[str] = ()) -> pd.DataFrame:
    """Runs at the default of every ablation knob not in ``keep`` (see the module doc)."""
    keep = set(keep)
    if df.empty:
        return df
    info = run_info(df)
    mask = pd.Series(True, index=info.index)
    strict = {
        QUERY: lambda v: _na(v) or str(v) == "parent",
        TASK_SPLIT: lambda v: _na(v) or float(v) == 0.0,
    }
    for column, test in strict.items():
        if column in info.columns and column not in keep:
            mask &= _is(info[column], test)
    arch = info[ARCH].astype(str)
    prefer: dict[str, tuple[Callable[[Any], bool], set[str] | None]] = {
        N_LAYERS: (lambda v: _na(v) or int(v) == 2, None),
        PE: (lambda v: _na(v) or bool(v), None),
        D_CONV: (lambda v: not _na(v) and float(v) == 4.0, {"mamba"}),
        LONG_CONV: (lambda v: _na(v) or not bool(v), {"based"}),
    }
    for column, (test, archs) in prefer.items():
        if column not in info.columns or column in keep:
            continue
        ok = _is(info[column], test)
        # Per architecture: prefer the default where it was trained, else keep what there is.
        for name in arch.unique():
            if archs is not None and name not in archs:
                continue
            here = (arch == name) & mask
            if (here & ok).any():
                mask &= ~here | ok
    return _runs_where(df, mask)


def _distinct(df: pd.DataFrame, column: str) -> list[Any]:
    if column not in df.columns:
        return []
    return sorted({_key(v) for v in run_info(df)[column]}, key=_sort_key)


def _sort_key(value: Any) -> tuple[int, Any]:
    if value is None:
        return (0, 0)
    if isinstance(value, int | float | np.number) and not isinstance(value, bool):
        return (1, float(value))
    return (2, str(value))


def _arch_key(label: Any) -> tuple[int, str]:
    order = [architecture_label(a) for a in ARCHITECTURES]
    return (order.index(label), "") if label in order else (len(order), str(label))


def _task_labels(df: pd.DataFrame) -> dict[str, str]:
    """run -> "AR" / "ATR" / "ATR (query=sibling)": the kind plus any task knob that varies
    among the runs of that kind."""
    info = run_info(df)
    if KIND not in info.columns:
        return dict.fromkeys(info["run"], "")
    kinds = info[KIND].astype(str).str.upper()
    columns = [c for c in setting_columns(df) if c.startswith("task.") and c != KIND]
    out: dict[str, str] = {}
    for kind in kinds.unique():
        runs = info[kinds == kind]
        varying = [c for c in columns if len({_key(v) for v in runs[c]}) > 1]
        for _, row in runs.iterrows():
            extra = ", ".join(f"{c[5:]}={_label(row[c])}" for c in varying)
            out[row["run"]] = f"{kind} ({extra})" if extra else kind
    return out


def _label(value: Any) -> str:
    if _na(value):
        return "none"
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, float | np.floating):
        return str(int(value)) if float(value).is_integer() else f"{value:.0e}"
    return str(value)


def _has_mechanistic(df: pd.DataFrame) -> bool:
    return bool((df["source"] == "mechanistic").any())


# ---------------------------------------------------------------------------- sections


def _section(
    parts: Sequence[tuple[pd.DataFrame, Sequence[Measure]]],
    row: str,
    title: str,
    row_label: str,
    *,
    tune: bool = True,
    tune_metric: str = "likelihood",
    row_key: Callable[[Any], Any] = _sort_key,
    reverse: bool = False,
) -> Section:
    """Summaries of ``measures`` over each part's runs on a ``row`` x d_model grid."""
    frames, panels, rows, cols = [], [], set(), set()
    for subset, measures in parts:
        panels.extend(m.label for m in measures)
        if subset.empty:
            continue
        frames.append(
            cell_summary(subset, measures, row, D_MODEL, tune=tune, tune_metric=tune_metric)
        )
        info = run_info(subset)
        rows |= {_key(v) for v in info[row]}
        cols |= {_key(v) for v in info[D_MODEL]}
    data = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return Section(
        title=title,
        data=data,
        panels=panels,
        rows=sorted(rows, key=row_key, reverse=reverse),
        cols=sorted(cols, key=_sort_key),
        row_label=row_label,
    )


def _cells(section: Section, panel: str) -> dict[tuple[Any, Any], tuple[float, float, int]]:
    data = section.data
    if data.empty:
        return {}
    data = data[data["measure"] == panel]
    return {
        (_key(r), _key(c)): (m, ci, f)
        for r, c, m, ci, f in zip(
            data["row"], data["col"], data["mean"], data["ci"], data["failed"], strict=True
        )
    }


def _render(
    title: str,
    sections: Sequence[Section],
    extra: Callable[[Any], None] | None = None,
    vmax: float = 100.0,
) -> Figure:
    ncols = max(len(s.panels) for s in sections)
    width = max(len(s.cols) for s in sections) * 0.5 + 0.6
    heights = [max(len(s.rows), 1) * 0.36 + 1.3 for s in sections]
    if extra is not None:
        heights.append(3.6)
    figure_width = max(5.0, ncols * width + 0.8)
    fig = Figure(figsize=(figure_width, sum(heights) + 0.5), layout="constrained")
    # Wrap to the figure's width (about 11 characters per inch at this size) so long
    # titles are not clipped at the edges.
    fig.suptitle(textwrap.fill(title, width=int(figure_width * 11)), fontsize=10)
    subfigs = np.atleast_1d(fig.subfigures(len(heights), 1, height_ratios=heights)).ravel()
    for sub, section in zip(subfigs, sections, strict=False):
        if section.title:
            sub.suptitle(section.title, fontsize=9)
        axes = sub.subplots(1, ncols, squeeze=False)[0]
        for index, ax in enumerate(axes):
            if index >= len(section.panels):
                ax.axis("off")
                continue
            _heatmap(ax, section, section.panels[index], vmax, first=index == 0)
    if extra is not None:
        extra(subfigs[-1])
    return fig


def _heatmap(ax: Any, section: Section, panel: str, vmax: float, first: bool) -> None:
    cells = _cells(section, panel)
    grid = np.full((max(len(section.rows), 1), max(len(section.cols), 1)), np.nan)
    for i, r in enumerate(section.rows):
        for j, c in enumerate(section.cols):
            mean, ci, _ = cells.get((r, c), (math.nan, math.nan, 0))
            grid[i, j] = mean
            if _na(mean):
                continue
            text = f"{mean:.1f}" if _na(ci) else f"{mean:.1f}\n±{ci:.1f}"
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=6 if _na(ci) else 5,
                color="white" if mean < 0.6 * vmax else "black",
            )
    ax.imshow(np.ma.masked_invalid(grid), cmap=_CMAP, vmin=0.0, vmax=vmax, aspect="auto")
    ax.set_title(panel, fontsize=7)
    ax.set_xticks(range(len(section.cols)), [_label(c) for c in section.cols], fontsize=6)
    ax.set_yticks(
        range(len(section.rows)), [_label(r) for r in section.rows] if first else [], fontsize=6
    )
    ax.set_xlabel(section.col_label, fontsize=6)
    if first:
        ax.set_ylabel(section.row_label, fontsize=6)
    ax.tick_params(length=0)


# ---------------------------------------------------------------------------- markdown


def _md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return [line(header), "|" + "|".join("---" for _ in header) + "|", *map(line, rows)]


def _runs_summary(rel: pd.DataFrame, sections: Sequence[Section], tuned: str) -> list[str]:
    info = run_info(rel)
    status = info["status"]
    failed = info[status == "failed"]
    running = int((status == "running").sum())
    ns = pd.concat([s.data["n"] for s in sections if not s.data.empty] or [pd.Series([0])])
    n_max = int(ns.max()) if len(ns) else 0
    n_min = int(ns[ns > 0].min()) if (ns > 0).any() else 0
    if n_max <= 1:
        cells = "Cells: one run each (no seed interval)"
    else:
        seeds = f"{n_min}–{n_max}" if n_min != n_max else f"{n_max}"
        cells = f"Cells: mean ± 95 % t-interval over {seeds} seeds"
    lines = [
        f"Runs: {len(info)} ({len(failed)} failed"
        + (f", {running} still running" if running else "")
        + f"). Failed runs: {len(failed)} of {len(info)}. {cells}; {tuned}."
    ]
    if len(failed):
        lines.append("")
        for _, row in failed.head(10).iterrows():
            reason = str(row["reason"]).splitlines()[0] if row["reason"] else "no reason given"
            lines.append(f"- failed: `{row['run']}`: {reason}")
        if len(failed) > 10:
            lines.append(f"- … and {len(failed) - 10} more failed runs")
    return lines


def _markdown(
    name: str, title: str, sections: Sequence[Section], rel: pd.DataFrame, tuned: str
) -> str:
    lines = [f"## {name}: {title}", "", *_runs_summary(rel, sections, tuned), ""]
    for section in sections:
        if section.title:
            lines += [f"### {section.title}", ""]
        header = [section.row_label, *(f"{section.col_label}={_label(c)}" for c in section.cols)]
        for panel in section.panels:
            cells = _cells(section, panel)
            body = [
                [
                    _label(r),
                    *(
                        format_cell(*cells.get((r, c), (math.nan, math.nan, 0))[:2])
                        for c in section.cols
                    ),
                ]
                for r in section.rows
            ]
            lines += [f"**{panel}** (%)", "", *_md_table(header, body), ""]
        lines += _failed_cells(section)
        lines += section.notes
    return "\n".join(lines).rstrip() + "\n"


def _failed_cells(section: Section) -> list[str]:
    data = section.data
    if data.empty or not (data["failed"] > 0).any():
        return []
    hit = data[data["failed"] > 0].drop_duplicates(["row", "col"])
    cells = ", ".join(
        f"{_label(r)} {section.col_label}={_label(c)} ({f} of {n})"
        for r, c, f, n in zip(hit["row"], hit["col"], hit["failed"], hit["runs"], strict=True)
    )
    return [f"Cells with failed runs: {cells}.", ""]


def _result(
    name: str,
    title: str,
    sections: list[Section],
    rel: pd.DataFrame,
    *,
    tuned: str = "LR-tuned per cell on final dev likelihood",
    extra: Callable[[Any], None] | None = None,
    data: pd.DataFrame | None = None,
) -> FigureResult:
    frames = []
    for index, section in enumerate(sections):
        if section.data.empty:
            continue
        frame = section.data.rename(columns={"measure": "panel"})
        frame.insert(0, "section", section.title or str(index))
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if data is not None:
        table = data
    return FigureResult(
        name=name,
        markdown=_markdown(name, title, sections, rel, tuned),
        figure=_render(f"{name}: {title}", sections, extra=extra),
        data=table,
    )


# ---------------------------------------------------------------------------- figures


def _restore(df: pd.DataFrame, name: str, kind: str, title: str) -> FigureResult:
    df = _prepare(df, name)
    rel = _standard(_task(df, kind, name))
    if rel.empty or not has_site(rel, RESTORE_SITE):
        raise ConfigError(
            f"figure {name}: no {kind.upper()} runs with interventions at "
            "layers.{last}.input in this results table"
        )
    section = _section([(rel, restore_measures())], "_arch", "", "architecture", row_key=_arch_key)
    return _result(name, title, [section], rel)


def ar_restore(df: pd.DataFrame) -> FigureResult:
    """Fig. 3: AR, original / corrupted key / restored at layers.{last}.input @ key, value,
    query; architecture x d_model; LR-tuned."""
    return _restore(
        df,
        "ar-restore",
        "ar",
        "Fig. 3, AR: likelihood of the answer, original, key corrupted, and restored at the "
        "last block's input",
    )


def atr_restore(df: pd.DataFrame) -> FigureResult:
    """Fig. 7: as Fig. 3 on ATR (parent queries, no train/test split)."""
    return _restore(
        df,
        "atr-restore",
        "atr",
        "Fig. 7, ATR: likelihood of the answer, original, key corrupted, and restored at the "
        "last block's input",
    )


def _conv_label(value: Any) -> str:
    return "none" if _na(value) else str(int(float(value)))


def _conv_key(label: Any) -> tuple[int, float]:
    return (0, 0.0) if label == "none" else (1, float(label))


def _mamba_by_conv(rel: pd.DataFrame) -> pd.DataFrame:
    mamba = rel[rel[ARCH].astype(str) == "mamba"]
    if mamba.empty or D_CONV not in mamba.columns:
        return mamba.iloc[0:0]
    mamba = mamba.assign(**{_ROW: mamba[D_CONV].map(_conv_label)})
    return mamba if mamba[_ROW].nunique() >= 2 else mamba.iloc[0:0]


def _based_variant(row: pd.Series, kernel: str | None) -> str:
    if LONG_CONV in row.index and not _na(row[LONG_CONV]) and bool(row[LONG_CONV]):
        return "long conv"
    if kernel is not None and not _na(row[kernel]):
        return f"short, k={_label(row[kernel])}"
    return "short conv"


def _based_key(label: Any) -> tuple[int, float]:
    if label == "long conv":
        return (2, 0.0)
    text = str(label)
    return (1, float(text.split("=")[1])) if "=" in text else (0, 0.0)


def conv_ablation(df: pd.DataFrame) -> FigureResult:
    """Fig. 4: (a) AR Mamba by ``model.mixer.d_conv`` (none, 1..4) x d_model: accuracy and
    original / corrupted / restored @ key, value, query at layers.{last}.input; (b) AR Based
    accuracy, short conv (by kernel size) vs implicit long conv (``model.mixer.long_conv``)."""
    name = "conv-ablation"
    df = _prepare(df, name)
    rel = _standard(_task(df, "ar", name), keep={D_CONV, LONG_CONV, *BASED_KERNEL_COLUMNS})
    sections, used_parts = [], []
    mamba = _mamba_by_conv(rel)
    if not mamba.empty:
        used_parts.append(mamba)
        sections.append(
            _section(
                [(mamba, [behaviour("Accuracy"), *restore_measures()])],
                _ROW,
                "(a) Mamba, by short-conv size d_conv",
                "d_conv",
                row_key=_conv_key,
            )
        )
    based = rel[rel[ARCH].astype(str) == "based"]
    if not based.empty:
        kernel = next(
            (c for c in BASED_KERNEL_COLUMNS if c in based.columns and based[c].notna().any()),
            None,
        )
        labels = {r["run"]: _based_variant(r, kernel) for _, r in run_info(based).iterrows()}
        based = based.assign(**{_ROW: based["run"].map(labels)})
        if based[_ROW].nunique() >= 2:
            used_parts.append(based)
            sections.append(
                _section(
                    [(based, [behaviour("Accuracy")])],
                    _ROW,
                    "(b) Based, short conv vs implicit long conv",
                    "conv",
                    row_key=_based_key,
                )
            )
    if not sections:
        raise ConfigError(
            f"figure {name}: no AR Mamba runs with several {D_CONV} values, nor Based runs "
            f"with several conv settings, in this results table"
        )
    used = pd.concat(used_parts)
    return _result(name, "Fig. 4, ablating short convolutions in Mamba and Based", sections, used)


def mamba_conv_sites(df: pd.DataFrame) -> FigureResult:
    """Fig. 5: AR Mamba, every LR x d_model (no tuning): original, corrupted, restored at
    layers.0.mixer.conv.output @ value and @ next_key, and layers.1.mixer.conv.output @ value."""
    name = "mamba-conv-sites"
    df = _prepare(df, name)
    rel = _standard(_task(df, "ar", name))
    rel = rel[rel[ARCH].astype(str) == "mamba"]
    site0, site1 = "layers.0.mixer.conv.output", "layers.1.mixer.conv.output"
    if rel.empty or not has_site(rel, site0) or LR not in rel.columns:
        raise ConfigError(
            f"figure {name}: no AR Mamba runs with interventions at {site0} in this results table"
        )
    measures = [
        original(),
        corrupted(),
        restored("value", site0, "Restored @ 0, value"),
        restored("next_key", site0, "Restored @ 0, next key"),
        restored("value", site1, "Restored @ 1, value"),
    ]
    section = _section([(rel, measures)], LR, "", "LR", tune=False, reverse=True)
    return _result(
        name,
        "Fig. 5, AR Mamba: restoring the key at the short-conv outputs",
        [section],
        rel,
        tuned="every LR shown (no tuning)",
    )


def atr_mamba_conv(df: pd.DataFrame) -> FigureResult:
    """Fig. 8: ATR Mamba by ``model.mixer.d_conv`` x d_model: original / corrupted /
    restored @ query, key, value at layers.{last}.input; LR-tuned."""
    name = "atr-mamba-conv"
    df = _prepare(df, name)
    mamba = _mamba_by_conv(_standard(_task(df, "atr", name), keep={D_CONV}))
    if mamba.empty or not has_site(mamba, RESTORE_SITE):
        raise ConfigError(
            f"figure {name}: no ATR Mamba runs with several {D_CONV} values and interventions "
            "in this results table"
        )
    measures = restore_measures(roles=("query", "key", "value"))
    section = _section([(mamba, measures)], _ROW, "", "d_conv", row_key=_conv_key)
    return _result(name, "Fig. 8, ATR Mamba by short-conv size", [section], mamba)


def pos_emb(df: pd.DataFrame) -> FigureResult:
    """Fig. 9: final dev accuracy with vs without ``model.position_embedding``, architecture
    x d_model, one section per task setting (kind plus varying task knobs); LR-tuned."""
    name = "pos-emb"
    df = _prepare(df, name)
    if len(_distinct(df, PE)) < 2:
        raise ConfigError(f"figure {name}: needs runs with and without position embeddings ({PE})")
    rel = _standard(df, keep={PE, QUERY, TASK_SPLIT})
    rel = rel.assign(
        _pe=rel[PE].map(lambda v: "PE" if _na(v) or bool(v) else "NoPE"),
        _task=rel["run"].map(_task_labels(rel)),
    )
    sections = []
    for task in sorted(rel["_task"].unique()):
        sub = rel[rel["_task"] == task]
        parts = [(sub[sub["_pe"] == pe], [behaviour(f"{pe}, accuracy")]) for pe in ("PE", "NoPE")]
        sections.append(_section(parts, "_arch", task, "architecture", row_key=_arch_key))
    return _result(name, "Fig. 9, accuracy with and without position embeddings", sections, rel)


def generalisation(df: pd.DataFrame) -> FigureResult:
    """Fig. 10: ATR with a query-answer train/test split (``task.split`` set): dev and test
    accuracy of the best-by-dev-accuracy checkpoint per architecture x d_model, restores on
    both splits when present, and dev vs test accuracy of every run (best ones ringed)."""
    name = "generalisation"
    df = _prepare(df, name)
    atr = _task(df, "atr", name)
    if TASK_SPLIT not in atr.columns:
        raise ConfigError(f"figure {name}: no ATR runs with {TASK_SPLIT} in this results table")
    atr = atr[atr[TASK_SPLIT].map(lambda v: not _na(v) and float(v) > 0)]
    rel = _standard(atr, keep={TASK_SPLIT})
    if rel.empty:
        raise ConfigError(
            f"figure {name}: no ATR runs with a train/test split ({TASK_SPLIT}) in this "
            "results table"
        )
    tuned = "best checkpoint per cell by final dev accuracy"
    parts = [
        (
            rel,
            [
                behaviour("Dev accuracy", split="dev"),
                behaviour("Test accuracy", "accuracy", "test"),
            ],
        )
    ]
    sections = [
        _section(
            parts,
            "_arch",
            "(a) best-by-dev checkpoints",
            "architecture",
            tune_metric="accuracy",
            row_key=_arch_key,
        )
    ]
    if _has_mechanistic(rel):
        measures = [
            restored(role, label=f"Restored @ {role} ({split})", split=split)
            for split in ("dev", "test")
            for role in ("key", "value", "query")
        ]
        sections.append(
            _section(
                [(rel, measures)],
                "_arch",
                "(c) interventions at layers.{last}.input",
                "architecture",
                tune_metric="accuracy",
                row_key=_arch_key,
            )
        )
    # (b): every run's final dev vs test accuracy, the best-by-dev ones ringed.
    acc = measure_values(
        rel, [behaviour("dev", split="dev"), behaviour("test", "accuracy", "test")]
    )
    points = acc.pivot_table(index="run", columns="measure", values="value").reset_index()
    info = run_info(rel)[["run", "status", "_arch", D_MODEL]]
    points = points.merge(info, on="run")
    points = points[points["status"] != "failed"]
    best = set(best_lr(rel, by=["_arch", D_MODEL], metric="accuracy", choose=None)["run"])
    points["best"] = points["run"].isin(best)

    def scatter(sub: Any) -> None:
        ax = sub.subplots(1, 1)
        for label in sorted(points["_arch"].unique(), key=_arch_key):
            mine = points[points["_arch"] == label]
            if not {"dev", "test"} <= set(mine.columns):
                continue
            dots = ax.scatter(mine["dev"], mine["test"], s=12, alpha=0.6, label=label)
            top = mine[mine["best"]]
            ax.scatter(
                top["dev"],
                top["test"],
                s=40,
                facecolors="none",
                edgecolors=dots.get_facecolor()[:1],
                linewidths=1.2,
            )
        ax.plot([0, 100], [0, 100], color="grey", lw=0.6, ls="--")
        ax.set(xlim=(0, 100), ylim=(0, 100), xlabel="dev accuracy (%)", ylabel="test accuracy (%)")
        ax.set_title("(b) dev vs test accuracy, all runs (ringed: best by dev)", fontsize=8)
        if len(points):
            ax.legend(fontsize=6, loc="upper left")

    return _result(
        name,
        "Fig. 10, ATR generalisation to held-out query-answer pairs",
        sections,
        rel,
        tuned=tuned,
        extra=scatter,
    )


def one_layer(df: pd.DataFrame) -> FigureResult:
    """Fig. 11: 1-layer models (``model.n_layers`` == 1) per task (AR, ATR): accuracy next to
    the 2-layer runs when present, and the 1-layer models' interventions -- original,
    corrupted, restored @ query at the mixer output (the only place a 1-layer model can write
    the answer)."""
    name = "one-layer"
    df = _prepare(df, name)
    rel = _standard(df, keep={N_LAYERS})
    if N_LAYERS not in rel.columns or not (rel[N_LAYERS] == 1).any():
        raise ConfigError(f"figure {name}: no 1-layer runs ({N_LAYERS} = 1) in this results table")
    rel = rel[rel[N_LAYERS].isin([1, 2])]
    rel = rel.assign(_task=rel["run"].map(_task_labels(rel)))
    sections = []
    for task in sorted(rel.loc[rel[N_LAYERS] == 1, "_task"].unique()):
        sub = rel[rel["_task"] == task]
        one, two = sub[sub[N_LAYERS] == 1], sub[sub[N_LAYERS] == 2]
        parts: list[tuple[pd.DataFrame, Sequence[Measure]]] = [
            (one, [behaviour("Accuracy, 1 layer")])
        ]
        if not two.empty:
            parts.append((two, [behaviour("Accuracy, 2 layers")]))
        if _has_mechanistic(one):
            parts.append(
                (
                    one,
                    [
                        original("Original, 1 layer"),
                        corrupted("Corrupted, 1 layer"),
                        restored(
                            "query",
                            "layers.{last}.mixer.output",
                            "Restored @ query, mixer output, 1 layer",
                        ),
                    ],
                )
            )
        sections.append(_section(parts, "_arch", task, "architecture", row_key=_arch_key))
    used = rel[rel["_task"].isin(set(rel.loc[rel[N_LAYERS] == 1, "_task"]))]
    return _result(name, "Fig. 11, 1-layer models on AR and ATR", sections, used)


def layer_count(df: pd.DataFrame) -> FigureResult:
    """Fig. 12: AR models with 1-3 layers (several ``model.n_layers`` values): one section
    per layer count, accuracy and restored likelihood @ query at each layer's mixer output
    (which layer writes the answer)."""
    name = "layer-count"
    df = _prepare(df, name)
    rel = _standard(_task(df, "ar", name), keep={N_LAYERS})
    counts = [n for n in _distinct(rel, N_LAYERS) if n is not None]
    if len(counts) < 2:
        raise ConfigError(f"figure {name}: needs AR runs with several layer counts ({N_LAYERS})")
    sections = []
    for n in counts:
        sub = rel[rel[N_LAYERS] == n]
        measures = [behaviour("Accuracy")]
        if _has_mechanistic(sub):
            measures += [
                restored("query", f"layers.{i}.mixer.output", f"Restored @ query, layer {i} mixer")
                for i in range(int(n))
            ]
        title = f"{int(n)} layer" + ("s" if int(n) != 1 else "")
        sections.append(
            _section([(sub, measures)], "_arch", title, "architecture", row_key=_arch_key)
        )
    return _result(name, "Fig. 12, AR with 1-3 layers", sections, rel)


def sibling(df: pd.DataFrame) -> FigureResult:
    """Fig. 13: ATR with sibling queries (``task.query`` == "sibling"): accuracy per layer
    count, architecture x d_model; interventions at layers.{last}.input when present."""
    name = "sibling"
    df = _prepare(df, name)
    atr = _task(df, "atr", name)
    if QUERY not in atr.columns or not (atr[QUERY].astype(str) == "sibling").any():
        raise ConfigError(
            f"figure {name}: no ATR runs with {QUERY} = sibling in this results table"
        )
    rel = _standard(atr[atr[QUERY].astype(str) == "sibling"], keep={QUERY, N_LAYERS})
    counts = _distinct(rel, N_LAYERS) or [None]

    def at(n: Any) -> pd.DataFrame:
        return rel if n is None else rel[rel[N_LAYERS] == n]

    def layers(n: Any) -> str:
        return "" if n is None else f", {int(n)} layer" + ("s" if int(n) != 1 else "")

    parts = [(at(n), [behaviour(f"Accuracy{layers(n)}")]) for n in counts]
    sections = [_section(parts, "_arch", "accuracy", "architecture", row_key=_arch_key)]
    for n in counts:
        sub = at(n)
        if (n is None or n > 1) and has_site(sub, RESTORE_SITE):
            sections.append(
                _section(
                    [(sub, restore_measures())],
                    "_arch",
                    f"interventions{layers(n)}",
                    "architecture",
                    row_key=_arch_key,
                )
            )
    return _result(name, "Fig. 13, ATR sibling queries", sections, rel)


def emergence(df: pd.DataFrame) -> FigureResult:
    """Mechanistic metrics over training: original, corrupted and restored likelihood @ key,
    value, query at layers.{last}.input against the step, per task x architecture (rows) and
    d_model (columns), for runs with interventions at two or more steps; LR-tuned."""
    name = "emergence"
    df = _prepare(df, name)
    # Task knobs are kept apart by the task label below rather than filtered to defaults.
    rel = _standard(df, keep={QUERY, TASK_SPLIT})
    mech = rel[rel["source"] == "mechanistic"]
    steps = mech.groupby("run")["step"].nunique()
    multi = set(steps[steps >= 2].index)
    if not multi:
        raise ConfigError(
            f"figure {name}: no runs with interventions at two or more training steps in this "
            "results table"
        )
    info = run_info(rel)
    keep = set(info.loc[info["status"] == "failed", "run"]) | multi
    rel = rel[rel["run"].isin(keep)]
    rel = rel.assign(_task=rel["run"].map(_task_labels(rel)))
    selected = best_lr(rel, by=["_task", "_arch", D_MODEL], choose=None)
    measures = restore_measures()
    values = measure_values(selected, measures, all_steps=True)
    values = values.merge(run_info(selected)[["run", "status", "_task", "_arch", D_MODEL]])
    data = seed_summary(values, by=["_task", "_arch", D_MODEL, "measure", "step"])
    data = data.rename(columns={"_task": "task", "_arch": "architecture", D_MODEL: "d_model"})
    panels = sorted(
        {(t, a) for t, a in zip(data["task"], data["architecture"], strict=True)},
        key=lambda p: (p[0], _arch_key(p[1])),
    )
    widths = sorted(data["d_model"].unique())
    figure_width = 2.6 * len(widths) + 0.6
    fig = Figure(figsize=(figure_width, 2.0 * len(panels) + 0.8), layout="constrained")
    title = f"{name}: restored likelihood at layers.{{last}}.input over training"
    fig.suptitle(textwrap.fill(title, width=int(figure_width * 11)), fontsize=10)
    axes = fig.subplots(len(panels), len(widths), squeeze=False, sharey=True)
    colours = dict(
        zip([m.label for m in measures], matplotlib.colormaps["tab10"].colors, strict=False)
    )
    lines = [f"## {name}: mechanistic metrics over training", ""]
    lines += _runs_summary(
        rel, [Section("", data, [], [], [], "")], "LR-tuned per cell on final dev likelihood"
    )
    lines.append("")
    for i, (task, arch) in enumerate(panels):
        lines += [f"### {task}, {arch}", ""]
        body = []
        for j, width in enumerate(widths):
            ax = axes[i][j]
            here = data[
                (data["task"] == task) & (data["architecture"] == arch) & (data["d_model"] == width)
            ]
            for m in measures:
                line = here[here["measure"] == m.label].sort_values("step")
                if line.empty:
                    continue
                ax.plot(
                    line["step"],
                    line["mean"],
                    marker="o",
                    ms=2,
                    lw=1,
                    color=colours[m.label],
                    label=m.label,
                )
                if line["ci"].notna().any():
                    ax.fill_between(
                        line["step"],
                        line["lo"],
                        line["hi"],
                        alpha=0.2,
                        color=colours[m.label],
                        lw=0,
                    )
            ax.set_ylim(0, 100)
            ax.set_title(f"{task} {arch}, d={_label(width)}", fontsize=7)
            ax.tick_params(labelsize=6)
            ax.set_xlabel("step", fontsize=6)
            for step in sorted(here["step"].unique()):
                at = here[here["step"] == step].set_index("measure")
                body.append(
                    [_label(width), _label(step)]
                    + [
                        format_cell(*at.loc[m.label, ["mean", "ci"]]) if m.label in at.index else ""
                        for m in measures
                    ]
                )
        lines += [*_md_table(["d_model", "step", *(m.label for m in measures)], body), ""]
    axes[0][0].set_ylabel("likelihood (%)", fontsize=6)
    axes[0][0].legend(fontsize=5, loc="best")
    return FigureResult(name=name, markdown="\n".join(lines).rstrip() + "\n", figure=fig, data=data)


FIGURES: dict[str, Callable[[pd.DataFrame], FigureResult]] = {
    "ar-restore": ar_restore,
    "conv-ablation": conv_ablation,
    "mamba-conv-sites": mamba_conv_sites,
    "atr-restore": atr_restore,
    "atr-mamba-conv": atr_mamba_conv,
    "pos-emb": pos_emb,
    "generalisation": generalisation,
    "one-layer": one_layer,
    "layer-count": layer_count,
    "sibling": sibling,
    "emergence": emergence,
}


def available_figures(
    df: pd.DataFrame, names: Sequence[str] | None = None
) -> tuple[list[FigureResult], dict[str, str]]:
    """Every figure (or those named) that the table has data for, and why the others are
    missing (name -> the one-line ConfigError message)."""
    results, skipped = [], {}
    df = normalise(df)
    for name in names or list(FIGURES):
        if name not in FIGURES:
            raise ConfigError(f"--figure: unknown figure {name!r} (valid: {', '.join(FIGURES)})")
        try:
            results.append(FIGURES[name](df))
        except ConfigError as err:
            skipped[name] = str(err)
    return results, skipped
