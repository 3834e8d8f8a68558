"""Curves over training: measures against the step, one panel per (task, architecture) and
d_model, and the same numbers as markdown (the layout of the emergence figure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import matplotlib
import pandas as pd
from matplotlib.figure import Figure

from mecheval.report.render import LR_TUNED, FigureResult, md_table, runs_summary, wrapped_title
from mecheval.report.select import value_label
from mecheval.report.tables import format_cell

#: Panels per row where a figure has one d_model.
PANELS_PER_ROW = 4
#: Each measure's (dashes, marker), in the order of ``Curves.measures``.
LINE_STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "v"), ((0, (1, 1)), "D")]


@dataclass
class Curves:
    """Measures against the training step: one panel per (task, architecture) row and
    d_model column. ``data`` is a seed summary with columns task, architecture, d_model,
    measure, step; ``title`` heads the markdown, ``plot_title`` the picture."""

    title: str
    plot_title: str
    data: pd.DataFrame
    panels: list[tuple[str, str]]
    measures: list[str]
    runs: pd.DataFrame
    tuned: str = LR_TUNED

    def render(self, name: str) -> FigureResult:
        return FigureResult(
            name=name,
            markdown=self._markdown(name),
            figure=self._figure(name),
            data=self.data,
        )

    def _widths(self) -> list[Any]:
        return sorted(self.data["d_model"].unique())

    def _here(self, task: str, arch: str, width: Any) -> pd.DataFrame:
        data = self.data
        return data[
            (data["task"] == task) & (data["architecture"] == arch) & (data["d_model"] == width)
        ]

    def _grid(self) -> list[tuple[str, str, Any]]:
        """The panels in reading order: (task, architecture, d_model)."""
        return [(t, a, w) for t, a in self.panels for w in self._widths()]

    def _figure(self, name: str) -> Figure:
        widths = self._widths()
        panels = self._grid()
        # One panel per (task, architecture) row and d_model column; with one d_model, the
        # panels wrap into rows of up to four (seven architectures: two rows, not a column
        # of seven).
        columns = len(widths) if len(widths) > 1 else min(PANELS_PER_ROW, len(panels))
        rows = -(-len(panels) // columns)
        figure_width = 2.6 * columns + 0.6
        fig = Figure(figsize=(figure_width, 2.0 * rows + 1.0), layout="constrained")
        wrapped_title(fig, f"{name}: {self.plot_title}", figure_width)
        axes = fig.subplots(rows, columns, squeeze=False, sharey=True).flatten()
        colours = dict(zip(self.measures, matplotlib.colormaps["tab10"].colors, strict=False))
        styles = dict(zip(self.measures, LINE_STYLES, strict=False))
        for ax, (task, arch, width) in zip(axes, panels, strict=False):
            self._draw_panel(ax, self._here(task, arch, width), colours, styles)
            ax.set_title(f"{task} {arch}, d={value_label(width)}", fontsize=7)
        for ax in axes[len(panels) :]:
            ax.set_visible(False)
        for ax in axes[::columns]:
            ax.set_ylabel("likelihood (%)", fontsize=6)
        legend = {}
        for ax in axes[: len(panels)]:
            legend.update(zip(*reversed(ax.get_legend_handles_labels()), strict=True))
        fig.legend(
            list(legend.values()), list(legend), loc="outside lower center", ncols=5, fontsize=6
        )
        return fig

    def _draw_panel(self, ax: Any, here: pd.DataFrame, colours: dict, styles: dict) -> None:
        """One panel: each measure against the step, with its seed interval where it has one;
        each its own dashes and hollow marker, so that equal curves stay visible."""
        for measure in self.measures:
            line = here[here["measure"] == measure].sort_values("step")
            if line.empty:
                continue
            dashes, marker = styles.get(measure, ("-", "o"))
            ax.plot(
                line["step"],
                line["mean"],
                linestyle=dashes,
                marker=marker,
                ms=3.5,
                mfc="none",
                lw=1.2,
                color=colours[measure],
                label=measure,
            )
            if line["ci"].notna().any():
                ax.fill_between(
                    line["step"], line["lo"], line["hi"], alpha=0.2, color=colours[measure], lw=0
                )
        ax.set_ylim(0, 100)
        ax.tick_params(labelsize=6)
        ax.set_xlabel("step", fontsize=6)

    def _markdown(self, name: str) -> str:
        lines = [f"## {name}: {self.title}", ""]
        lines += runs_summary(self.runs, [self.data], self.tuned)
        lines.append("")
        for task, arch in self.panels:
            lines += [f"### {task}, {arch}", ""]
            body = []
            for width in self._widths():
                here = self._here(task, arch, width)
                for step, at in here.groupby("step", sort=True):
                    cells = {
                        m: (mean, ci)
                        for m, mean, ci in zip(at["measure"], at["mean"], at["ci"], strict=True)
                    }
                    body.append(
                        [value_label(width), value_label(step)]
                        + [format_cell(*cells[m]) if m in cells else "" for m in self.measures]
                    )
            lines += [*md_table(["d_model", "step", *self.measures], body), ""]
        return "\n".join(lines).rstrip() + "\n"
