"""The report stage: tables and paper figures from an experiment's tidy results table."""

# Importing the specs fills FIGURES (each registers itself), before anyone can ask for one.
# extra_specs imports specs: the paper's figures register first, in the report's order.
from mecheval.report import extra_specs, specs  # noqa: F401
from mecheval.report.html import markdown_to_html, write_figure, write_html
from mecheval.report.registry import FIGURES, available_figures, figure
from mecheval.report.render import FigureResult
from mecheval.report.results import load_table, normalise
from mecheval.report.tables import (
    Measure,
    best_lr,
    final_behaviour,
    measure_values,
    restore_table,
    seed_summary,
)

__all__ = [
    "FIGURES",
    "FigureResult",
    "Measure",
    "available_figures",
    "figure",
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
