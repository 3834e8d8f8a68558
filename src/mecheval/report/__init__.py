"""The report stage: tables and paper figures from an experiment's tidy results table."""

from mecheval.report.figures import FIGURES, FigureResult, available_figures
from mecheval.report.html import markdown_to_html, write_figure, write_html
from mecheval.report.tables import (
    Measure,
    best_lr,
    final_behaviour,
    load_table,
    measure_values,
    normalise,
    restore_table,
    seed_summary,
)

__all__ = [
    "FIGURES",
    "FigureResult",
    "Measure",
    "available_figures",
    "best_lr",
    "final_behaviour",
    "load_table",
    "markdown_to_html",
    "measure_values",
    "normalise",
    "restore_table",
    "seed_summary",
    "write_figure",
    "write_html",
]
