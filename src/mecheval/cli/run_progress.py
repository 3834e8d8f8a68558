"""One run's progress (``mecheval train``): a bar on a terminal, plain periodic lines in a log,
only its warnings with -q; a ``mecheval.training.reporter.Reporter`` that training reports to.
A sweep's display, the line texts and the ETAs are in :mod:`mecheval.cli.progress`."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

from mecheval.cli.progress import Clock, PlainLines, eta_seconds, run_line
from mecheval.training.reporter import NullReporter, Reporter, print_warning

#: Seconds between two redraws of a bar at the most when steps are slow.
BAR_EVERY = 0.5


def run_reporter(label: str, quiet: bool) -> Reporter:
    """The reporter of one run: a bar on a terminal, plain lines in a log, or with ``quiet``
    only its warnings."""
    if quiet:
        return NullReporter()
    return RichReporter(label) if sys.stderr.isatty() else PlainReporter(label)


def _evals_text(results: Mapping[str, Mapping[str, float]]) -> str:
    dev = results.get("dev") or next(iter(results.values()), None)
    return "" if dev is None else f"acc {dev['accuracy']:.3f} p(y) {dev['likelihood']:.3f}"


class PlainReporter(PlainLines):
    """One run's progress as plain lines: at the start, every ``every`` seconds, at the end."""

    def __init__(self, label: str, **lines: Any) -> None:
        super().__init__(**lines)
        self.label = label
        self.total = self.first = self.now = 0
        self.since = 0.0
        self.loss: float | None = None
        self.evals = ""

    def _line(self) -> str:
        elapsed = self.clock() - self.since
        eta = eta_seconds(self.now - self.first, self.total - self.now, elapsed)
        return run_line(elapsed, self.label, self.now, self.total, self.loss, eta, self.evals)

    def start(self, total: int, step: int) -> None:
        self.total, self.first, self.now = total, step, step
        self.since = self.last = self.clock()
        self.write(self._line())

    def step(self, step: int, loss: float) -> None:
        self.now, self.loss = step, loss
        # The last step's line is stop()'s, with the final evaluation.
        if step < self.total and self.due():
            self.write(self._line())

    def evaluated(self, step: int, results: Mapping[str, Mapping[str, float]]) -> None:
        self.evals = _evals_text(results)

    def warn(self, text: str) -> None:
        print_warning(text)

    def stop(self) -> None:
        self.write(self._line())


class RichReporter:
    """A rich progress bar on stderr: step, loss (smoothed), steps/s, ETA, last dev metrics.
    Redrawn every ``refresh_every`` steps or :data:`BAR_EVERY` seconds, whichever is first."""

    def __init__(self, label: str, refresh_every: int = 10, clock: Clock = time.monotonic) -> None:
        self.label = label
        self.refresh_every = refresh_every
        self.clock = clock
        self.last = -math.inf
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        self.smoothed: float | None = None

    def start(self, total: int, step: int) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[speed]} steps/s"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[evals]}"),
            console=Console(stderr=True),
            transient=False,
        )
        self.progress.start()
        self.task = self.progress.add_task(
            self.label, total=total, completed=step, loss="-", speed="-", evals=""
        )

    def step(self, step: int, loss: float) -> None:
        self.smoothed = loss if self.smoothed is None else 0.98 * self.smoothed + 0.02 * loss
        due = step % self.refresh_every == 0 or self.clock() - self.last >= BAR_EVERY
        if self.progress is not None and self.task is not None and due:
            self.last = self.clock()
            speed = self.progress.tasks[0].speed
            self.progress.update(
                self.task,
                completed=step,
                loss=f"{self.smoothed:.3f}",
                speed="-" if speed is None else f"{speed:.0f}",
            )

    def evaluated(self, step: int, results: Mapping[str, Mapping[str, float]]) -> None:
        if self.progress is not None and self.task is not None and results:
            self.progress.update(self.task, completed=step, evals=_evals_text(results))

    def warn(self, text: str) -> None:
        if self.progress is None:
            print_warning(text)
            return
        # Above the bar, not through it; one line however long (soft_wrap), as text, not markup.
        self.progress.console.print(
            f"warning: {text}", markup=False, highlight=False, soft_wrap=True
        )

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
