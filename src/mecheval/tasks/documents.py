"""The documents a task's generator returns: tokens, answers, role positions and what the task
keeps beside them. tasks/dataset.py's ``TaskDataset`` is these plus the config and split."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Documents:
    """``tokens [N, T]`` long, right-padded with 0 to the longest document."""

    tokens: torch.Tensor  # [N, T] long
    answer: torch.Tensor  # [N] long
    roles: dict[str, torch.Tensor]  # role -> [N] positions
    lengths: torch.Tensor  # [N] query position + 1
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # per doc, e.g. ATR "qtype"
    #: the task's per-document structure (ATR: its derivations), if any: an instance of the
    #: task's ``tree_class``
    trees: Any = None

    def __len__(self) -> int:
        return self.tokens.shape[0]
