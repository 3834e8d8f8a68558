"""Run a sweep: a local process pool by default, Ray for clusters.

Each run trains into its own folder (``<out>/<sweep>/<run>``) and, when asked, then runs the
interchange interventions into ``interventions.csv`` there. Nothing is shared between runs,
so killing the sweep at any moment (kill -9 included) loses no finished run: a rerun skips
finished runs, resumes unfinished ones from their checkpoints, and retries failed ones only
with ``retry_failed``.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mecheval.errors import ConfigError
from mecheval.experiments.grid import RunSpec, SweepSpec, expand
from mecheval.experiments.mechanisms import InterventionPlan
from mecheval.experiments.store import status_reason
from mecheval.models.registry import plugin_paths
from mecheval.training.config import RunConfig, check_device, config_from_data, resolve
from mecheval.training.folder import STATUS_FILE, is_finished, peek_status
from mecheval.training.presets import preset
from mecheval.training.reporter import print_warning
from mecheval.training.resolved import ResolvedRun
from mecheval.training.run import Terminated, raise_interrupt, stop_on_sigterm

BACKENDS = ("local", "ray")

#: The most runs stacked into one model on a GPU when --group-size is not given.
GPU_GROUP_SIZE = 32


@dataclass(frozen=True)
class Job:
    """A planned run as its worker receives it: the :class:`ResolvedRun` as data (a
    plugin's architecture is registered in the worker before its config is read) and the
    worker's settings."""

    name: str
    run_dir: str
    config: dict[str, Any]  # resolved (ResolvedRun.data)
    threads: int
    plan: InterventionPlan | None = None
    cache_dir: str | None = None
    #: plugin files that register custom architectures, loaded by the worker first
    plugins: tuple[str, ...] = ()

    def run(self) -> ResolvedRun:
        return ResolvedRun.from_data(self.config, self.run_dir, self.cache_dir)

    @property
    def device(self) -> str:
        return str(self.config["training"]["device"])


@dataclass
class Outcome:
    name: str
    state: str
    reason: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False
    #: the mechanism label its interventions gave ("" when none ran)
    label: str = ""


@dataclass(frozen=True)
class RunProgress:
    """How far a run's training is, sent from its worker: ``runs`` > 1 for a stack of runs
    trained as one model (``name`` is then its first run's, plus the count)."""

    name: str
    step: int
    total: int
    loss: float | None = None
    runs: int = 1
    #: the worker's ``time.monotonic()`` when it sent this (one clock for all processes of a
    #: machine): the parent reads events in batches, so their arrival times say little
    at: float | None = None


#: What a sweep tells its ``on_progress``: a run's progress while it trains, and its
#: :class:`Outcome` when it is over (trained and intervened, failed, or already done).
SweepEvent = RunProgress | Outcome


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


def crash_text(err: BaseException) -> str:
    """``crashed: <type>: <message>`` in one line (a validation error as its field)."""
    from pydantic import ValidationError

    from mecheval.errors import describe

    message = describe(err) if isinstance(err, ValidationError) else str(err).strip()
    return f"crashed: {type(err).__name__}: {(message.splitlines() or [''])[0]}".rstrip(": ")


def execute_group(jobs: Sequence[Job], progress: Any = None) -> list[Outcome]:
    """Train a group of runs (one stacked model where they form one, see
    ``mecheval.training.group``; skip/resume as their folders say), then intervene in each.
    Runs in a worker; the jobs share their worker settings (threads, plan, plugins).

    Raises nothing but an interrupt: a group that fails anywhere (its training, or before:
    loading plugins, reading its configs) comes back as failed outcomes with the reason, so
    that the sweep goes on with its other groups."""
    try:
        return _execute_group(jobs, progress)
    except Exception as err:
        reason = crash_text(err)
        return [Outcome(job.name, "failed", reason) for job in jobs]


def _execute_group(jobs: Sequence[Job], progress: Any = None) -> list[Outcome]:
    from mecheval.training.group import train_runs
    from mecheval.training.run import train_run
    from mecheval.training.threads import set_torch_threads

    first = jobs[0]
    set_torch_threads(first.threads)
    if first.plugins:
        from mecheval.models.registry import use_plugins

        use_plugins(first.plugins)
    runs = [job.run() for job in jobs]
    already = [peek_status(run.run_dir) for run in runs]
    callbacks = []
    if first.plan is not None and first.plan.during_training:
        from mecheval.experiments.mechanisms import EmergenceCallback

        callbacks.append(
            EmergenceCallback(
                runs[0].cfg.task,
                runs[0].cfg.model.n_layers,
                cache_dir=runs[0].cache_dir,
                documents=first.plan.documents,
            )
        )

    def reporter_for(members: Sequence[RunConfig]) -> QueueReporter:
        label = str(members[0].name) + (f" +{len(members) - 1}" if len(members) > 1 else "")
        return QueueReporter(label, progress, runs=len(members))

    reporter = reporter_for if progress is not None else None

    def train_some(indices: Sequence[int]) -> str:
        """Train these runs of the group; the crash that stopped them ("" if none)."""
        try:
            if len(indices) == 1:  # nothing to stack: the single-run trainer
                run = runs[indices[0]]
                train_run(run, callbacks, reporter=reporter([run.cfg]) if reporter else None)
            else:
                train_runs(
                    [runs[i] for i in indices],
                    callbacks=callbacks,
                    max_group=len(indices),
                    reporter_for=reporter,
                )
        except Exception as err:  # a crash of one group must not end the sweep
            return crash_text(err)
        return ""

    crash = train_some(range(len(jobs)))
    crashes = [crash] * len(jobs)
    if crash and len(jobs) > 1:
        # A crash ends the whole call, also where its runs train one after another (a group
        # that cannot be stacked; runs resumed from checkpoints first): the runs it kept
        # from starting, whose folders it left untouched, are independent of it and train
        # alone, each failing only on its own account.
        for i, (run, before) in enumerate(zip(runs, already, strict=True)):
            if not is_finished(before) and peek_status(run.run_dir) == before:
                crashes[i] = train_some([i])
    return [
        _finish(job, run, before, crash)
        for job, run, before, crash in zip(jobs, runs, already, crashes, strict=True)
    ]


def _finish(job: Job, run: ResolvedRun, before: Mapping[str, Any] | None, crash: str) -> Outcome:
    """A trained run's outcome, after its interventions when it is done."""
    status = peek_status(run.run_dir) or {}
    if crash and not is_finished(status):
        # The run's own reason where this attempt recorded one (the crash may be another's).
        own = status.get("state") == "failed" and status != (before or {})
        return Outcome(job.name, "failed", str(status.get("reason")) if own else crash)
    skipped = before is not None and before.get("state") == status.get("state") == "done"
    label = ""
    if status.get("state") == "done" and job.plan is not None:
        from mecheval.experiments.mechanisms import intervene_run, written_label

        try:
            intervene_run(run.run_dir, job.plan, skip_existing=True, run=run)
        except Exception as err:
            return Outcome(job.name, "failed", f"interventions: {type(err).__name__}: {err}")
        label = written_label(run.run_dir) or ""
    return Outcome(
        job.name,
        str(status.get("state")),
        status_reason(status),
        dict(status.get("metrics") or {}),
        skipped,
        label,
    )


class QueueReporter:
    """Sends a run's progress to the parent process (a training Reporter): at the start, at
    the last step, and in between every ``every`` steps or ``interval`` seconds, whichever
    comes first. The time bound keeps a slow model's display moving (Mamba's 40 tiny steps
    once showed 0/40 for 7 s); the step bound, the sweep's ETA close to the pace."""

    def __init__(
        self,
        name: str,
        sink: Any,
        every: int = 25,
        runs: int = 1,
        interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name, self.sink, self.every, self.runs = name, sink, every, runs
        self.interval, self.clock = interval, clock
        self.total = 0
        self.sent = -math.inf

    def _send(self, step: int, loss: float | None) -> None:
        self.sent = self.clock()
        self.sink.put(RunProgress(self.name, step, self.total, loss, self.runs, self.sent))

    def start(self, total: int, step: int) -> None:
        self.total = total
        self._send(step, None)

    def step(self, step: int, loss: float) -> None:
        due = self.clock() - self.sent >= self.interval
        if step % self.every == 0 or step == self.total or due:
            self._send(step, loss)

    def evaluated(self, step: int, results: Mapping[str, Mapping[str, float]]) -> None:
        pass

    def warn(self, text: str) -> None:
        print_warning(text)  # a worker's stderr is the sweep's

    def stop(self) -> None:
        pass


def prepare(run_dir: Path, retry_failed: bool) -> None:
    status = peek_status(run_dir)
    if retry_failed and status is not None and status.get("state") == "failed":
        (run_dir / STATUS_FILE).unlink()


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
    has it already); with ``check_devices``, every run's device must be on this machine
    (checked before any run folder is touched)."""
    sweep_dir = out_dir / spec.name
    threads = max(1, (os.cpu_count() or 1) // max(1, workers))
    planned = plan_runs(spec) if planned is None else planned
    for device in {cfg.training.device for _, cfg in planned} if check_devices else ():
        check_device(device)
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


def step_seconds(cfg: RunConfig) -> float:
    """One training step of ``cfg``'s (resolved) model at its batch shape (a typical batch's padded
    length, not the longest document), timed on one thread."""

    import torch

    from mecheval.models import build_model
    from mecheval.training.threads import torch_threads

    with torch_threads(1):
        with torch.random.fork_rng(devices=[]):
            model = build_model(cfg.model)
            length = cfg.task.typical_length(cfg.training.batch_size)
            tokens = torch.randint(0, cfg.model.vocab_size or 2, (cfg.training.batch_size, length))
            at = torch.full((cfg.training.batch_size,), length - 1)
            times = []
            for _ in range(3):  # the first is a warm-up
                start = time.perf_counter()
                model(tokens, at=at).logsumexp(-1).sum().backward()
                times.append(time.perf_counter() - start)
        return min(times[1:])


def estimated_seconds(jobs: Sequence[Job]) -> dict[str, float]:
    """Each job's training time, estimated as a step timed once per model shape times the
    run's steps; a finished run costs nothing."""
    from mecheval.training.config import total_steps

    per_shape: dict[str, float] = {}
    costs = {}
    for job in jobs:
        if is_finished(peek_status(Path(job.run_dir))):
            costs[job.name] = 0.0
            continue
        try:
            cfg = RunConfig.model_validate(job.config)
            shape = json.dumps([job.config["model"], cfg.training.batch_size], sort_keys=True)
            if shape not in per_shape:
                per_shape[shape] = step_seconds(cfg)
            costs[job.name] = per_shape[shape] * total_steps(cfg)
        except Exception:
            # A model that cannot take a step here fails in its worker, where the reason is
            # recorded; it must not end the sweep before any run starts.
            costs[job.name] = 0.0
    return costs


def longest_first(groups: Sequence[Sequence[Job]]) -> list[list[Job]]:
    """Groups of jobs by decreasing estimated training time (their runs' sum: a stack does
    every member's arithmetic), so that a pool of workers is not left waiting on one slow
    group started last."""
    costs = estimated_seconds([job for group in groups for job in group])
    return sorted(
        (list(group) for group in groups), key=lambda group: -sum(costs[j.name] for j in group)
    )


def auto_group_size(jobs: Sequence[Job]) -> int:
    """Stack runs only on a GPU: one small model leaves a GPU idle, while on a CPU a stack
    trained at 0.25-1.2x the speed of its runs one by one (benchmarks/bench_training.py,
    docs/performance.md)."""
    return GPU_GROUP_SIZE if _on_gpu(jobs) else 1


def _on_gpu(jobs: Sequence[Job]) -> bool:
    return any(job.device.startswith("cuda") for job in jobs)


def _in_job_order(
    jobs: Sequence[Job], groups: Sequence[Sequence[Job]], results: Sequence[Sequence[Outcome]]
) -> list[Outcome]:
    done = {
        job.name: outcome
        for group, outcomes in zip(groups, results, strict=True)
        for job, outcome in zip(group, outcomes, strict=True)
    }
    return [done[job.name] for job in jobs]


def group_jobs(jobs: Sequence[Job], group_size: int) -> list[list[Job]]:
    """Jobs partitioned into groups of at most ``group_size`` runs that train as one stacked
    model (same architecture and shapes, any LR/seed/decay/clipping: see
    ``mecheval.training.group.groupable``), in the order of the jobs."""
    if group_size < 1:
        raise ConfigError(f"--group-size: expected >= 1, got {group_size}")
    if group_size == 1:
        return [[job] for job in jobs]
    from mecheval.training.group import groupable

    by_worker: dict[tuple, list[Job]] = {}
    for job in jobs:  # a stack shares one worker's settings too
        by_worker.setdefault((job.threads, job.plan, job.cache_dir, job.plugins), []).append(job)
    groups = []
    for members in by_worker.values():
        cfgs = [RunConfig.model_validate(job.config) for job in members]
        groups += [[members[i] for i in g] for g in groupable(cfgs, max_size=group_size)]
    position = {job.name: i for i, job in enumerate(jobs)}
    return sorted(groups, key=lambda group: position[group[0].name])


def run_local(
    jobs: Sequence[Job],
    workers: int,
    on_progress: Callable[[SweepEvent], None] | None = None,
    group_size: int = 1,
) -> list[Outcome]:
    groups = group_jobs(jobs, group_size)
    if workers <= 1:
        sink = _CallbackSink(on_progress) if on_progress else None
        with stop_on_sigterm():
            results = []
            for group in groups:
                results.append(execute_group(group, sink))
                _announce(results[-1], on_progress)
            return _in_job_order(jobs, groups, results)
    # spawn, not fork: forking a process whose torch thread pool is running can deadlock.
    context = multiprocessing.get_context("spawn")
    ordered = longest_first(groups) if len(groups) > workers else groups
    # A plain queue handed to the workers as they start (no manager process to outlive us).
    sink = context.Queue() if on_progress else None
    with (
        stop_on_sigterm(),
        ProcessPoolExecutor(
            max_workers=workers,
            mp_context=context,
            initializer=_init_worker,
            initargs=(os.getpid(), sink),
        ) as pool,
    ):
        try:
            futures = [pool.submit(_execute_in_worker, group) for group in ordered]
            group_of = dict(zip(futures, ordered, strict=True))
            pending: set[Future] = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(sink, on_progress)  # a run's last steps before its outcome
                for future in done:
                    _announce(_outcomes(future, group_of[future]), on_progress)
            _drain(sink, on_progress)
        except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (Terminated)
            _stop_workers(pool, err)
            raise
        results = [_outcomes(f, group) for f, group in zip(futures, ordered, strict=True)]
    return _in_job_order(jobs, ordered, results)


def _announce(
    outcomes: Sequence[Outcome], on_progress: Callable[[SweepEvent], None] | None
) -> None:
    """Each run's outcome to the display as soon as its group is over, not at the sweep's end."""
    if on_progress is not None:
        for outcome in outcomes:
            on_progress(outcome)


def _outcomes(future: Future, group: Sequence[Job]) -> list[Outcome]:
    """A group's outcomes from its worker. execute_group raises nothing, so an error here is
    the worker's end (killed, out of memory, a crash in native code: BrokenProcessPool,
    which also fails the groups still queued): those runs fail with the reason, resumable
    by a rerun, rather than the sweep ending in a traceback."""
    try:
        return future.result()
    except Exception as err:
        reason = crash_text(err)
        return [Outcome(job.name, "failed", reason) for job in group]


# In a local worker: the signal that asked it to stop, whether it is running a job, whether
# the sweep's process is gone, and where progress goes.
_stop_signal: int | None = None
_busy = False
_orphaned = False
_sink: Any = None

#: How often a worker checks that the sweep's process is alive, and how long it gives its
#: run to record "crashed: interrupted" once it is not.
PARENT_POLL_S = 0.5
ORPHAN_GRACE_S = 30.0


def _init_worker(parent: int, sink: Any = None) -> None:
    global _sink
    _sink = sink
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_stop_signal)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int) -> None:
    """End this worker when the sweep's process is gone (``kill -9`` of it alone): its run
    records "crashed: interrupted (SIGTERM)" as on any stop and resumes with the next sweep,
    instead of training on unseen, beside the rerun that trains the same folder."""
    global _orphaned
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    _orphaned = True
    if not _busy:
        os._exit(1)
    os.kill(os.getpid(), signal.SIGTERM)  # the same path as a stop from the sweep
    time.sleep(ORPHAN_GRACE_S)
    os._exit(1)  # a run that did not stop in time: its checkpoint still resumes it


def _on_stop_signal(signum: int, frame: object) -> None:
    global _stop_signal
    first = _stop_signal is None
    _stop_signal = signum
    # Into a running job only (its run records "crashed: interrupted" and resumes later), and
    # once, so that a second signal cannot cut that status write short. An idle worker has
    # nothing to record: it ends at once (raising would print a traceback).
    if _busy and first:
        raise_interrupt(signum)
    if not _busy:
        _exit_now()


def _execute_in_worker(jobs: Sequence[Job]) -> list[Outcome]:
    global _busy
    _busy = True
    try:
        if _stop_signal is not None:
            raise_interrupt(_stop_signal)
        return execute_group(jobs, _sink)
    finally:
        _busy = False
        if _orphaned or _stop_signal is not None:
            # The run's status is written; nobody waits for the result (the sweep is
            # stopping or gone). Skipping the interpreter's teardown (seconds with torch
            # loaded on a busy machine) is what lets Ctrl-C end everything at once.
            _exit_now()


def _exit_now() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _stop_workers(pool: ProcessPoolExecutor, err: KeyboardInterrupt) -> None:
    """Pass an interrupt on to the workers (Ctrl-C reaches them too, SIGTERM only this
    process) and wait for them: running runs record their status, queued runs do not start,
    and no worker outlives the sweep."""
    signum = err.signum if isinstance(err, Terminated) else signal.SIGINT
    for process in list((pool._processes or {}).values()):  # no public API lists them
        with suppress(ProcessLookupError):
            os.kill(process.pid, signum)
    pool.shutdown(wait=True, cancel_futures=True)


def gpu_share(groups: Sequence[Sequence[Job]], cards: float) -> float:
    """The share of a GPU each group on one asks Ray for: a whole card while there are no
    more such groups than the cluster's ``cards``; else 1/k of one, k the groups each card
    then holds, so that they all train at once (Ray's CPU requests still cap how many run
    together). 0 where no group trains on a GPU."""
    on_gpu = sum(1 for group in groups if _on_gpu(group))
    if not on_gpu:
        return 0.0
    if cards <= 0:
        raise ConfigError(
            "training.device: cuda, but the Ray cluster declares no GPU "
            "(start its nodes with --num-gpus, or ray.init(num_gpus=N))"
        )
    if on_gpu <= cards:
        return 1.0
    return math.floor(1e4 / math.ceil(on_gpu / cards)) / 1e4  # Ray's resource precision


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
                remote.options(num_gpus=share if _on_gpu(group) else 0).remote(group)
                for group in groups
            ]
        )
    finally:
        if started_here:
            ray.shutdown()
    return _in_job_order(jobs, groups, results)


class _CallbackSink:
    def __init__(self, callback: Callable[[SweepEvent], None]) -> None:
        self.callback = callback

    def put(self, item: SweepEvent) -> None:
        self.callback(item)


def _drain(sink: Any, on_progress: Callable[[SweepEvent], None] | None) -> None:
    if sink is None or on_progress is None:
        return
    while True:
        try:
            on_progress(sink.get_nowait())
        except queue.Empty:
            return


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
    ``planned``: :func:`plan_runs` of ``spec`` where the caller has planned it already.

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
