"""Learning-rate schedule: linear warm-up, then cosine decay to 0 (paper §4.1).

The factor for optimizer step ``s`` (0-based) of ``total`` with ``warmup`` warm-up steps is
``s / warmup`` while ``s < warmup`` and ``0.5 * (1 + cos(pi * (s - warmup) / (total - warmup)))``
after, the convention of HuggingFace's ``get_cosine_schedule_with_warmup``: it is exactly 1 (the
peak LR) at the end of warm-up and reaches 0 at ``total``.
"""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def lr_factor(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return step / warmup
    if total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / (total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def make_scheduler(optimizer: torch.optim.Optimizer, total: int, warmup: int) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: lr_factor(step, total, warmup))
