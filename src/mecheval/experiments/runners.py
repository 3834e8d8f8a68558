"""Run a sweep: a local process pool by default, Ray for clusters.

Each run trains into its own folder (``<out>/<sweep>/<run>``) and, when asked, then runs the
interchange interventions into ``interventions.csv`` there. Nothing is shared between runs,
so killing the sweep at any moment (kill -9 included) loses no finished run: a rerun skips
finished runs, resumes unfinished ones from their checkpoints, and retries failed ones only
with ``retry_failed``.

Here a sweep's planned runs (plan.py: each resolved once) are made into jobs and handed to
execution/: pool.py (local), cluster.py (Ray).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from mecheval.errors import ConfigError
from mecheval.experiments.execution.cluster import run_on_ray
from mecheval.experiments.execution.jobs import Job, Outcome, SweepEvent
from mecheval.experiments.execution.pool import run_local
from mecheval.experiments.execution.scheduling import auto_group_size
from mecheval.experiments.grid import SweepSpec
from mecheval.experiments.mechanisms import InterventionPlan
from mecheval.experiments.plan import check_run_folders, check_this_machine, plan_runs
from mecheval.models.registry import plugin_paths
from mecheval.training.folder import STATUS_FILE, peek_status
from mecheval.training.resolved import ResolvedRun
from mecheval.training.threads import usable_cores

BACKENDS = ("local", "ray")


def prepare(run_dir: Path, retry_failed: bool) -> None:
    status = peek_status(run_dir)
    if retry_failed and status is not None and status.get("state") == "failed":
        (run_dir / STATUS_FILE).unlink()


def plan_sweep(spec: SweepSpec, out_dir: Path, backend: str = "local") -> list[ResolvedRun]:
    """The sweep's runs, planned into ``out_dir`` (datasets cached in ``out_dir/.cache``) and
    checked before anything is written: their folders, and where they train here (the local
    backend; a Ray cluster's devices are its workers') their devices and trackers."""
    planned = plan_runs(spec, out_dir, Path(out_dir) / ".cache")
    if backend == "local":
        check_this_machine(planned)
    check_run_folders(planned)
    return planned


def interrupted_runs(sweep_dir: Path) -> list[str]:
    """The runs of ``sweep_dir`` whose status says an interrupt stopped them."""
    if not sweep_dir.is_dir():
        return []
    return [
        run.name
        for run in sorted(sweep_dir.iterdir())
        if str((peek_status(run) or {}).get("reason", "")).startswith("crashed: interrupted")
    ]


def make_jobs(
    spec: SweepSpec,
    out_dir: Path,
    workers: int,
    plan: InterventionPlan | None,
    retry_failed: bool,
    cache_dir: Path | None,
    check_machine: bool = True,
    planned: Sequence[ResolvedRun] | None = None,
) -> list[Job]:
    """One job per planned run (``planned``: :func:`~mecheval.experiments.plan.plan_runs` of
    ``spec``, when the caller has it already, with its folders checked); with
    ``check_machine``, every run's device and trackers must be on this machine (checked before
    any run folder is touched)."""
    threads = max(1, usable_cores() // max(1, workers))
    if planned is None:
        planned = plan_runs(spec, out_dir, cache_dir)
        check_run_folders(planned)  # a caller that planned them checked them
    if check_machine:
        check_this_machine(planned)
    if plan is not None:
        plan.check_tasks(run.cfg.task for run in planned)
    jobs = []
    for run in planned:
        prepare(run.run_dir, retry_failed)
        jobs.append(
            Job(
                name=run.name,
                run_dir=str(run.run_dir),
                config=run.data(),
                threads=threads,
                plan=plan,
                cache_dir=str(run.cache_dir) if run.cache_dir else None,
                plugins=tuple(plugin_paths()),
            )
        )
    return jobs


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
    planned: Sequence[ResolvedRun] | None = None,
) -> list[Outcome]:
    """Run every run of ``spec`` under ``out_dir/spec.name``; return one outcome per run.
    ``on_progress`` (local backend) gets each run's events (:data:`SweepEvent`) as they happen.
    ``planned``: :func:`~mecheval.experiments.plan.plan_runs` of ``spec`` where the caller
    has planned it already (and checked its folders with ``check_run_folders``).

    ``group_size``: the most runs trained as one stacked model (:func:`group_jobs`); None
    chooses (:func:`auto_group_size`: stacks on a GPU, one run at a time on a CPU)."""
    check_options(workers, backend)
    # A Ray cluster's devices are its workers', not this machine's.
    here = backend == "local"
    jobs = make_jobs(spec, Path(out_dir), workers, plan, retry_failed, cache_dir, here, planned)
    size = auto_group_size(jobs) if group_size is None else group_size
    if backend == "ray":
        return run_on_ray(jobs, address, size)
    return run_local(jobs, workers, on_progress, size)
