"""`reproduce`: a registered experiment (catalog.py) as a sweep cut to what the user asked for,
and its report (the experiment's figures, its mechanism matrix, the label table), printed and
saved alike. Its runs are planned by plan.py and run by runners.py, as any sweep's."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from mecheval.experiments.catalog import LAYERS_MATRIX, Experiment, get_experiment
from mecheval.experiments.grid import TASK_AXIS, SweepSpec
from mecheval.experiments.plan import restrict, with_overrides


def experiment_sweep(
    name: str,
    preset: str,
    *,
    archs: list[str] | None = None,
    widths: list[int] | None = None,
    lrs: list[float] | None = None,
    seeds: list[int] | None = None,
    tasks: list[str] | None = None,
    sets: Mapping[str, Any] | None = None,
) -> tuple[Experiment, SweepSpec]:
    """The experiment ``name`` and the sweep ``reproduce`` runs: its grid at ``preset`` for
    ``archs`` and ``tasks``, cut to ``widths``, ``lrs`` and ``seeds`` (plan.py's
    :func:`~mecheval.experiments.plan.restrict`), with the user's dotted ``sets`` over every
    run (:func:`~mecheval.experiments.plan.with_overrides`: a sweep of its own, named after
    them, but for runtime fields such as ``training.threads``)."""
    experiment = get_experiment(name)
    spec = experiment.sweep(preset, archs, tasks)
    subset = {"--widths": widths, "--lrs": lrs, "--seeds": seeds}
    spec = restrict(spec, experiment.name, {f: v for f, v in subset.items() if v is not None})
    return experiment, with_overrides(spec, sets or {})


def report_figures(experiment: Experiment, spec: SweepSpec) -> tuple[str, ...]:
    """The figures ``reproduce`` reports: the experiment's, or where it varies the task (the
    matrix; in any of its grids), each of its tasks' restore figure (``<kind>-restore``)
    that is registered."""
    from mecheval.report import FIGURES

    kinds = dict.fromkeys(k for part in spec.parts() for k in part.grid.get(TASK_AXIS, []))
    if not kinds:
        return experiment.figures
    names = (f"{str(kind).replace('_', '-')}-restore" for kind in kinds)
    return tuple(name for name in names if name in FIGURES)


def listed_figures(experiment: Experiment) -> tuple[str, ...]:
    """Every figure ``reproduce`` draws for the experiment, in report order: the grading of
    its estimates (where it grades them), its mechanism matrix (named after it), then
    :func:`report_figures` (at the quick preset: the tasks are the same at every preset)."""
    from mecheval.report.grading import NAME as GRADING

    grading = (GRADING,) if experiment.plan.methods else ()
    matrix = (experiment.name,) if experiment.matrix else ()
    return (*grading, *matrix, *report_figures(experiment, experiment.sweep("quick")))


def report_experiment(
    experiment_dir: Path,
    experiment: Experiment,
    spec: SweepSpec,
    echo: Callable[[str], None] = print,
) -> None:
    """Print the experiment's figures and mechanism table, and save exactly what was printed
    (figure files, and report.html with the same figures, reasons and table): first the
    experiment's mechanism matrix where it has one (report/matrix.py's MATRICES), and before
    it the grading of the runs' attribution estimates where it ran them (report/grading.py)."""
    from mecheval.experiments.store import grading_records, label_records, load_results
    from mecheval.report import available_figures, normalise, write_figure
    from mecheval.report.html import save_html

    table = normalise(load_results(experiment_dir))
    results, skipped = available_figures(table, list(report_figures(experiment, spec)))
    if experiment.matrix == LAYERS_MATRIX:
        from mecheval.report.layer_matrix import render_layer_matrix

        results.insert(0, render_layer_matrix(label_records(experiment_dir), experiment.name))
    elif experiment.matrix:
        from mecheval.report.matrix import MATRICES, render_matrix

        columns = replace(MATRICES[experiment.matrix], name=experiment.name)
        results.insert(0, render_matrix(label_records(experiment_dir), columns))
    records = grading_records(experiment_dir) if experiment.plan.methods else None
    if records is not None and len(records):
        from mecheval.report.grading import render_grading

        results.insert(0, render_grading(records))
    report_dir = experiment_dir / "report"
    for result in results:
        write_figure(result, report_dir)
        echo(result.markdown)
    for name, why in skipped.items():
        echo(f"(figure {name} not made: {why})")
    mechanisms = mechanisms_markdown(experiment_dir)
    page = save_html(
        results, skipped, report_dir / "report.html", notes=[mechanisms] if mechanisms else []
    )
    echo(f"report: {report_dir}/ ({page.name}: the figures and table printed here)")
    if mechanisms:
        echo("\n" + mechanisms)


def mechanisms_markdown(experiment_dir: Path) -> str:
    """The mechanism label table of the experiment's runs, headed; "" when no run has one."""
    from mecheval.experiments.store import mechanism_summary, seed_agreement
    from mecheval.models.registry import architecture_rank

    summary = mechanism_summary(experiment_dir)
    if "mechanism" not in summary.columns:
        return ""
    summary = summary.sort_values(
        "architecture", key=lambda c: c.map(architecture_rank), kind="stable"
    )
    shown = summary.drop(columns=["seed", "role", "recovered"], errors="ignore")
    if "fragile" in shown.columns:  # a fragile label says so, with the fraction that decides it
        fragile = shown.pop("fragile")
        shown["mechanism"] = [
            f"{label} (fragile: {f})" if isinstance(f, str) and isinstance(label, str) else label
            for label, f in zip(shown["mechanism"], fragile, strict=True)
        ]
    text = (
        "Mechanisms (likelihood of the answer %, restored at the label site):\n\n"
        + shown.to_markdown(index=False)
    )
    agreement = seed_agreement(summary)
    if (agreement["labels"].str.count(" · ") > 0).any():
        text += "\n\nLabels over seeds:\n\n" + agreement.to_markdown(index=False)
    elif len(agreement):
        text += "\n\nEach label is read from one seed (--seeds 0,1,2: their agreement)."
    return text
