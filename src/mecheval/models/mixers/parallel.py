"""A parallel layer: several mixers on the same input, their outputs summed or concatenated
and projected back to d_model (attention and SSM heads side by side in one layer, as Hymba's
and Falcon-H1's layers have them).

Each branch is a whole mixer with its own sites, ``layers.{i}.mixer.branches.{k}.input`` and
``.output`` (and its inner ones), so one branch's output can be restored or patched alone.
The layer keeps no prefix state of its own: the intervention engine recomputes its window
from the document's start (the base class's default), which is right for any branches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from mecheval.models.mixers.base import Mixer


class ParallelMixer(Mixer):
    """``branches`` on the same input; ``combine``: "sum" adds their outputs, "concat"
    concatenates them and projects to d_model with ``out_proj`` (initialised as the
    residual-out projection it is)."""

    def __init__(
        self, d_model: int, branches: Sequence[Mixer], combine: Literal["sum", "concat"]
    ) -> None:
        super().__init__()
        self.branches = nn.ModuleList(branches)
        self.combine = combine
        self.out_proj = (
            nn.Linear(len(branches) * d_model, d_model, bias=False) if combine == "concat" else None
        )

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        outputs = [branch(x) for branch in self.branches]
        if self.out_proj is None:
            return torch.stack(outputs).sum(0)
        return self.out_proj(torch.cat(outputs, dim=-1))

    def recurrent_state_size(self, seq_len: int) -> int | None:
        sizes = [branch.recurrent_state_size(seq_len) for branch in self.branches]
        return None if any(size is None for size in sizes) else sum(sizes)  # type: ignore[arg-type]

    def state_size(self, seq_len: int) -> int | None:
        # The branches count their own short convs, the switch's included (see backbone.py).
        sizes = [branch.state_size(seq_len) for branch in self.branches]
        return None if any(size is None for size in sizes) else sum(sizes)  # type: ignore[arg-type]

    def max_length(self) -> int | None:
        limits = [n for n in (branch.max_length() for branch in self.branches) if n is not None]
        return min(limits) if limits else None
