"""Taking turns: threads of one process that run side by side on a GPU, one at a time on the host.

Why: one stack's training step, replayed as a CUDA graph, leaves most of a GPU idle at the
paper's sizes; stacks on CUDA streams of their own fill each other's gaps
(benchmarks/bench_streams.py). Their host code must not run at once, though: a graph capture
fails if another thread touches CUDA meanwhile, model init seeds the global RNG, precision
switches are process-wide. So the threads share a :class:`Baton`: only its holder runs (builds,
trains, evaluates, intervenes), and a holder that has launched a training step hands the baton
on (:func:`pass_turn`); its kernels keep running on its stream while the next thread launches
its own. Each thread's work is what it would be alone, so the results are those of one group
after another, bit for bit.

A thread holds the baton from :meth:`Baton.take` to :meth:`Baton.give`; the trainers call
:func:`pass_turn` after each step, which does nothing in a thread that holds no baton.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

_local = threading.local()


class Baton:
    """First come, first served: a thread that hands the baton on queues behind the others."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._line: deque[int] = deque()
        self._holder: int | None = None
        #: Set (by the thread that started the others) to stop them: each raises what it
        #: returns at its next turn, so that its run records how it stopped.
        self.stop: Callable[[], BaseException] | None = None

    def take(self) -> None:
        """Wait in line for the baton, then hold it (raises :attr:`stop`'s exception, still
        holding it, once the threads are asked to stop)."""
        me = threading.get_ident()
        with self._changed:
            self._line.append(me)
            self._changed.wait_for(lambda: self._holder is None and self._line[0] == me)
            self._line.popleft()
            self._holder = me
        _local.baton = self
        self._raise_if_stopped()

    def give(self) -> None:
        """Let the next thread in line run (a thread ending its work gives the baton back)."""
        with self._changed:
            if self._holder != threading.get_ident():
                return
            self._holder = None
            self._changed.notify_all()
        _local.baton = None

    def pass_on(self) -> None:
        """Let every thread waiting run once, then go on (at once when none waits)."""
        with self._changed:
            waiting = bool(self._line)
        if waiting:
            self.give()
            self.take()
        else:
            self._raise_if_stopped()

    def _raise_if_stopped(self) -> None:
        if self.stop is not None:
            raise self.stop()


def taking_turns() -> bool:
    """Whether this thread runs side by side with others (holds a baton)."""
    return getattr(_local, "baton", None) is not None


def pass_turn() -> None:
    """Hand the baton on if this thread holds one (see the module docstring)."""
    baton: Baton | None = getattr(_local, "baton", None)
    if baton is not None:
        baton.pass_on()
