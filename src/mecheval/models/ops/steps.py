"""The step loop that the step-by-step references share (ssd.py, gla.py, delta_rule.py,
gated_delta_rule.py): one update of the state per step, one read-out of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def run_steps(
    length: int,
    state: Any,
    update: Callable[[int, Any], Any],
    read: Callable[[int, Any], torch.Tensor],
    time_dim: int,
    keep: bool = False,
    replace_first: bool = False,
):
    """For t < ``length``: ``state = update(t, state)``, output ``read(t, state)``. -> the
    outputs stacked along ``time_dim``; with ``keep`` also every state after each step,
    stacked along dim 1. With ``replace_first`` the given ``state`` is the state after the
    first step, whose update is skipped (the state site of a resumed mixer)."""
    outs, states = [], []
    for t in range(length):
        if t or not replace_first:
            state = update(t, state)
        outs.append(read(t, state))
        states.append(state)
    out = torch.stack(outs, dim=time_dim)
    return (out, torch.stack(states, dim=1)) if keep else out
