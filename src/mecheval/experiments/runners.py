"""Run a sweep: a local process pool by default, Ray for clusters.

Each run trains into its own folder (``<out>/<sweep>/<run>``) and, when asked, then runs the
interchange interventions into ``interventions.csv`` there. Nothing is shared between runs,
so killing the sweep at any moment (kill -9 included) loses no finished run: a rerun skips
finished runs, resumes unfinished ones from their checkpoints, and retries failed ones only
with ``retry_failed``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mecheval.errors import ConfigError
from mecheval.experiments.grid import RunSpec, SweepSpec, expand
from mecheval.models.registry import plugin_paths
from mecheval.training.config import RunConfig, config_from_data
from mecheval.training.presets import preset
from mecheval.training.run import STATUS_FILE, is_finished, read_status

BACKENDS = ("local", "ray")


@dataclass(frozen=True)
class InterventionPlan:
    """Which interventions a sweep runs after training each model (None fields: all)."""

    sites: tuple[str, ...] | None = None
    roles: tuple[str, ...] | None = None
    split: str = "test"
    n_docs: int | None = None
    #: also record restores at the last layer's input at every evaluation (emergence.csv)
    during_training: bool = False


@dataclass(frozen=True)
class Job:
    name: str
    run_dir: str
    config: dict[str, Any]
    threads: int
    plan: InterventionPlan | None = None
    cache_dir: str | None = None
    #: plugin files that register custom architectures, loaded by the worker first
    plugins: tuple[str, ...] = ()


@dataclass
class Outcome:
    name: str
    state: str
    reason: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False


def base_data(spec: SweepSpec, architecture: str | None) -> dict[str, Any]:
    """The base config of a sweep: a preset reference (``preset``, ``task``) plus any
    explicit sections, merged with the explicit sections winning."""
    base = dict(spec.base)
    name = base.pop("preset", None)
    task = base.pop("task", None)
    if name is None:
        return {"task": task, **base} if task is not None else base
    if not isinstance(task, str):
        raise ConfigError("sweep.base.task: with a preset, expected a task kind (ar or atr)")
    data = preset(name, task, architecture or "attention")
    for section, values in base.items():
        if not isinstance(values, dict):
            raise ConfigError(f"sweep.base.{section}: expected a mapping")
        data.setdefault(section, {}).update(values)
    return data


def plan_runs(spec: SweepSpec) -> list[tuple[RunSpec, RunConfig]]:
    planned = []
    for run in expand(spec):
        architecture = run.overrides.get("model.architecture")
        data = base_data(spec, architecture)
        cfg = config_from_data(data, [*run.override_args(), f"name={run.name}"])
        planned.append((run, cfg))
    return planned


def execute(job: Job, progress: Any = None) -> Outcome:
    """Train one run (skip/resume as its folder says), then intervene. Runs in a worker."""
    import torch

    from mecheval.training.config import RunConfig
    from mecheval.training.run import train

    torch.set_num_threads(job.threads)
    if job.plugins:
        from mecheval.models.registry import use_plugins

        use_plugins(job.plugins)
    cfg = RunConfig.model_validate(job.config)
    reporter = QueueReporter(job.name, progress) if progress is not None else None
    run_dir = Path(job.run_dir)
    already = read_status(run_dir)
    callbacks = []
    if job.plan is not None and job.plan.during_training:
        from mecheval.experiments.mechanisms import EmergenceCallback

        callbacks.append(EmergenceCallback(cfg.task, cfg.model.n_layers))
    try:
        status = train(
            cfg,
            run_dir,
            quiet=True,
            callbacks=callbacks,
            reporter=reporter,
            cache_dir=Path(job.cache_dir) if job.cache_dir else None,
        )
    except Exception as err:  # a crash of one run must not end the sweep
        return Outcome(job.name, "failed", f"crashed: {type(err).__name__}: {err}")
    skipped = already is not None and already.get("state") == status.get("state") == "done"
    if status.get("state") == "done" and job.plan is not None:
        from mecheval.experiments.mechanisms import intervene_run

        try:
            intervene_run(run_dir, job.plan, skip_existing=True)
        except Exception as err:
            return Outcome(job.name, "failed", f"interventions: {type(err).__name__}: {err}")
    return Outcome(
        job.name,
        str(status.get("state")),
        str(status.get("reason", "")),
        dict(status.get("metrics") or {}),
        skipped,
    )


class QueueReporter:
    """Sends a run's progress to the parent process (a training Reporter)."""

    def __init__(self, name: str, sink: Any, every: int = 25) -> None:
        self.name, self.sink, self.every = name, sink, every
        self.total = 0

    def start(self, total: int, step: int) -> None:
        self.total = total
        self.sink.put((self.name, step, total, None))

    def step(self, step: int, loss: float) -> None:
        if step % self.every == 0 or step == self.total:
            self.sink.put((self.name, step, self.total, loss))

    def evaluated(self, step: int, results: Mapping[str, Mapping[str, float]]) -> None:
        pass

    def stop(self) -> None:
        pass


def prepare(run_dir: Path, retry_failed: bool) -> None:
    status = read_status(run_dir)
    if retry_failed and status is not None and status.get("state") == "failed":
        (run_dir / STATUS_FILE).unlink()


def make_jobs(
    spec: SweepSpec,
    out_dir: Path,
    workers: int,
    plan: InterventionPlan | None,
    retry_failed: bool,
    cache_dir: Path | None,
) -> list[Job]:
    sweep_dir = out_dir / spec.name
    threads = max(1, (os.cpu_count() or 1) // max(1, workers))
    jobs = []
    for run, cfg in plan_runs(spec):
        run_dir = sweep_dir / run.name
        prepare(run_dir, retry_failed)
        jobs.append(
            Job(
                name=run.name,
                run_dir=str(run_dir),
                config=cfg.model_dump(mode="json"),
                threads=threads,
                plan=plan,
                cache_dir=str(cache_dir) if cache_dir else None,
                plugins=tuple(plugin_paths()),
            )
        )
    return jobs


def step_seconds(cfg: RunConfig) -> float:
    """One training step of ``cfg``'s model at its batch shape, timed on one thread."""
    import time

    import torch

    from mecheval.models import build_model
    from mecheval.training.config import resolve

    cfg = resolve(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            model = build_model(cfg.model)
            length = cfg.model.max_len or 16
            tokens = torch.randint(0, cfg.model.vocab_size or 2, (cfg.training.batch_size, length))
            at = torch.full((cfg.training.batch_size,), length - 1)
            times = []
            for _ in range(3):  # the first is a warm-up
                start = time.perf_counter()
                model(tokens, at=at).logsumexp(-1).sum().backward()
                times.append(time.perf_counter() - start)
        return min(times[1:])
    finally:
        torch.set_num_threads(threads)


def longest_first(jobs: Sequence[Job]) -> list[Job]:
    """Jobs by decreasing estimated training time (a step timed once per model shape, times
    the run's steps; finished runs cost nothing), so that a pool of workers is not left
    waiting on one slow run started last."""
    from mecheval.training.config import total_steps

    per_shape: dict[str, float] = {}
    costs = {}
    for job in jobs:
        if is_finished(read_status(Path(job.run_dir))):
            costs[job.name] = 0.0
            continue
        cfg = RunConfig.model_validate(job.config)
        shape = json.dumps([job.config["model"], cfg.training.batch_size], sort_keys=True)
        if shape not in per_shape:
            per_shape[shape] = step_seconds(cfg)
        costs[job.name] = per_shape[shape] * total_steps(cfg)
    return sorted(jobs, key=lambda job: -costs[job.name])


def run_local(
    jobs: Sequence[Job], workers: int, on_progress: Callable[[tuple], None] | None = None
) -> list[Outcome]:
    if workers <= 1:
        sink = _CallbackSink(on_progress) if on_progress else None
        return [execute(job, sink) for job in jobs]
    # spawn, not fork: forking a process whose torch thread pool is running can deadlock.
    context = multiprocessing.get_context("spawn")
    ordered = longest_first(jobs) if len(jobs) > workers else list(jobs)
    with context.Manager() as manager:
        sink = manager.Queue() if on_progress else None
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = [pool.submit(execute, job, sink) for job in ordered]
            pending: set[Future] = set(futures)
            while pending:
                _, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(sink, on_progress)
            _drain(sink, on_progress)
            done = {job.name: f.result() for job, f in zip(ordered, futures, strict=True)}
    return [done[job.name] for job in jobs]


def run_ray(jobs: Sequence[Job], address: str | None) -> list[Outcome]:
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend ray: needs Ray (pip install 'mecheval[ray]')") from None
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=jobs[0].threads if jobs else 1)(execute)
        return ray.get([remote.remote(job) for job in jobs])
    finally:
        if started_here:
            ray.shutdown()


class _CallbackSink:
    def __init__(self, callback: Callable[[tuple], None]) -> None:
        self.callback = callback

    def put(self, item: tuple) -> None:
        self.callback(item)


def _drain(sink: Any, on_progress: Callable[[tuple], None] | None) -> None:
    if sink is None or on_progress is None:
        return
    while True:
        try:
            on_progress(sink.get_nowait())
        except queue.Empty:
            return


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
    on_progress: Callable[[tuple], None] | None = None,
) -> list[Outcome]:
    """Run every run of ``spec`` under ``out_dir/spec.name``; return one outcome per run."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    if workers < 1:
        raise ConfigError(f"--workers: expected >= 1, got {workers}")
    jobs = make_jobs(spec, Path(out_dir), workers, plan, retry_failed, cache_dir)
    if backend == "ray":
        return run_ray(jobs, address)
    return run_local(jobs, workers, on_progress)
