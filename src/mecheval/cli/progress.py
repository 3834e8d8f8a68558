"""Progress on the terminal (stderr): a bar for one run, a line per job for a sweep.

Training only talks to a ``mecheval.training.reporter.Reporter``; these are the CLI's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from mecheval.training.reporter import NullReporter, Reporter, print_warning


def run_reporter(label: str, quiet: bool) -> Reporter:
    """The reporter of one run: a progress bar, or with ``quiet`` only its warnings."""
    return NullReporter() if quiet else RichReporter(label)


class RichReporter:
    """A rich progress bar on stderr: step, loss (smoothed), steps/s, ETA, last dev metrics."""

    def __init__(self, label: str, refresh_every: int = 10) -> None:
        self.label = label
        self.refresh_every = refresh_every
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
        if self.progress is not None and self.task is not None and step % self.refresh_every == 0:
            speed = self.progress.tasks[0].speed
            self.progress.update(
                self.task,
                completed=step,
                loss=f"{self.smoothed:.3f}",
                speed="-" if speed is None else f"{speed:.0f}",
            )

    def evaluated(self, step: int, results: Mapping[str, Mapping[str, float]]) -> None:
        dev = results.get("dev") or next(iter(results.values()), None)
        if dev is not None and self.progress is not None and self.task is not None:
            self.progress.update(
                self.task,
                completed=step,
                evals=f"acc {dev['accuracy']:.3f} p(y) {dev['likelihood']:.3f}",
            )

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


class SweepDisplay:
    """One progress line per running job plus an overall bar (on stderr)."""

    def __init__(self, total_runs: int, enabled: bool) -> None:
        self.progress = Progress(
            TextColumn("{task.description:<28}"),
            BarColumn(),
            TextColumn("{task.completed:>6.0f}/{task.total:<6.0f}"),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            disable=not enabled,
            transient=False,
        )
        self.overall = self.progress.add_task("all runs", total=total_runs, info="")
        self.jobs: dict[str, TaskID] = {}
        self.finished: set[str] = set()

    def __enter__(self) -> SweepDisplay:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def update(self, item: tuple) -> None:
        name, step, total, loss, runs = item
        if name not in self.jobs:
            self.jobs[name] = self.progress.add_task(name, total=total, info="")
        info = f"loss {loss:.3f}" if loss is not None else ""
        self.progress.update(self.jobs[name], completed=step, total=total, info=info)
        if step >= total and name not in self.finished:
            self.finished.add(name)
            self.progress.update(self.overall, advance=runs)
            self.progress.remove_task(self.jobs[name])
