"""`mecheval report ...`: the paper's figures and tables from an experiment's results."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from mecheval.cli.app import app
from mecheval.errors import ConfigError


def load_results(experiment_dirs: list[Path]) -> pd.DataFrame:
    # Imported on use: the store reads run folders, which `--table` does not need.
    from mecheval.experiments.gather import load_folders

    return load_folders(experiment_dirs)


ExperimentDirs = Annotated[
    list[Path] | None,
    typer.Argument(
        help="experiment folders (runs/<experiment>), one or several: the pieces of one grid "
        "run on different machines are read as one; omit when giving --table",
        show_default=False,
    ),
]
FigureNames = Annotated[
    list[str] | None,
    typer.Option(
        "--figure", "-f", metavar="NAME", help="figure to make (repeatable); default: all with data"
    ),
]
Html = Annotated[bool, typer.Option("--html", help="also write one self-contained report.html")]
ReportOut = Annotated[
    Path | None,
    typer.Option(
        help="output folder; default: <experiment>/report, with several folders the first's "
        "report-merged/ (or next to --table)"
    ),
]
TablePath = Annotated[
    Path | None,
    typer.Option(help="read a saved results table (csv/parquet) instead of run folders"),
]
Formats = Annotated[
    list[str] | None,
    typer.Option(
        "--format", metavar="FORMAT", help="figure file formats (repeatable); default: png and pdf"
    ),
]


@app.command("report")
def report(
    experiment_dirs: ExperimentDirs = None,
    figure: FigureNames = None,
    html: Html = False,
    out: ReportOut = None,
    table: TablePath = None,
    formats: Formats = None,
) -> None:
    """Write the paper's figures (markdown + png + pdf) and print their tables.

    Several EXPERIMENT_DIRS are one grid gathered from its pieces (a run in two of them must
    have one config; a run cut off in one and finished in another is read where it
    finished); where the runs came from more than one folder, machine or software version,
    the report says which ran where. Only the runs' small files are read, not their
    weights."""
    from mecheval.io import atomic_write_text
    from mecheval.report import FIGURES, available_figures, write_figure
    from mecheval.report.html import render_html
    from mecheval.report.where import where_runs_ran

    names = list(figure or [])
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ConfigError(f"--figure: unknown figure {unknown[0]!r} (valid: {', '.join(FIGURES)})")
    df, out_dir = _results_table(experiment_dirs or [], table, out)
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
    where = where_runs_ran(df)
    if where:
        typer.echo(where)
    if html:
        notes = [where] if where else []
        page = atomic_write_text(
            out_dir / "report.html", render_html(results, skipped, notes=notes)
        )
        typer.echo(f"wrote {page}")


def _results_table(experiment_dirs: list[Path], table: Path | None, out: Path | None):
    """The results table, from run folders or a saved table, and where its report goes."""
    from mecheval.report import load_table, normalise

    if bool(experiment_dirs) == (table is not None):
        raise ConfigError("report: give either EXPERIMENT_DIRS or --table, not both or neither")
    if table is not None:
        return load_table(table), out or table.parent / "report"
    first = experiment_dirs[0]
    default = first / ("report" if len(experiment_dirs) == 1 else "report-merged")
    return normalise(load_results(experiment_dirs)), out or default
