"""`mecheval sweep | results | reproduce`: grids of runs, their results table, and the
registered paper experiments end to end (train, intervene, report)."""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mecheval.cli.app import app, check_out
from mecheval.cli.options import (
    Address,
    Backend,
    Compile,
    Device,
    Documents,
    GroupSize,
    Out,
    Quiet,
    RetryFailed,
    Workers,
    check_documents,
    runtime_overrides,
)
from mecheval.cli.progress import sweep_display
from mecheval.errors import ConfigError

if TYPE_CHECKING:
    from mecheval.experiments.catalog import Experiment
    from mecheval.experiments.grid import SweepSpec


def _run(spec, out, workers, backend, address, retry_failed, plan, quiet, group_size, runtime):
    from mecheval.experiments.runners import (
        check_options,
        check_planned_devices,
        check_run_folders,
        plan_runs,
        run_sweep,
    )

    check_out(out)
    check_options(workers, backend)  # before the progress display's first line
    spec = spec.model_copy(update={"set": {**spec.set, **runtime}})
    planned = plan_runs(spec)
    if backend == "local":  # before the display's first line; a Ray cluster's are its workers'
        check_planned_devices(planned)
    check_run_folders(spec, Path(out), planned)
    start = time.perf_counter()
    try:
        with sweep_display(len(planned), quiet) as display:
            outcomes = run_sweep(
                spec,
                out,
                workers=workers,
                backend=backend,
                address=address,
                plan=plan,
                retry_failed=retry_failed,
                cache_dir=out / ".cache",
                on_progress=display.update,
                group_size=group_size,
                planned=planned,
            )
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (Terminated): every worker stopped
        stopped = interrupted_runs(out / spec.name)
        print(
            f"interrupted: {out / spec.name}: {', '.join(stopped) or 'no run had started'}; "
            "run the same command again to resume",
            file=sys.stderr,
        )
        raise typer.Exit(128 + getattr(err, "signum", signal.SIGINT)) from None
    failed = [o for o in outcomes if o.state != "done"]
    typer.echo(
        f"{spec.name}: {len(outcomes) - len(failed)} done "
        f"({sum(o.skipped for o in outcomes)} already), {len(failed)} failed, "
        f"{time.perf_counter() - start:.0f} s"
    )
    for o in failed:
        typer.echo(f"  failed {o.name}: {o.reason}")
    return outcomes


def interrupted_runs(sweep_dir: Path) -> list[str]:
    """The runs of ``sweep_dir`` whose status says an interrupt stopped them."""
    from mecheval.training.folder import peek_status

    if not sweep_dir.is_dir():
        return []
    return [
        run.name
        for run in sorted(sweep_dir.iterdir())
        if str((peek_status(run) or {}).get("reason", "")).startswith("crashed: interrupted")
    ]


@app.command("sweep")
def sweep_command(
    spec_path: Annotated[Path, typer.Argument(help="sweep spec YAML (docs/sweeps.md)")],
    out: Out = Path("runs"),
    workers: Workers = 1,
    backend: Backend = "local",
    address: Address = None,
    retry_failed: RetryFailed = False,
    interventions: Annotated[
        bool, typer.Option(help="run the interchange interventions after training")
    ] = True,
    group_size: GroupSize = None,
    device: Device = None,
    compile_: Compile = False,
    quiet: Quiet = False,
) -> None:
    """Train every run of a sweep into OUT/<sweep>/<run>/ (resumable; finished runs skip)."""
    from mecheval.experiments.grid import load_sweep
    from mecheval.experiments.mechanisms import InterventionPlan

    spec = load_sweep(spec_path)
    plan = InterventionPlan() if interventions else None
    runtime = runtime_overrides(device, compile_)
    outcomes = _run(
        spec, out, workers, backend, address, retry_failed, plan, quiet, group_size, runtime
    )
    if any(o.state != "done" for o in outcomes):
        raise typer.Exit(1)


@app.command("results")
def results_command(
    experiment_dir: Annotated[Path, typer.Argument(help="an experiment folder: OUT/<sweep>")],
    fmt: Annotated[str, typer.Option("--format", help="csv | parquet | markdown")] = "csv",
    out: Annotated[Path | None, typer.Option(help="write here instead of stdout")] = None,
) -> None:
    """One tidy table (config columns + behavioural + mechanistic metrics) from run folders."""
    from mecheval.experiments.store import load_results, require_pyarrow, write_results

    if fmt not in ("csv", "parquet", "markdown"):
        raise ConfigError(f"--format: expected csv, parquet or markdown, got {fmt!r}")
    if fmt == "parquet":
        # Checked before the run folders are read: both are one-line errors, not tracebacks.
        if out is None:
            raise ConfigError("--format parquet: needs --out FILE")
        require_pyarrow()
    table = load_results(experiment_dir)
    if out is not None:
        write_results(table, out, fmt)
        typer.echo(f"wrote {len(table)} rows to {out}")
    elif fmt == "markdown":
        typer.echo(table.to_markdown(index=False))
    else:
        typer.echo(table.to_csv(index=False), nl=False)


@app.command("reproduce")
def reproduce_command(
    name: Annotated[str | None, typer.Argument(help="experiment (see --list)")] = None,
    preset: Annotated[str, typer.Option(help="quick | paper | tiny")] = "quick",
    out: Out = Path("runs"),
    workers: Workers = 1,
    backend: Backend = "local",
    address: Address = None,
    retry_failed: RetryFailed = False,
    list_: Annotated[bool, typer.Option("--list", help="list the experiments")] = False,
    archs: Annotated[
        str | None,
        typer.Option(
            help="comma-separated architectures instead of the paper's seven; 'all': every "
            "registered one the experiment can train (the built-ins beyond the paper, plugins); "
            "an experiment about named architectures (mamba-conv, mamba3-conv, ...) runs the "
            "ones given among its own",
        ),
    ] = None,
    tasks: Annotated[
        str | None,
        typer.Option(
            help="task-matrix only: comma-separated task kinds instead of its nine "
            "(ar,noisy_ar,overwrite_ar,mqar,compositional_mqar,reverse_ar,stacked_mqar,"
            "parity,s3; atr too)",
        ),
    ] = None,
    widths: Annotated[
        str | None,
        typer.Option(
            help="comma-separated model widths: run only these of the grid's "
            "(paper: 16,32,64,128,256; quick and tiny have one width, 64 and 16)",
        ),
    ] = None,
    lrs: Annotated[
        str | None,
        typer.Option(
            help="comma-separated peak LRs: run only these of the grid's, compared as numbers "
            "(1e-3 = 0.001); at quick and tiny, where the LR is not swept, only the one LR "
            "the runs use (quick AR tunes it per architecture: choose one with --archs)",
        ),
    ] = None,
    seeds: Annotated[
        str | None,
        typer.Option(
            help="comma-separated training seeds: the paper trains one seed (0) per "
            "configuration; other seeds add a seed axis (run names then end in -sN)",
        ),
    ] = None,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="override a field of every run, e.g. --set model.n_layers=1 (repeatable); "
            "the runs go to their own folder, OUT/<experiment>-<preset>-L1 (training.threads, "
            "device, compile and kernels keep the experiment's folder)",
        ),
    ] = None,
    group_size: GroupSize = None,
    device: Device = None,
    compile_: Compile = False,
    quiet: Quiet = False,
    documents: Documents = "all",
) -> None:
    """Run a registered paper experiment: sweep, interventions, report; print its table.

    --widths, --lrs and --seeds run a slice of the experiment's grid at --preset (a value
    not in it is an error; nothing is written). The slice trains into the experiment's own
    folder, OUT/<experiment>-<preset>/, under the run names of the full grid, so a later
    full run (or another slice) skips the finished runs; the report covers every run in
    that folder.
    """
    from mecheval.experiments.catalog import list_experiments

    if list_ or name is None:
        for e in list_experiments():
            typer.echo(f"{e.name:<18} {e.description}  [figures: {', '.join(e.figures)}]")
        return
    experiment, spec = reproduce_spec(name, preset, archs, widths, lrs, seeds, tasks, sets)
    outcomes = _run(
        spec,
        out,
        workers,
        backend,
        address,
        retry_failed,
        replace(experiment.plan, documents=check_documents(documents)),
        quiet,
        group_size,
        runtime_overrides(device, compile_),
    )
    _report(
        out / spec.name,
        report_figures(experiment, spec),
        matrix=experiment.matrix,
        name=experiment.name,
        graded=bool(experiment.plan.methods),
    )
    if any(o.state != "done" for o in outcomes):
        raise typer.Exit(1)  # after the report, which shows what the finished runs measured


def parse_values(flag: str, text: str | None, kind: type) -> list | None:
    """``"1e-3, 3e-4"`` -> ``[0.001, 0.0003]`` for ``kind=float``; None stays None."""
    if text is None:
        return None
    what = "integers" if kind is int else "numbers"
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        values = [kind(t) for t in items]
    except ValueError:
        values = []
    if not values or len(values) != len(items):
        raise ConfigError(f"{flag}: expected comma-separated {what}, got {text!r}")
    return values


def report_figures(experiment: Experiment, spec: SweepSpec) -> tuple[str, ...]:
    """The figures ``reproduce`` reports: the experiment's, or where it varies the task (the
    matrix), each of its tasks' restore figure (``<kind>-restore``) that is registered."""
    from mecheval.experiments.grid import TASK_AXIS
    from mecheval.report import FIGURES

    if TASK_AXIS not in spec.grid:
        return experiment.figures
    names = (f"{str(kind).replace('_', '-')}-restore" for kind in spec.grid[TASK_AXIS])
    return tuple(name for name in names if name in FIGURES)


def parse_names(flag: str, text: str | None, what: str) -> list[str] | None:
    """``"a, b"`` -> ``["a", "b"]``; None stays None; an empty list is an error."""
    if text is None:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ConfigError(f"{flag}: expected comma-separated {what}, got {text!r}")
    return names


def reproduce_spec(
    name: str,
    preset: str,
    archs: str | None = None,
    widths: str | None = None,
    lrs: str | None = None,
    seeds: str | None = None,
    tasks: str | None = None,
    sets: list[str] | None = None,
) -> tuple[Experiment, SweepSpec]:
    """The experiment ``name`` and the sweep ``reproduce`` runs for these option strings.
    ``sets`` (``model.n_layers=1``) override every run; the sweep is then named after them
    (``conv-switch-quick-L1``), so its runs never mix with the experiment's own. Runtime
    fields (``training.threads=1``) are not part of the name: they compute the same runs."""
    from mecheval.experiments.catalog import get_experiment

    experiment = get_experiment(name)
    chosen = parse_names("--archs", archs, "architecture names")
    spec = experiment.sweep(
        preset,
        chosen,
        widths=parse_values("--widths", widths, int),
        lrs=parse_values("--lrs", lrs, float),
        seeds=parse_values("--seeds", seeds, int),
        tasks=parse_names("--tasks", tasks, "task kinds"),
    )
    if sets:
        from mecheval.experiments.grid import name_part
        from mecheval.training.config import parse_override
        from mecheval.training.folder import RUNTIME_FIELDS

        fixed = {".".join(path): value for path, value in map(parse_override, sets)}
        # Threads, device, compile and kernels change how fast the runs train, not what they
        # compute: they keep the experiment's folder, so the full grid skips what they trained.
        runtime = {f"training.{field}" for field in RUNTIME_FIELDS}
        named = {key: value for key, value in fixed.items() if key not in runtime}
        suffix = "-".join(name_part(key, value) for key, value in named.items())
        # The user's overrides win over the experiment's own, its per-architecture ones too.
        per_architecture = {a: {**o, **fixed} for a, o in spec.per_architecture.items()}
        spec = spec.model_copy(
            update={
                "set": {**spec.set, **fixed},
                "per_architecture": per_architecture,
                "name": f"{spec.name}-{suffix}" if suffix else spec.name,
            }
        )
    return experiment, spec


def _report(
    experiment_dir: Path,
    figures: tuple[str, ...],
    matrix: str = "",
    name: str = "",
    graded: bool = False,
) -> None:
    """Print the experiment's figures and mechanism table, and save exactly what was printed
    (figure files, and report.html with the same figures, reasons and table); ``matrix``
    (a key of report/matrix.py's MATRICES: "task", "short conv", "eigenvalues") adds that
    mechanism matrix first, ``graded`` the grading of the runs' attribution estimates
    (report/grading.py)."""
    from mecheval.experiments.store import grading_records, label_records, load_results
    from mecheval.report import available_figures, normalise, write_figure
    from mecheval.report.html import save_html

    table = normalise(load_results(experiment_dir))
    results, skipped = available_figures(table, list(figures))
    if matrix:
        from mecheval.report.matrix import MATRICES, render_matrix

        columns = MATRICES[matrix]
        if name:  # the matrix is named after its experiment
            columns = replace(columns, name=name)
        results.insert(0, render_matrix(label_records(experiment_dir), columns))
    records = grading_records(experiment_dir) if graded else None
    if records is not None and len(records):
        from mecheval.report.grading import render_grading

        results.insert(0, render_grading(records))
    report_dir = experiment_dir / "report"
    for result in results:
        write_figure(result, report_dir)
        typer.echo(result.markdown)
    for name, why in skipped.items():
        typer.echo(f"(figure {name} not made: {why})")
    mechanisms = _mechanisms_markdown(experiment_dir)
    page = save_html(
        results, skipped, report_dir / "report.html", notes=[mechanisms] if mechanisms else []
    )
    typer.echo(f"report: {report_dir}/ ({page.name}: the figures and table printed here)")
    if mechanisms:
        typer.echo("\n" + mechanisms)


def _mechanisms_markdown(experiment_dir: Path) -> str:
    """The mechanism label table of the experiment's runs, headed; "" when no run has one."""
    from mecheval.experiments.store import mechanism_summary, seed_agreement
    from mecheval.models.registry import architecture_rank

    summary = mechanism_summary(experiment_dir)
    if "mechanism" not in summary.columns:
        return ""
    summary = summary.sort_values(
        "architecture", key=lambda c: c.map(architecture_rank), kind="stable"
    )
    text = (
        "Mechanisms (likelihood of the answer %, restored at the label site):\n\n"
        + summary.drop(columns="seed").to_markdown(index=False)
    )
    agreement = seed_agreement(summary)
    if (agreement["labels"].str.count(" · ") > 0).any():
        text += "\n\nLabels over seeds:\n\n" + agreement.to_markdown(index=False)
    elif len(agreement):
        text += "\n\nEach label is read from one seed (--seeds 0,1,2: their agreement)."
    return text
