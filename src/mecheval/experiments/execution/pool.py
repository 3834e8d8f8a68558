"""The local process pool a sweep runs its groups in (``--workers``), and how its workers
stop: Ctrl-C and SIGTERM reach every worker, a running run records "crashed: interrupted"
and resumes when the sweep runs again, and a worker whose sweep process is gone ends itself.
Where every run trains on one GPU the workers are threads instead (side_by_side.py).
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import suppress
from typing import Any

import torch

from mecheval.experiments.execution.jobs import (
    CallbackSink,
    Job,
    Outcome,
    SweepEvent,
    announce,
    crash_text,
    execute_group,
)
from mecheval.experiments.execution.scheduling import group_jobs, in_job_order, longest_first
from mecheval.experiments.execution.server import worker_context
from mecheval.experiments.execution.side_by_side import on_one_gpu, run_side_by_side
from mecheval.training.run import Terminated, raise_interrupt, stop_on_sigterm
from mecheval.training.stacking.captured import graphs_enabled


def lone_runs_replay(groups: Sequence[Sequence[Job]]) -> bool:
    """Whether every group is a lone run on a device where its step would be replayed: then
    they train in this process one after another, whatever ``workers`` (side by side a lone
    run trains eagerly, see stacking/group.py; one after another it is replayed, several
    times faster on a card)."""
    return all(len(group) == 1 for group in groups) and all(
        graphs_enabled(torch.device(group[0].device)) for group in groups
    )


def run_local(
    jobs: Sequence[Job],
    workers: int,
    on_progress: Callable[[SweepEvent], None] | None = None,
    group_size: int = 1,
) -> list[Outcome]:
    groups = group_jobs(jobs, group_size)
    # A sweep whose runs are all over (a rerun to see its results) reads their outcomes here:
    # no worker has anything to do.
    if (
        workers <= 1
        or all(job.is_over() for job in jobs)
        or (on_one_gpu(jobs) and lone_runs_replay(groups))
    ):
        sink = CallbackSink(on_progress) if on_progress else None
        with stop_on_sigterm():
            results = []
            for group in groups:
                results.append(execute_group(group, sink))
                announce(results[-1], on_progress)
            return in_job_order(jobs, groups, results)
    ordered = longest_first(groups) if len(groups) > workers else groups
    if on_one_gpu(jobs):  # worker processes would take turns on the card: threads share it
        with stop_on_sigterm():
            return in_job_order(jobs, ordered, run_side_by_side(ordered, workers, on_progress))
    return _run_in_workers(jobs, ordered, workers, on_progress)


def _run_in_workers(
    jobs: Sequence[Job],
    ordered: list[list[Job]],
    workers: int,
    on_progress: Callable[[SweepEvent], None] | None,
) -> list[Outcome]:
    """The groups in ``workers`` worker processes, in the order given."""
    context = worker_context()
    # A plain queue handed to the workers as they start (no manager process to outlive us).
    sink = context.Queue() if on_progress else None
    with (
        stop_on_sigterm(),
        ProcessPoolExecutor(
            max_workers=workers,
            mp_context=context,
            initializer=_init_worker,
            initargs=(os.getpid(), sink, dict(os.environ), os.getcwd(), list(sys.path)),
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
                    announce(_outcomes(future, group_of[future]), on_progress)
            _drain(sink, on_progress)
        except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (Terminated)
            _stop_workers(pool, err)
            raise
        results = [_outcomes(f, group) for f, group in zip(futures, ordered, strict=True)]
    return in_job_order(jobs, ordered, results)


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


def _init_worker(
    sweep: int, sink: Any, environment: dict[str, str], folder: str, import_path: list[str]
) -> None:
    global _sink
    _sink = sink
    # A forked worker starts with the forkserver's environment, folder and import path, which
    # are those of the sweep's process when the server started, not now: the sweep's now.
    os.environ.clear()
    os.environ.update(environment)
    os.chdir(folder)
    sys.path[:] = import_path
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_stop_signal)
    # The parent is the sweep's process (spawn) or the forkserver, which ends with it.
    threading.Thread(target=_watch_parent, args=(sweep, os.getppid()), daemon=True).start()


def _watch_parent(sweep: int, parent: int) -> None:
    """End this worker when the sweep's process is gone (``kill -9`` of it alone): its run
    records "crashed: interrupted (SIGTERM)" as on any stop and resumes with the next sweep,
    instead of training on unseen, beside the rerun that trains the same folder."""
    global _orphaned
    while os.getppid() == parent and _alive(sweep):
        time.sleep(PARENT_POLL_S)
    _orphaned = True
    if not _busy:
        os._exit(1)
    os.kill(os.getpid(), signal.SIGTERM)  # the same path as a stop from the sweep
    time.sleep(ORPHAN_GRACE_S)
    os._exit(1)  # a run that did not stop in time: its checkpoint still resumes it


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone (or its number taken by another user)
        return False
    return True


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


def _drain(sink: Any, on_progress: Callable[[SweepEvent], None] | None) -> None:
    if sink is None or on_progress is None:
        return
    while True:
        try:
            on_progress(sink.get_nowait())
        except queue.Empty:
            return
