"""What training tells whoever watches it: progress, evaluations and warnings.

Training only calls a :class:`Reporter`; how it is shown (a progress bar on a terminal, a
queue to a sweep's parent process, nothing) is the caller's choice, so that training never
draws on a terminal itself (the CLI's reporters live in ``mecheval.cli.progress``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from mecheval.training.config import RunConfig


class Reporter(Protocol):
    def start(self, total: int, step: int) -> None: ...
    def step(self, step: int, loss: float) -> None: ...
    def evaluated(self, step: int, results: Mapping[str, Mapping[str, float]]) -> None: ...
    def warn(self, text: str) -> None: ...
    def stop(self) -> None: ...


#: Makes the reporter of one stack of runs (or one run: a list of one config).
ReporterFactory = Callable[[Sequence["RunConfig"]], Reporter]


def print_warning(text: str) -> None:
    """``warning: <text>`` on stderr, in one line."""
    print(f"warning: {text}", file=sys.stderr, flush=True)


class NullReporter:
    """Shows no progress. Warnings still go to stderr, as Python's own do: one concerns what
    happened to the user's files (a discarded checkpoint), which must not pass silently
    where nobody displays progress (a library call, a quiet sweep worker)."""

    def start(self, total: int, step: int) -> None:
        pass

    def step(self, step: int, loss: float) -> None:
        pass

    def evaluated(self, step: int, results: Mapping[str, Mapping[str, float]]) -> None:
        pass

    def warn(self, text: str) -> None:
        print_warning(text)

    def stop(self) -> None:
        pass


def null_reporter(cfgs: Sequence[RunConfig]) -> Reporter:
    """A :data:`ReporterFactory` of :class:`NullReporter`."""
    return NullReporter()
