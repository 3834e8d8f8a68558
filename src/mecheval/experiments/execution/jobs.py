"""A sweep's unit of work: a job (one planned run as its worker receives it), a group of
jobs trained and intervened in one worker, and what the worker sends back (progress while
the runs train, each run's outcome when it is over).

A group never raises for its runs' sake: whatever goes wrong in it (its training, its
plugins, its interventions) comes back as failed outcomes with the reason, so that the sweep
goes on with its other groups.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mecheval.experiments.mechanisms import InterventionPlan, measured_as_planned
from mecheval.experiments.store import status_reason
from mecheval.training.config import RunConfig
from mecheval.training.folder import is_finished, peek_status
from mecheval.training.reporter import print_warning
from mecheval.training.resolved import ResolvedRun


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

    def is_over(self) -> bool:
        """Nothing left for a worker to do: the run is finished and, where the job plans
        interventions and the run is done, they were measured as planned."""
        status = peek_status(Path(self.run_dir))
        if not is_finished(status):
            return False
        done = status is not None and status.get("state") == "done"
        return self.plan is None or not done or measured_as_planned(Path(self.run_dir), self.plan)


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


class CallbackSink:
    """Where a worker in the sweep's own process sends its events: straight to the callback."""

    def __init__(self, callback: Callable[[SweepEvent], None]) -> None:
        self.callback = callback

    def put(self, item: SweepEvent) -> None:
        self.callback(item)


def announce(outcomes: Sequence[Outcome], on_progress: Callable[[SweepEvent], None] | None) -> None:
    """Each run's outcome to the display as soon as its group is over, not at the sweep's end."""
    if on_progress is not None:
        for outcome in outcomes:
            on_progress(outcome)


def crash_text(err: BaseException) -> str:
    """``crashed: <type>: <message>`` in one line (a validation error as its field)."""
    from pydantic import ValidationError

    from mecheval.errors import describe

    message = describe(err) if isinstance(err, ValidationError) else str(err).strip()
    return f"crashed: {type(err).__name__}: {(message.splitlines() or [''])[0]}".rstrip(": ")


def execute_group(jobs: Sequence[Job], progress: Any = None) -> list[Outcome]:
    """Train a group of runs (one stacked model where they form one, see
    ``mecheval.training.stacking.group``; skip/resume as their folders say), then intervene in each.
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
    from mecheval.training.run import train_run
    from mecheval.training.stacking.group import replays_alone, train_runs
    from mecheval.training.threads import set_torch_threads

    first = jobs[0]
    set_torch_threads(first.threads)
    if first.plugins:
        from mecheval.models.registry import use_plugins

        use_plugins(first.plugins)
    runs = [job.run() for job in jobs]
    already = [peek_status(run.run_dir) for run in runs]
    callbacks = _emergence(first.plan, runs[0])

    reporter = _reporters(progress) if progress is not None else None

    def train_some(indices: Sequence[int]) -> str:
        """Train these runs of the group; the crash that stopped them ("" if none)."""
        members = [runs[i] for i in indices]
        try:
            if len(members) == 1 and not replays_alone(members[0]):
                # The plain road: a lone run that no CUDA graph replays is the single-run trainer's.
                lone = members[0]
                train_run(lone, callbacks, reporter=reporter([lone.cfg]) if reporter else None)
            else:
                train_runs(
                    members, callbacks=callbacks, max_group=len(indices), reporter_for=reporter
                )
        except Exception as err:  # a crash of one group must not end the sweep
            return crash_text(err)
        return ""

    crash = train_some(range(len(jobs)))
    crashes = [crash] * len(jobs)
    if crash and len(jobs) > 1:
        # A crash ends the whole call, also where its runs train one after another (a group
        # that cannot be stacked; resumed runs before fresh ones): the runs it kept
        # from starting, whose folders it left untouched, are independent of it and train
        # alone, each failing only on its own account.
        for i, (run, before) in enumerate(zip(runs, already, strict=True)):
            if not is_finished(before) and peek_status(run.run_dir) == before:
                crashes[i] = train_some([i])
    return [
        _finish(job, run, before, crash)
        for job, run, before, crash in zip(jobs, runs, already, crashes, strict=True)
    ]


def _reporters(progress: Any) -> Callable[[Sequence[RunConfig]], QueueReporter]:
    """A reporter per run or stack, sending its progress to ``progress``, named after its
    first run (``+N``: the other runs of its stack)."""

    def reporter_for(members: Sequence[RunConfig]) -> QueueReporter:
        label = str(members[0].name) + (f" +{len(members) - 1}" if len(members) > 1 else "")
        return QueueReporter(label, progress, runs=len(members))

    return reporter_for


def _emergence(plan: InterventionPlan | None, run: ResolvedRun) -> list[Any]:
    """The callback that measures the mechanism at every evaluation where the plan asks for
    it (the group's runs share their task and shape)."""
    if plan is None or not plan.during_training:
        return []
    from mecheval.experiments.mechanisms import EmergenceCallback

    task, n_layers = run.cfg.task, run.cfg.model.n_layers
    return [EmergenceCallback(task, n_layers, cache_dir=run.cache_dir, documents=plan.documents)]


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
