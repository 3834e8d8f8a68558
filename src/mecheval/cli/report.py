"""`mecheval report ...`: the paper's figures and tables from an experiment's results."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from mecheval.cli.app import app
from mecheval.errors import ConfigError


def load_results(experiment_dir: Path) -> pd.DataFrame:
    # Imported on use: the store reads run folders, which `--table` does not need.
    from mecheval.experiments.store import load_results as load

    return load(experiment_dir)


ExperimentDir = Annotated[
    Path | None,
    typer.Argument(help="experiment folder (runs/<experiment>); omit when giving --table"),
]
FigureNames = Annotated[
    list[str] | None,
    typer.Option("--figure", "-f", help="figure to make (repeatable); default: all with data"),
]
Html = Annotated[bool, typer.Option("--html", help="also write one self-contained report.html")]
ReportOut = Annotated[
    Path | None,
    typer.Option(help="output folder; default: <experiment>/report (or next to --table)"),
]
TablePath = Annotated[
    Path | None,
    typer.Option(help="read a saved results table (csv/parquet) instead of run folders"),
]
Formats = Annotated[
    list[str] | None,
    typer.Option("--format", help="figure file formats (repeatable); default: png and pdf"),
]


@app.command("report")
def report(
    experiment_dir: ExperimentDir = None,
    figure: FigureNames = None,
    html: Html = False,
    out: ReportOut = None,
    table: TablePath = None,
    formats: Formats = None,
) -> None:
    """Write the paper's figures (markdown + png + pdf) and print their tables."""
    from mecheval.io import atomic_write_text
    from mecheval.report import FIGURES, available_figures, write_figure
    from mecheval.report.html import render_html

    names = list(figure or [])
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ConfigError(f"--figure: unknown figure {unknown[0]!r} (valid: {', '.join(FIGURES)})")
    df, out_dir = _results_table(experiment_dir, table, out)
    results, skipped = available_figures(df, names or None)
    if names and skipped:
        # Asked-for figures that cannot be made are an error, not a silent omission.
        name, why = next(iter(skipped.items()))
        raise ConfigError(why if why.startswith("figure") else f"figure {name}: {why}")
    if not results:
        raise ConfigError(
            "report: no figure has data in this results table (" + "; ".join(skipped.values()) + ")"
        )
    for result in results:
        paths = write_figure(result, out_dir, formats=tuple(formats or ("png", "pdf")))
        typer.echo(result.markdown)
        typer.echo(f"wrote {', '.join(str(p) for p in paths)}\n")
    if skipped:
        typer.echo("figures without data:\n" + "\n".join(f"  {why}" for why in skipped.values()))
    if html:
        page = atomic_write_text(out_dir / "report.html", render_html(results, skipped))
        typer.echo(f"wrote {page}")


def _results_table(experiment_dir: Path | None, table: Path | None, out: Path | None):
    """The results table, from run folders or a saved table, and where its report goes."""
    from mecheval.report import load_table, normalise

    if (experiment_dir is None) == (table is None):
        raise ConfigError("report: give either an EXPERIMENT_DIR or --table, not both or neither")
    if table is not None:
        return load_table(table), out or table.parent / "report"
    assert experiment_dir is not None
    return normalise(load_results(experiment_dir)), out or experiment_dir / "report"
