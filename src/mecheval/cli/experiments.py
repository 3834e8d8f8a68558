"""`mecheval sweep | results | reproduce`: grids of runs, their results table, and the
registered paper experiments end to end (train, intervene, report)."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mecheval.cli.app import app, check_out
from mecheval.cli.options import (
    Address,
    Archs,
    Backend,
    Compile,
    Device,
    Documents,
    GroupSize,
    Lrs,
    Out,
    Quiet,
    RetryFailed,
    Seeds,
    Sets,
    Tasks,
    Widths,
    Workers,
    check_documents,
    runtime_overrides,
)
from mecheval.cli.progress import sweep_display
from mecheval.errors import ConfigError

if TYPE_CHECKING:
    from mecheval.experiments.catalog import Experiment
    from mecheval.experiments.execution.jobs import Outcome
    from mecheval.experiments.grid import SweepSpec
    from mecheval.experiments.mechanisms import InterventionPlan


def _run(
    spec: SweepSpec,
    out: Path,
    plan: InterventionPlan | None,
    quiet: bool,
    **execution: Any,
) -> list[Outcome]:
    """Plan and check ``spec``'s runs (nothing written on an error), run them under the
    progress display with ``execution`` (run_sweep's workers, backend, address, group size,
    retry_failed), and print what became of them; an interrupt names the runs it stopped."""
    from mecheval.experiments.runners import (
        check_options,
        interrupted_runs,
        plan_sweep,
        run_sweep,
    )

    check_out(out)
    backend = execution.get("backend", "local")
    check_options(execution.get("workers", 1), backend)  # before the display's first line
    planned = plan_sweep(spec, out, backend)
    start = time.perf_counter()
    try:
        with sweep_display(len(planned), quiet) as display:
            outcomes = run_sweep(
                spec, out, plan=plan, on_progress=display.update, planned=planned, **execution
            )
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (Terminated): every worker stopped
        stopped = ", ".join(interrupted_runs(out / spec.name)) or "no run was stopped mid-way"
        print(
            f"interrupted: {out / spec.name}: {stopped}; run the same command again to resume",
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


def _start_workers(workers: int, backend: str) -> None:
    """Start the local pool's worker server now, where the sweep will use one: its imports
    (seconds) then run on another core while this process imports and plans the runs."""
    if workers > 1 and backend == "local":
        from mecheval.experiments.execution.server import worker_context

        worker_context()


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
    _start_workers(workers, backend)
    from mecheval.experiments.grid import load_sweep
    from mecheval.experiments.mechanisms import InterventionPlan
    from mecheval.experiments.plan import with_overrides

    spec = with_overrides(load_sweep(spec_path), runtime_overrides(device, compile_))
    outcomes = _run(
        spec,
        out,
        InterventionPlan() if interventions else None,
        quiet,
        workers=workers,
        backend=backend,
        address=address,
        retry_failed=retry_failed,
        group_size=group_size,
    )
    exit_on_crash(outcomes)


@app.command("results")
def results_command(
    experiment_dirs: Annotated[
        list[Path],
        typer.Argument(
            help="experiment folders (OUT/<sweep>), one or several: the pieces of one grid, "
            "read as one (a run in two of them must have one config)",
            show_default=False,
        ),
    ],
    fmt: Annotated[str, typer.Option("--format", help="csv | parquet | markdown")] = "csv",
    out: Annotated[Path | None, typer.Option(help="write here instead of stdout")] = None,
    provenance: Annotated[
        bool,
        typer.Option(
            "--provenance",
            help="instead: where each run came from (mecheval and torch versions, commit, "
            "machine, device, threads, precision, kernels, the fingerprints of its documents "
            "and initial weights), one row per run",
        ),
    ] = False,
) -> None:
    """One tidy table (config columns + behavioural + mechanistic metrics) from run folders."""
    from mecheval.experiments.gather import load_folders
    from mecheval.experiments.origins import provenance_table
    from mecheval.experiments.store import require_pyarrow, write_results

    if fmt not in ("csv", "parquet", "markdown"):
        raise ConfigError(f"--format: expected csv, parquet or markdown, got {fmt!r}")
    if fmt == "parquet":
        # Checked before the run folders are read: both are one-line errors, not tracebacks.
        if out is None:
            raise ConfigError("--format parquet: needs --out FILE")
        require_pyarrow()
    table = (provenance_table if provenance else load_folders)(experiment_dirs)
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
    archs: Archs = None,
    tasks: Tasks = None,
    widths: Widths = None,
    lrs: Lrs = None,
    seeds: Seeds = None,
    sets: Sets = None,
    group_size: GroupSize = None,
    device: Device = None,
    compile_: Compile = False,
    quiet: Quiet = False,
    documents: Documents = "all",
) -> None:
    """Run a registered paper experiment: sweep, interventions, report; print its table.

    --widths, --lrs and --seeds run a slice of the experiment's grid at --preset (a value
    not in it is an error; nothing is written). The slice trains into the experiment's own
    folder, OUT/<experiment>-<preset>/, under the full grid's run names, so a later full run
    (or another slice) skips the finished runs; the report covers every run in that folder.
    """
    if list_ or name is None:
        _list_experiments()
        return
    if _reproduced_known(name, out, preset, (archs, tasks, widths, lrs, seeds, sets, device)):
        return
    _start_workers(workers, backend)
    from mecheval.experiments.reproduce import report_experiment

    runtime = runtime_overrides(device, compile_)
    experiment, spec = reproduce_spec(name, preset, archs, widths, lrs, seeds, tasks, sets, runtime)
    outcomes = _run(
        spec,
        out,
        replace(experiment.plan, documents=check_documents(documents)),
        quiet,
        workers=workers,
        backend=backend,
        address=address,
        retry_failed=retry_failed,
        group_size=group_size,
    )
    report_experiment(out / spec.name, experiment, spec, echo=typer.echo)
    exit_on_crash(outcomes)  # after the report, which shows what the finished runs measured


def _reproduced_known(name: str, out: Path, preset: str, given: tuple[Any, ...]) -> bool:
    """Whether ``name`` is ``known-mechanisms``, then reproduced and printed (``given``: the
    sweep options, --archs to --device, which its models built by hand do not take)."""
    from mecheval.experiments import known

    if name != known.NAME:
        return False
    typer.echo(known.reproduce_known(out, preset, dict(zip(known.NOT_TAKEN, given, strict=True))))
    return True


def exit_on_crash(outcomes: Sequence[Outcome]) -> None:
    """Exit 1 where a run crashed (the same command resumes it). A run that diverged is a
    result, recorded as diverged with its reason (the paper's high LRs diverge): exit 0."""
    if any(o.state != "done" and not o.reason.startswith("diverged") for o in outcomes):
        raise typer.Exit(1)


def _list_experiments() -> None:
    from mecheval.experiments import known
    from mecheval.experiments.catalog import list_experiments
    from mecheval.experiments.reproduce import listed_figures

    for e in list_experiments():
        typer.echo(f"{e.name:<18} {e.description}  [figures: {', '.join(listed_figures(e))}]")
    typer.echo(f"{known.NAME:<18} {known.DESCRIPTION}  [no training: a table]")


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
    runtime: dict[str, Any] | None = None,
) -> tuple[Experiment, SweepSpec]:
    """The experiment ``name`` and the sweep ``reproduce`` runs for these option strings
    (experiments/reproduce.py's :func:`~mecheval.experiments.reproduce.experiment_sweep`);
    ``sets`` (``model.n_layers=1``) and ``runtime`` (``--device``, ``--compile``) over every
    run."""
    from mecheval.experiments.reproduce import experiment_sweep
    from mecheval.training.config import parse_override

    values = {".".join(path): value for path, value in map(parse_override, sets or [])}
    return experiment_sweep(
        name,
        preset,
        archs=parse_names("--archs", archs, "architecture names"),
        widths=parse_values("--widths", widths, int),
        lrs=parse_values("--lrs", lrs, float),
        seeds=parse_values("--seeds", seeds, int),
        tasks=parse_names("--tasks", tasks, "task kinds"),
        sets={**values, **(runtime or {})},
    )
