"""A stack's training step replayed as one CUDA graph.

Why: at the paper's sizes a step is a few hundred tiny kernels; launched one by one from
Python, the card waits on the host (docs/performance.md: eager against replayed). A graph
records the step's kernels once and replays them
with one launch. What it needs from the step: no host synchronisation, no number sent from the
host (the learning rates, the step count and the batch come from tensors on the device, which
stack_feed.py and :class:`~mecheval.training.stacking.stacked.StepTables` provide), and the same
tensors at every replay (the group recaptures after its stack shrinks).

The first ``warmup`` calls run eagerly on a side stream (as torch's capture guide asks: lazy
initialisation, cuBLAS workspaces), the next is captured and replayed, and every later call
replays: each call is one real training step. A capture that fails falls back to the eager
step, with the reason in :attr:`CapturedStep.failed`. ``MECHEVAL_CUDA_GRAPH=0`` in the
environment turns capture off (:func:`graphs_enabled`).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch


def graphs_enabled(device: torch.device) -> bool:
    """Whether a stack on ``device`` replays its step as a CUDA graph."""
    return device.type == "cuda" and os.environ.get("MECHEVAL_CUDA_GRAPH", "1") != "0"


class CapturedStep:
    """``step()`` (a function of device tensors only), run eagerly ``warmup`` times, then
    captured once and replayed at every later call."""

    def __init__(self, step: Callable[[], None], warmup: int = 3) -> None:
        self.step = step
        self.warmup = warmup
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failed: str | None = None

    @property
    def replaying(self) -> bool:
        return self.graph is not None

    def __call__(self) -> None:
        self.calls += 1
        if self.graph is not None:
            self.graph.replay()
            return
        if self.failed is not None:
            self.step()
            return
        if self.calls <= self.warmup:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.step()
            torch.cuda.current_stream().wait_stream(side)
            return
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.step()  # recorded, not run: the state is as before
        except Exception as err:  # noqa: BLE001 - any failure means "run it eagerly"
            self.failed = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            torch.cuda.synchronize()
            self.step()
            return
        self.graph = graph
        graph.replay()
