"""The mixers' building blocks, as fla's ``modules/``: the causal short convolution (and the
switch that removes it), the gated RMSNorm of Mamba-2, Gated DeltaNet and GLA, the gated
output of GLA and RetNet, and Hawk's block-diagonal Linear."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mecheval.models import kernels
from mecheval.models.ops.long_conv import native_causal_conv
from mecheval.models.sites import Site


class ShortConv(nn.Module):
    """Causal depthwise 1-D convolution over time, [B, T, C] -> [B, T, C].

    Output at t depends on inputs t-k+1..t only (left zero padding). Its ``output`` site is
    the ``mixer.conv.output`` (or ``mixer.q_conv.output`` …) site of the design.

    Computed as a sum of ``kernel_size`` shifted, per-channel-scaled copies of the input, in
    the [B, T, C] layout: for the 3-4 tap kernels used here that is 1.5-2.5x faster forward +
    backward on a CPU than a depthwise ``conv1d``, whose weight gradient takes a slow generic
    path (the tests compare it with ``conv1d``).
    """

    #: a short mixing step before the mixer (``models.sites.local_mixing_sites``)
    local_mixing = True

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
        fused = kernels.causal_conv1d(x, self.weight, self.bias)
        if fused is not None:
            return self.output(fused)
        # In a training step, the C kernel (lag j = tap k - 1 - j): ~3x faster forward and
        # backward at the paper's AR shape than the shifted copies below.
        direct = native_causal_conv(x, self.weight[:, 0].flip(-1))
        if direct is not None:
            return self.output(direct if self.bias is None else direct + self.bias)
        k, t = self.kernel_size, x.shape[1]
        w = self.weight[:, 0]  # [C, k]; tap j multiplies x[t - (k - 1) + j]
        xp = F.pad(x, (0, 0, k - 1, 0))
        last = xp[:, k - 1 :]
        y = last * w[:, -1] if self.bias is None else torch.addcmul(self.bias, last, w[:, -1])
        for j in range(k - 1):
            y = torch.addcmul(y, xp[:, j : j + t], w[:, j])
        return self.output(y)


def optional_conv(channels: int, kernel_size: int | None, bias: bool = True) -> nn.Module:
    """A :class:`ShortConv`, or where ``kernel_size`` is None (the short-conv switch set to
    'none') the identity, which has no site."""
    return nn.Identity() if kernel_size is None else ShortConv(channels, kernel_size, bias)


def gated_head_output(
    o: torch.Tensor, gate: torch.Tensor, norm: nn.Module, out_proj: nn.Module
) -> torch.Tensor:
    """fla's output stage of GLA and RetNet: a recurrence's output o [B, H, T, e], normalised
    per head by ``norm`` (over e), times SiLU(gate) (gate [B, T, H * e]), through ``out_proj``
    -> [B, T, d]."""
    b, h, t, e = o.shape
    o = norm(o.transpose(1, 2)) * F.silu(gate.view(b, t, h, e))
    return out_proj(o.reshape(b, t, h * e))


class GatedRMSNorm(nn.Module):
    """RMSNorm with a SiLU gate, over groups of ``group_size`` channels (weight over all).

    ``norm_before_gate=False`` (mamba_ssm's ``RMSNormGated`` in Mamba-2):
    ``norm(x ⊙ SiLU(gate)) ⊙ w``; ``True`` (fla's ``FusedRMSNormGated``):
    ``norm(x) ⊙ w ⊙ SiLU(gate)``. Without a gate it is a plain (grouped) RMSNorm.
    """

    def __init__(
        self, dim: int, eps: float, group_size: int | None = None, norm_before_gate: bool = False
    ) -> None:
        super().__init__()
        self.eps = eps
        self.group_size = group_size or dim
        self.norm_before_gate = norm_before_gate
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        if gate is not None and not self.norm_before_gate:
            x = x * F.silu(gate)
        grouped = x.unflatten(-1, (-1, self.group_size))
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        x = grouped.flatten(-2) * self.weight
        if gate is not None and self.norm_before_gate:
            x = x * F.silu(gate)
        return x


class BlockDiagonalLinear(nn.Module):
    """The reference's ``BlockDiagonalLinear``: ``num_blocks`` independent [bw, bw] Linears on
    consecutive slices of the width, with bias; weights N(0, 1 / bw), biases 0."""

    def __init__(self, width: int, num_blocks: int) -> None:
        super().__init__()
        self.num_blocks = num_blocks
        self.block_width = width // num_blocks
        self.w = nn.Parameter(torch.empty(num_blocks, self.block_width, self.block_width))
        self.b = nn.Parameter(torch.empty(num_blocks, self.block_width))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.w, mean=0.0, std=math.sqrt(1.0 / self.block_width))
        nn.init.zeros_(self.b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *lead, width = x.shape
        x = x.reshape(*lead, self.num_blocks, self.block_width)
        y = torch.einsum("...hi,hij->...hj", x, self.w) + self.b
        return y.reshape(*lead, width)
