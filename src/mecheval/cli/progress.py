"""Progress on stderr: bars on a terminal, plain periodic lines in a log, nothing with -q.

``train`` shows one run (a ``mecheval.training.reporter.Reporter``, in
:mod:`mecheval.cli.run_progress`); ``sweep`` and ``reproduce`` show a sweep from its events
(``mecheval.experiments.execution.jobs.SweepEvent``).
Where stderr is not a terminal (``make quick > log 2>&1``) a bar would draw nothing until
the end, so plain lines come instead: every :data:`PLAIN_EVERY` seconds and when a run ends.

What the lines say (ETAs from the measured pace, durations, the line texts) is computed by
pure functions and :class:`SweepTracker`, which takes its time from an injected clock.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

if TYPE_CHECKING:
    from mecheval.experiments.execution.jobs import Outcome, RunProgress, SweepEvent

#: Seconds between two plain progress lines (a log is read, not watched).
PLAIN_EVERY = 10.0

Clock = Callable[[], float]
Write = Callable[[str], None]


def write_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- arithmetic


def eta_seconds(done: int, remaining: float, elapsed: float) -> float | None:
    """Seconds that ``remaining`` steps take at the pace measured so far (``done`` steps in
    ``elapsed`` seconds); None before any step was measured."""
    if done <= 0:
        return None
    return max(elapsed, 0.0) / done * max(remaining, 0.0)


def format_duration(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``2h07m``; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


# ---------------------------------------------------------------------------- line texts


def dev_accuracy(metrics: Mapping[str, Any]) -> float | None:
    """The final dev accuracy in a run's metrics (``{"dev": {"accuracy": ...}}``)."""
    value = (metrics.get("dev") or {}).get("accuracy")
    return float(value) if isinstance(value, int | float) else None


def run_line(
    elapsed: float,
    name: str,
    step: int,
    total: int,
    loss: float | None,
    eta: float | None,
    evals: str = "",
) -> str:
    """``[1m05s] mamba 25/40 loss 2.310 ETA 12s dev acc 0.312``: one run's progress."""
    parts = [f"[{format_duration(elapsed)}] {name} {step}/{total}"]
    if loss is not None:
        parts.append(f"loss {loss:.3f}")
    parts.append(f"ETA {format_duration(eta)}")
    if evals:
        parts.append(evals)
    return " ".join(parts)


def sweep_line(
    elapsed: float,
    over: int,
    total_runs: int,
    eta: float | None,
    running: Sequence[tuple[str, int, int, float | None]],
) -> str:
    """``[1m05s] 3/7 runs over, ETA 40s | mamba 25/40 ETA 3s, h3 10/40 ETA 9s``: a sweep's
    progress, then each running run's (name, step, total, ETA)."""
    head = f"[{format_duration(elapsed)}] {over}/{total_runs} runs over, ETA {format_duration(eta)}"
    runs = [f"{n} {step}/{total} ETA {format_duration(e)}" for n, step, total, e in running]
    return head + (" | " + ", ".join(runs) if runs else "")


def outcome_line(
    elapsed: float, outcome: Outcome, seconds: float | None, over: int, total_runs: int
) -> str:
    """``[1m05s] done mamba in 4s: dev accuracy 18.8%, mechanism not learned (3/7 runs
    over)``: the line of a run that ended (``seconds``: its time, None if not seen)."""
    if outcome.state == "done":
        word = "done (already)" if outcome.skipped else "done"
    else:
        word = outcome.state.upper()
    took = "" if outcome.skipped or seconds is None else f" in {format_duration(seconds)}"
    details = []
    accuracy = dev_accuracy(outcome.metrics)
    if accuracy is not None:
        details.append(f"dev accuracy {100 * accuracy:.1f}%")
    if outcome.label:
        details.append(f"mechanism {outcome.label}")
    if outcome.reason:
        details.append(outcome.reason)
    said = ": " + ", ".join(details) if details else ""
    return (
        f"[{format_duration(elapsed)}] {word} {outcome.name}{took}{said} "
        f"({over}/{total_runs} runs over)"
    )


# ---------------------------------------------------------------------------- a sweep's state


@dataclass
class _Running:
    since: float  # when the run's first event was sent
    first: int  # its step then (a resumed run starts past 0)
    step: int
    total: int
    runs: int  # runs trained as one model (a stack), 1 on a CPU
    at: float  # when its latest event was sent
    loss: float | None = None


class SweepTracker:
    """A sweep's progress from its events, and the ETAs it implies, at ``clock``'s time.

    A run's ETA is its steps left at its own measured pace. The sweep's is the steps left of
    every run (the running ones', plus the runs not started at the mean steps of the runs
    seen, times the share of their steps that the runs over trained: below 1 where runs stop
    early at ``training.stop_at_accuracy``) at the whole sweep's pace: steps trained per
    second since the first step, across all workers, so interventions and parallel workers
    are priced in as measured. A running run's steps left are counted to its last step."""

    def __init__(self, total_runs: int, clock: Clock = time.monotonic) -> None:
        self.total_runs = total_runs
        self.clock = clock
        self.start = clock()
        self.first_event: float | None = None
        self.running: dict[str, _Running] = {}
        self.over = 0
        self.steps_over = 0  # steps trained by runs already over
        self.planned_over = 0  # the steps those runs had left when first seen
        self.seen_steps = 0  # the steps (totals) of every run seen, and their count
        self.seen_runs = 0

    def elapsed(self) -> float:
        return self.clock() - self.start

    def progress(self, event: RunProgress) -> None:
        at = self.clock() if event.at is None else event.at
        if self.first_event is None:
            self.first_event = at
        run = self.running.get(event.name)
        if run is None:
            run = _Running(at, event.step, event.step, event.total, event.runs, at)
            self.running[event.name] = run
            self.seen_steps += event.total
            self.seen_runs += event.runs
        run.step, run.total, run.loss, run.at = event.step, event.total, event.loss, at

    def finish(self, outcome: Outcome) -> float | None:
        """Count the run as over; its seconds since its first event (None: never seen)."""
        self.over += 1
        run = self._pop(outcome.name)
        if run is None:
            return None
        self.steps_over += run.step - run.first
        self.planned_over += run.total - run.first
        return self.clock() - run.since

    def _pop(self, name: str) -> _Running | None:
        if name in self.running:
            return self.running.pop(name)
        # A stack reports as "<first run> +<n>"; its first run's outcome ends it.
        stack = next((key for key in self.running if key.startswith(f"{name} +")), None)
        return None if stack is None else self.running.pop(stack)

    def run_eta(self, name: str) -> float | None:
        run = self.running[name]
        # The pace between its events, as sent: the time since the latest belongs to no step.
        return eta_seconds(run.step - run.first, run.total - run.step, run.at - run.since)

    def sweep_eta(self) -> float | None:
        if self.first_event is None:
            return None
        trained = self.steps_over + sum(r.step - r.first for r in self.running.values())
        left = sum(r.total - r.step for r in self.running.values())
        not_started = self.total_runs - self.over - sum(r.runs for r in self.running.values())
        if not_started > 0 and self.seen_runs:
            share = self.steps_over / self.planned_over if self.planned_over else 1.0
            left += not_started * self.seen_steps / self.seen_runs * share
        return eta_seconds(trained, left, self.clock() - self.first_event)

    def running_now(self) -> list[tuple[str, int, int, float | None]]:
        """(name, step, total, ETA) of each running run, in the order they started."""
        return [(n, r.step, r.total, self.run_eta(n)) for n, r in self.running.items()]

    def status_line(self) -> str:
        return sweep_line(
            self.elapsed(), self.over, self.total_runs, self.sweep_eta(), self.running_now()
        )


def _outcome(event: SweepEvent) -> Outcome | None:
    """The event as a run's outcome; None for a progress event. (Imported on use: the
    runners weigh half a second on a CLI that may only print --help.)"""
    from mecheval.experiments.execution.jobs import Outcome

    return event if isinstance(event, Outcome) else None


# ---------------------------------------------------------------------------- sweep displays


class PlainLines:
    """Progress as plain lines through ``write`` (a log has no terminal to redraw), the
    periodic ones at most every ``every`` seconds (:meth:`due`)."""

    def __init__(
        self, write: Write = write_stderr, clock: Clock = time.monotonic, every: float = PLAIN_EVERY
    ) -> None:
        self.write, self.clock, self.every = write, clock, every
        self.last = self.clock()

    def due(self) -> bool:
        """Whether ``every`` seconds have passed since the last periodic line; if so, the
        wait starts again."""
        if self.clock() - self.last < self.every:
            return False
        self.last = self.clock()
        return True


class PlainSweepLog(PlainLines):
    """A sweep's progress as plain lines (for a log): the status every ``every`` seconds,
    and a line when a run ends."""

    def __init__(self, total_runs: int, **lines: Any) -> None:
        super().__init__(**lines)
        self.tracker = SweepTracker(total_runs, self.clock)

    def __enter__(self) -> PlainSweepLog:
        # At once: starting the workers and the first runs' datasets can take a while.
        self.write(self.tracker.status_line())
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def update(self, event: SweepEvent) -> None:
        tracker = self.tracker
        outcome = _outcome(event)
        if outcome is not None:
            seconds = tracker.finish(outcome)
            self.write(
                outcome_line(tracker.elapsed(), outcome, seconds, tracker.over, tracker.total_runs)
            )
            return
        tracker.progress(cast("RunProgress", event))
        if self.due():
            self.write(tracker.status_line())


class SweepDisplay:
    """A sweep on a terminal: one bar per running run (with its ETA), an overall bar (with
    the sweep's), and a line above them when a run ends."""

    def __init__(self, total_runs: int, clock: Clock = time.monotonic) -> None:
        self.tracker = SweepTracker(total_runs, clock)
        self.progress = Progress(
            TextColumn("{task.description:<28}"),
            BarColumn(),
            TextColumn("{task.completed:>6.0f}/{task.total:<6.0f}"),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self.overall = self.progress.add_task("all runs", total=total_runs, info="")
        self.jobs: dict[str, TaskID] = {}

    def __enter__(self) -> SweepDisplay:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def update(self, event: SweepEvent) -> None:
        tracker = self.tracker
        outcome = _outcome(event)
        if outcome is not None:
            self._ended(outcome)
        else:
            self._stepped(cast("RunProgress", event))
        self.progress.update(
            self.overall,
            completed=tracker.over,
            info=f"ETA {format_duration(tracker.sweep_eta())}",
        )

    def _stepped(self, event: RunProgress) -> None:
        self.tracker.progress(event)
        if event.name not in self.jobs:
            self.jobs[event.name] = self.progress.add_task(event.name, total=event.total, info="")
        loss = "" if event.loss is None else f"loss {event.loss:.3f}  "
        eta = format_duration(self.tracker.run_eta(event.name))
        self.progress.update(self.jobs[event.name], completed=event.step, info=f"{loss}ETA {eta}")

    def _ended(self, outcome: Outcome) -> None:
        tracker = self.tracker
        seconds = tracker.finish(outcome)
        for name in [n for n in self.jobs if n not in tracker.running]:
            self.progress.remove_task(self.jobs.pop(name))
        line = outcome_line(tracker.elapsed(), outcome, seconds, tracker.over, tracker.total_runs)
        # Above the bars, as text, not markup; one line however long.
        self.progress.console.print(line, markup=False, highlight=False, soft_wrap=True)


class QuietSweep:
    """``-q``: no progress at all."""

    def __enter__(self) -> QuietSweep:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def update(self, event: SweepEvent) -> None:
        pass


def sweep_display(total_runs: int, quiet: bool) -> QuietSweep | PlainSweepLog | SweepDisplay:
    """The sweep's progress display: none with ``quiet``, bars on a terminal, else lines."""
    if quiet:
        return QuietSweep()
    return SweepDisplay(total_runs) if sys.stderr.isatty() else PlainSweepLog(total_runs)
