"""A sweep's groups side by side on one GPU: ``--workers N`` where every run trains on the same
CUDA device runs N groups at once as N threads of the sweep's process, each launching its work
on a CUDA stream of its own and taking turns on the host (mecheval.training.turns), instead of
N worker processes, which a GPU would run one after another.

Why: a stack's replayed step leaves most of a GPU idle at the paper's sizes, and the stacks of
different architectures (one per group) fill each other's gaps; see docs/sweeps.md for what it
gains. Each thread's work is what one worker would do with its groups, in the same order, so
every run's results equal those of ``--workers 1``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence

from mecheval.experiments.execution.jobs import (
    CallbackSink,
    Job,
    Outcome,
    SweepEvent,
    announce,
    execute_group,
)
from mecheval.training.run import Terminated
from mecheval.training.threads import usable_cores
from mecheval.training.turns import Baton

#: How often the sweep's thread looks up from waiting, so that Ctrl-C reaches it.
JOIN_POLL_S = 0.2


def on_one_gpu(jobs: Sequence[Job]) -> bool:
    """Whether every job trains on one and the same CUDA device."""
    devices = {job.device for job in jobs}
    return len(devices) == 1 and next(iter(devices)).startswith("cuda")


def run_side_by_side(
    groups: Sequence[Sequence[Job]],
    workers: int,
    on_progress: Callable[[SweepEvent], None] | None = None,
) -> list[list[Outcome]]:
    """Each group's outcomes, in the order of ``groups``, each group executed by one of
    ``workers`` threads (the next group in line goes to the first thread free).

    An interrupt (Ctrl-C, SIGTERM) reaches every thread at its next turn: its running runs
    record "crashed: interrupted" as with worker processes, the groups not started stay
    untouched, and the interrupt is raised once every thread has stopped."""
    import torch

    # One process: its torch threads are every core's, not a worker's share.
    cores = usable_cores()
    queued = deque(
        (i, [dataclasses.replace(job, threads=cores) for job in group])
        for i, group in enumerate(groups)
    )
    results: dict[int, list[Outcome]] = {}
    errors: list[BaseException] = []
    baton = Baton()
    sink = CallbackSink(on_progress) if on_progress else None

    def work() -> None:
        try:
            baton.take()
            device = torch.device(queued[0][1][0].device) if queued else None
            stream = (
                torch.cuda.stream(torch.cuda.Stream(device))
                if device is not None and device.type == "cuda"
                else contextlib.nullcontext()
            )
            with stream:
                while queued:  # only the baton's holder reads or changes the queue
                    i, group = queued.popleft()
                    results[i] = execute_group(group, sink)
                    announce(results[i], on_progress)
                    baton.pass_on()
        except BaseException as err:  # noqa: BLE001 - raised in the sweep's thread below
            errors.append(err)
        finally:
            baton.give()

    threads = [
        threading.Thread(target=work, name=f"mecheval-side-by-side-{n}", daemon=True)
        for n in range(min(workers, len(groups)))
    ]
    for thread in threads:
        thread.start()
    with _first_interrupt_only():
        try:
            _wait(threads)
        except KeyboardInterrupt as err:
            signum = err.signum if isinstance(err, Terminated) else None
            baton.stop = (lambda: Terminated(signum)) if signum is not None else KeyboardInterrupt
            _wait(threads)
            raise
    stops = [err for err in errors if isinstance(err, KeyboardInterrupt)]
    if errors:
        raise (stops or errors)[0]
    return [results[i] for i in range(len(groups))]


@contextlib.contextmanager
def _first_interrupt_only() -> Iterator[None]:
    """Within, only the first Ctrl-C or SIGTERM raises (through the handler in place); later
    ones are ignored. Why: the threads record their runs' statuses after the first, and a
    second (``timeout`` signals the command and then its process group, a user presses
    Ctrl-C twice) would end the process under them, leaving runs marked "running". Worker
    processes ignore a second signal the same way (pool.py)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals are handled in the main thread only
        return
    previous: dict[int, Callable[[int, object], object]] = {}
    seen = False

    def once(signum: int, frame: object) -> None:
        nonlocal seen
        if not seen:
            seen = True
            previous[signum](signum, frame)

    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if callable(handler):  # one that raises (Ctrl-C's default, stop_on_sigterm's)
            previous[signum] = handler
            signal.signal(signum, once)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _wait(threads: Sequence[threading.Thread]) -> None:
    for thread in threads:
        while thread.is_alive():
            thread.join(JOIN_POLL_S)
