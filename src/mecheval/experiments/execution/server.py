"""How the local pool's worker processes start (pool.py): on Linux, forked from one server
process that imported torch and mecheval once, where a fresh interpreter takes seconds to
import them again. The server's imports take several seconds of their own; a command that
will use the pool starts the server first (:func:`worker_context`), so that it imports on
another core while the command plans its runs. Imports nothing heavy itself, so that a
command can call it before it has imported torch.
"""

from __future__ import annotations

import multiprocessing
import os
import site
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import forkserver
from pathlib import Path

#: What the server imports once, before it forks a worker: the pool's module (torch and the
#: training loop below it) and torch._dynamo, which an optimizer's constructor imports.
WORKER_PRELOAD = ["mecheval.experiments.execution.pool", "torch._dynamo"]


def worker_context() -> multiprocessing.context.BaseContext:
    """How worker processes start, the server started if it is not yet (it then imports in
    the background; the first worker waits for it). Not by fork: forking a process whose
    torch thread pool is running can deadlock. On Linux, by forkserver: the server imports
    :data:`WORKER_PRELOAD` (and runs no torch op, so it has no thread pool to pass on) and
    forks each worker from itself in milliseconds; each worker then takes the sweep's
    environment, folder and import path as a spawned one would (pool.py's ``_init_worker``).
    Elsewhere, spawn."""
    if not sys.platform.startswith("linux"):
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(WORKER_PRELOAD)
    with _package_importable():
        forkserver.ensure_running()  # once per process; later calls find it running
    return context


@contextmanager
def _package_importable() -> Iterator[None]:
    """PYTHONPATH with the folder mecheval is imported from, while the forkserver starts:
    the server is a fresh interpreter, and Python 3.11's does not take this process's
    sys.path, so a checkout on it by other means would not be found there (a worker could
    then not unpickle its job)."""
    root = str(Path(__file__).resolve().parents[3])
    before = os.environ.get("PYTHONPATH")
    if root in site.getsitepackages() or root in (before or "").split(os.pathsep):
        yield
        return
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, before) if p)
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before
