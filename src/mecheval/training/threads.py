"""torch's CPU thread count: the one place that sets it.

A process sets it once where it starts (a sweep worker, from its job's share of the cores);
a run whose config names ``training.threads`` holds it for its own duration and gives the
previous count back, so that one run's setting never leaks into the next run of the process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def usable_cores() -> int:
    """The cores this process may run on: those its CPU affinity allows (a cluster job's
    cpuset, ``taskset``), else every core of the machine."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def set_torch_threads(threads: int) -> None:
    """Set the process's intra-op CPU threads (where a process starts)."""
    torch.set_num_threads(threads)


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """``threads`` intra-op CPU threads inside the block (None: leave as is), then the
    previous count again."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
