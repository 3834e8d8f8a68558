"""How a figure looks: heatmaps and scatter plots, and the same numbers as markdown (curves
over training: :mod:`mecheval.report.curves`).

A figure spec returns a layout (:class:`Heatmaps`, :class:`StateScatter` or
:class:`~mecheval.report.curves.Curves`); the registry renders it under the figure's name into
a :class:`FigureResult`. Heatmaps follow the paper: one panel per measure, rows (architecture,
LR or conv size) by d_model columns, numbers in the cells.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from mecheval.report.results import grouping_key, is_missing, run_info
from mecheval.report.select import Section, value_label
from mecheval.report.tables import format_cell

LR_TUNED = "LR-tuned per cell on final dev likelihood"
_CMAP = matplotlib.colormaps["viridis"].with_extremes(bad="#eeeeee")


@dataclass
class FigureResult:
    name: str
    markdown: str
    figure: Figure
    data: pd.DataFrame
    #: one line under the figure in the HTML report: what to read from it
    caption: str = ""
    #: the figure already encoded, by (format, dpi): a report writes its PNG to a file and
    #: into the HTML page, and encoding it is most of the time a report takes.
    encoded: dict[tuple[str, int], bytes] = field(default_factory=dict, repr=False, compare=False)


class Layout(Protocol):
    def render(self, name: str) -> FigureResult: ...


def wrapped_title(fig: Figure, title: str, width: float) -> None:
    # Wrap to the figure's width (about 11 characters per inch at this size) so long
    # titles are not clipped at the edges.
    fig.suptitle(textwrap.fill(title, width=int(width * 11)), fontsize=10)


# ---------------------------------------------------------------------------- heatmaps


@dataclass
class Heatmaps:
    """Sections of heatmaps; ``runs`` are the runs the figure counts (failed ones too),
    ``tuned`` says how a cell's runs were chosen, ``extra`` draws one more panel below."""

    title: str
    sections: list[Section]
    runs: pd.DataFrame
    tuned: str = LR_TUNED
    extra: Callable[[Any], None] | None = None

    def render(self, name: str) -> FigureResult:
        frames = []
        for index, section in enumerate(self.sections):
            if section.data.empty:
                continue
            frame = section.data.rename(columns={"measure": "panel"})
            frame.insert(0, "section", section.title or str(index))
            frames.append(frame)
        return FigureResult(
            name=name,
            markdown=_heatmaps_markdown(name, self),
            figure=_heatmaps_figure(f"{name}: {self.title}", self.sections, self.extra),
            data=pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(),
        )


def _cells(section: Section, panel: str) -> dict[tuple[Any, Any], tuple[float, float, int]]:
    data = section.data
    if data.empty:
        return {}
    data = data[data["measure"] == panel]
    return {
        (grouping_key(r), grouping_key(c)): (m, ci, f)
        for r, c, m, ci, f in zip(
            data["row"], data["col"], data["mean"], data["ci"], data["failed"], strict=True
        )
    }


def _heatmaps_figure(
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
    wrapped_title(fig, title, figure_width)
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
            if is_missing(mean):
                continue
            text = f"{mean:.1f}" if is_missing(ci) else f"{mean:.1f}\n±{ci:.1f}"
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=6 if is_missing(ci) else 5,
                color="white" if mean < 0.6 * vmax else "black",
            )
    ax.imshow(np.ma.masked_invalid(grid), cmap=_CMAP, vmin=0.0, vmax=vmax, aspect="auto")
    ax.set_title(panel, fontsize=7)
    ax.set_xticks(range(len(section.cols)), [value_label(c) for c in section.cols], fontsize=6)
    ax.set_yticks(
        range(len(section.rows)),
        [value_label(r) for r in section.rows] if first else [],
        fontsize=6,
    )
    ax.set_xlabel(section.col_label, fontsize=6)
    if first:
        ax.set_ylabel(section.row_label, fontsize=6)
    ax.tick_params(length=0)


def _heatmaps_markdown(name: str, layout: Heatmaps) -> str:
    sections = layout.sections
    summaries = [s.data for s in sections]
    lines = [f"## {name}: {layout.title}", "", *runs_summary(layout.runs, summaries, layout.tuned)]
    lines.append("")
    for section in sections:
        if section.title:
            lines += [f"### {section.title}", ""]
        header = [
            section.row_label,
            *(f"{section.col_label}={value_label(c)}" for c in section.cols),
        ]
        for panel in section.panels:
            cells = _cells(section, panel)
            body = [
                [
                    value_label(r),
                    *(
                        format_cell(*cells.get((r, c), (math.nan, math.nan, 0))[:2])
                        for c in section.cols
                    ),
                ]
                for r in section.rows
            ]
            lines += [f"**{panel}** (%)", "", *md_table(header, body), ""]
        lines += _failed_cells(section)
        lines += section.notes
    return "\n".join(lines).rstrip() + "\n"


def _failed_cells(section: Section) -> list[str]:
    data = section.data
    if data.empty or not (data["failed"] > 0).any():
        return []
    hit = data[data["failed"] > 0].drop_duplicates(["row", "col"])
    cells = ", ".join(
        f"{value_label(r)} {section.col_label}={value_label(c)} ({f} of {n})"
        for r, c, f, n in zip(hit["row"], hit["col"], hit["failed"], hit["runs"], strict=True)
    )
    return [f"Cells with failed runs: {cells}.", ""]


# ---------------------------------------------------------------------------- markdown


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return [line(header), "|" + "|".join("---" for _ in header) + "|", *map(line, rows)]


def runs_summary(runs: pd.DataFrame, summaries: Sequence[pd.DataFrame], tuned: str) -> list[str]:
    """How many runs a figure counts and how many failed (with why), and how many seeds
    its cells average (``summaries``: seed_summary frames with an ``n`` column)."""
    info = run_info(runs)
    status = info["status"]
    failed = info[status == "failed"]
    running = int((status == "running").sum())
    cut_off = int((status == "cut off").sum())
    ns = pd.concat([s["n"] for s in summaries if not s.empty] or [pd.Series([0])])
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
        + (f", {cut_off} cut off" if cut_off else "")
        + f"). Failed runs: {len(failed)} of {len(info)}. {cells}; {tuned}."
        + (" Unfinished runs are not in the cells." if running or cut_off else "")
    ]
    if len(failed):
        lines.append("")
        for _, row in failed.head(10).iterrows():
            reason = str(row["reason"]).splitlines()[0] if row["reason"] else "no reason given"
            lines.append(f"- failed: `{row['run']}`: {reason}")
        if len(failed) > 10:
            lines.append(f"- … and {len(failed) - 10} more failed runs")
    return lines


# ---------------------------------------------------------------------------- scatter


def dev_test_scatter(sub: Any, points: pd.DataFrame, by: str, groups: Sequence[str]) -> None:
    """Each run's final dev vs test accuracy (columns ``dev``, ``test``), one colour per
    value of ``by`` in the order of ``groups``, runs with ``best`` set ringed."""
    ax = sub.subplots(1, 1)
    for label in groups:
        mine = points[points[by] == label]
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


# ---------------------------------------------------------------------------- scatter


@dataclass
class StateScatter:
    """Zoology's accuracy against state size: one point per run (``data``: run,
    architecture, state_size, accuracy in %), one colour per architecture, log-scaled x."""

    title: str
    data: pd.DataFrame
    runs: pd.DataFrame

    def render(self, name: str) -> FigureResult:
        return FigureResult(name, self._markdown(name), self._figure(name), self.data)

    def _figure(self, name: str) -> Figure:
        fig = Figure(figsize=(6.0, 4.0), layout="constrained")
        wrapped_title(fig, f"{name}: {self.title}", 6.0)
        ax = fig.subplots()
        colours = matplotlib.colormaps["tab20"].colors
        for i, (arch, points) in enumerate(self.data.groupby("architecture", sort=False)):
            ax.scatter(
                points["state_size"],
                points["accuracy"],
                label=arch,
                color=colours[i % len(colours)],
                s=18,
            )
        ax.set_xscale("log")
        ax.set_ylim(0, 105)
        ax.set_xlabel("state size (floats per sequence)", fontsize=8)
        ax.set_ylabel("test accuracy (%)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, loc="best")
        return fig

    def _markdown(self, name: str) -> str:
        lines = [f"## {name}: {self.title}", ""]
        lines += runs_summary(self.runs, [], "every finished run, one point each")
        lines += [
            "",
            "| run | architecture | state size | test accuracy (%) |",
            "|---|---|---:|---:|",
        ]
        for row in self.data.itertuples(index=False):
            lines.append(
                f"| {row.run} | {row.architecture} | {int(row.state_size):,} | {row.accuracy:.1f} |"
            )
        return "\n".join(lines) + "\n"
