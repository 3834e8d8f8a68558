"""Run a sweep: a local process pool by default, Ray for clusters.

Each run trains into its own folder (``<out>/<sweep>/<run>``) and, when asked, then runs the
interchange interventions into ``interventions.csv`` there. Nothing is shared between runs,
so killing the sweep at any moment (kill -9 included) loses no finished run: a rerun skips
finished runs, resumes unfinished ones from their checkpoints, and retries failed ones only
with ``retry_failed``.

Here a sweep's runs are planned (each resolved once) and made into jobs; jobs.py holds what
a worker does with a group of jobs, scheduling.py which jobs train together and in what
order, pool.py the local process pool.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mecheval.errors import ConfigError
from mecheval.experiments.grid import RunSpec, SweepSpec, expand
from mecheval.experiments.jobs import Job, Outcome, SweepEvent, execute_group
from mecheval.experiments.mechanisms import InterventionPlan
from mecheval.experiments.pool import run_local
from mecheval.experiments.scheduling import (
    auto_group_size,
    gpu_share,
    group_jobs,
    in_job_order,
    on_gpu,
)
from mecheval.models.registry import plugin_paths
from mecheval.training.config import RunConfig, check_device, config_from_data, resolve
from mecheval.training.folder import STATUS_FILE, RunFolder, peek_status
from mecheval.training.presets import preset
from mecheval.training.resolved import ResolvedRun

BACKENDS = ("local", "ray")


def base_data(
    spec: SweepSpec, architecture: str | None, task_kind: str | None = None
) -> dict[str, Any]:
    """The base config of a sweep: a preset reference (``preset``, ``task``) plus any
    explicit sections, merged with the explicit sections winning. ``task_kind`` (a run's
    value on the grid's ``task`` axis) replaces the base's task kind."""
    base = dict(spec.base)
    name = base.pop("preset", None)
    task = base.pop("task", None)
    if task_kind is not None:
        if name is None:
            raise ConfigError("sweep.grid.task: varies the task of a preset base only")
        task = task_kind
    if name is None:
        return {"task": task, **base} if task is not None else base
    if not isinstance(task, str):
        raise ConfigError("sweep.base.task: with a preset, expected a task kind (ar or atr)")
    data = preset(name, task, architecture or "attention")
    for section, values in base.items():
        if section not in RunConfig.model_fields:
            raise ConfigError(f"sweep.base.{section}: unknown field")
        if not isinstance(values, dict):
            raise ConfigError(f"sweep.base.{section}: expected a mapping")
        data.setdefault(section, {}).update(values)
    return data


def plan_runs(spec: SweepSpec) -> list[tuple[RunSpec, RunConfig]]:
    """Every run of ``spec`` with its config resolved, the one resolution a run gets: every
    run's config error now, before any run folder is prepared."""
    planned = []
    for run in expand(spec):
        architecture = run.overrides.get("model.architecture")
        try:
            data = base_data(spec, architecture, run.task)
            cfg = resolve(config_from_data(data, [*run.override_args(), f"name={run.name}"]))
        except ConfigError as err:
            raise ConfigError(f"sweep run {run.name}: {err}") from None
        planned.append((run, cfg))
    return planned


def prepare(run_dir: Path, retry_failed: bool) -> None:
    status = peek_status(run_dir)
    if retry_failed and status is not None and status.get("state") == "failed":
        (run_dir / STATUS_FILE).unlink()


def check_planned_devices(planned: Sequence[tuple[RunSpec, RunConfig]]) -> None:
    """Every planned run's device is on this machine (one ``error:`` line if not)."""
    for device in sorted({cfg.training.device for _, cfg in planned}):
        check_device(device)


def check_run_folders(
    spec: SweepSpec, out_dir: Path, planned: Sequence[tuple[RunSpec, RunConfig]]
) -> None:
    """No planned run's folder holds a run of another config that trained (one ``error:``
    line naming the folder if one does), checked before any run starts: a finished one would
    otherwise count as this sweep's result, an unfinished one fail its run only when it
    starts."""
    for spec_run, cfg in planned:
        RunFolder(Path(out_dir) / spec.name / spec_run.name, cfg).holds_other_config()


def make_jobs(
    spec: SweepSpec,
    out_dir: Path,
    workers: int,
    plan: InterventionPlan | None,
    retry_failed: bool,
    cache_dir: Path | None,
    check_devices: bool = True,
    planned: Sequence[tuple[RunSpec, RunConfig]] | None = None,
) -> list[Job]:
    """One job per planned run (``planned``: :func:`plan_runs` of ``spec``, when the caller
    has it already, with :func:`check_run_folders` done); with ``check_devices``, every run's
    device must be on this machine (checked before any run folder is touched)."""
    sweep_dir = out_dir / spec.name
    threads = max(1, (os.cpu_count() or 1) // max(1, workers))
    if planned is None:
        planned = plan_runs(spec)
        check_run_folders(spec, out_dir, planned)  # a caller that planned them checked them
    if check_devices:
        check_planned_devices(planned)
    jobs = []
    for spec_run, cfg in planned:
        run = ResolvedRun(cfg, sweep_dir / spec_run.name, cache_dir)
        prepare(run.run_dir, retry_failed)
        jobs.append(
            Job(
                name=spec_run.name,
                run_dir=str(run.run_dir),
                config=run.data(),
                threads=threads,
                plan=plan,
                cache_dir=str(cache_dir) if cache_dir else None,
                plugins=tuple(plugin_paths()),
            )
        )
    return jobs


def run_ray(jobs: Sequence[Job], address: str | None, group_size: int = 1) -> list[Outcome]:
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend ray: needs Ray (pip install 'mecheval[ray]')") from None
    groups = group_jobs(jobs, group_size)
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        share = gpu_share(groups, ray.cluster_resources().get("GPU", 0))
        remote = ray.remote(num_cpus=jobs[0].threads if jobs else 1)(execute_group)
        results = ray.get(
            [
                remote.options(num_gpus=share if on_gpu(group) else 0).remote(group)
                for group in groups
            ]
        )
    finally:
        if started_here:
            ray.shutdown()
    return in_job_order(jobs, groups, results)


def check_options(workers: int, backend: str) -> None:
    if backend not in BACKENDS:
        raise ConfigError(f"--backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    if workers < 1:
        raise ConfigError(f"--workers: expected >= 1, got {workers}")


def run_sweep(
    spec: SweepSpec,
    out_dir: str | Path,
    *,
    workers: int = 1,
    backend: str = "local",
    address: str | None = None,
    plan: InterventionPlan | None = None,
    retry_failed: bool = False,
    cache_dir: Path | None = None,
    on_progress: Callable[[SweepEvent], None] | None = None,
    group_size: int | None = None,
    planned: Sequence[tuple[RunSpec, RunConfig]] | None = None,
) -> list[Outcome]:
    """Run every run of ``spec`` under ``out_dir/spec.name``; return one outcome per run.
    ``on_progress`` (local backend) gets each run's events (:data:`SweepEvent`) as they happen.
    ``planned``: :func:`plan_runs` of ``spec`` where the caller has planned it already (and
    checked its folders with :func:`check_run_folders`).

    ``group_size``: the most runs trained as one stacked model (:func:`group_jobs`); None
    chooses (:func:`auto_group_size`: stacks on a GPU, one run at a time on a CPU)."""
    check_options(workers, backend)
    # A Ray cluster's devices are its workers', not this machine's.
    here = backend == "local"
    jobs = make_jobs(spec, Path(out_dir), workers, plan, retry_failed, cache_dir, here, planned)
    size = auto_group_size(jobs) if group_size is None else group_size
    if backend == "ray":
        return run_ray(jobs, address, size)
    return run_local(jobs, workers, on_progress, size)
