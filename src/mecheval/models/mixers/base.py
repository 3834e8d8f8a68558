"""What every sequence mixer shares: input/output sites and the causal short convolution."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mecheval.models.sites import Site


class Mixer(nn.Module):
    """A causal sequence mixer [B, T, d] -> [B, T, d] framed by two sites.

    Subclasses implement :meth:`mix`; the sites ``input`` and ``output`` make
    ``layers.{i}.mixer.input`` / ``layers.{i}.mixer.output`` addressable.
    """

    def __init__(self) -> None:
        super().__init__()
        self.input = Site()
        self.output = Site()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.mix(self.input(x)))

    def mix(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def init_special(self) -> None:
        """Re-initialise parameters whose init is part of the architecture (after the generic
        normal(0.02) init of every Linear and Embedding). Default: nothing special."""


class ShortConv(nn.Module):
    """Causal depthwise 1-D convolution over time, [B, T, C] -> [B, T, C].

    Output at t depends on inputs t-k+1..t only (left zero padding). Its ``output`` site is
    the ``mixer.conv.output`` (or ``mixer.q_conv.output`` …) site of the design.
    """

    def __init__(self, channels: int, kernel_size: int, bias: bool = True) -> None:
        super().__init__()
        if kernel_size < 1:
            raise ValueError(f"kernel_size: expected >= 1, got {kernel_size}")
        self.kernel_size = kernel_size
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None
        self.output = Site()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # PyTorch's Conv1d default: kaiming-uniform with a = sqrt(5) over fan_in = kernel_size.
        bound = 1.0 / self.kernel_size**0.5
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.pad(x.transpose(1, 2), (self.kernel_size - 1, 0))
        y = F.conv1d(h, self.weight, self.bias, groups=x.shape[-1])
        return self.output(y.transpose(1, 2))
