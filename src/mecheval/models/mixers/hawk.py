"""Hawk (De et al., 2024): Griffin's recurrent block with the RG-LRU, following
google-deepmind/recurrentgemma's PyTorch code, ``recurrentgemma/torch/modules.py``
(``RecurrentBlock``) and ``recurrentgemma/torch/layers.py`` (``RGLRU``, ``BlockDiagonalLinear``,
``Conv1D``, ``rnn_scan``, ``rnn_param_init``, ``SqrtBoundDerivative``):

    y      = GeLU(linear_y x)                   d -> lru_width, tanh-approximate GeLU (as JAX)
    u      = conv(linear_x x)                   d -> lru_width, then a causal depthwise
                                                temporal conv of width 4 with bias, no activation
    r_t    = σ(a_gate u_t),  i_t = σ(input_gate u_t)   block-diagonal weights (num_heads blocks)
                                                       with bias
    log a_t = -c · softplus(Λ) ⊙ r_t            c = 8
    h_t    = a_t ⊙ h_{t-1} + sqrt(1 - a_t²) ⊙ (i_t ⊙ u_t)
    out    = linear_out(h ⊙ y)                  lru_width -> d

Every sequence here is one document starting at position 0, where the recurrence resets as the
reference's does at ``segment_pos == 0`` (models/ops/rglru.py: ``rglru_inputs``).

Init as the reference, for what is the RG-LRU's own (the backbone initialises the Linears):

* Λ (``rg_lru.a_param``): ``rnn_param_init(min_rad=0.9, max_rad=0.999)``: a radius r with r²
  uniform in [0.81 + 1e-8, 0.998 + 1e-8] ("proportional to area in a ring"), Λ = softplus⁻¹(-log r),
  so that exp(-softplus(Λ)) = r ∈ [0.9, 0.999]. (The paper's text says a^c uniform in
  [0.9, 0.999]; the code, followed here, puts a = exp(-softplus(Λ)) — the decay at r_t = 1/c —
  in [0.9, 0.999] with a² uniform: the full decay a^c = exp(-c softplus(Λ)) is in
  [0.9^8, 0.999^8] = [0.43, 0.992].)
* gate weights N(0, 1 / block width), biases 0 (``BlockDiagonalLinear``, variance scale 1);
* conv weights N(0, 0.01 / width), bias 0 (``Conv1D``, variance scale 0.01).

Defaults: ``lru_width`` None = d_model (the reference's ``lru_width or width``); ``num_heads``
1: the reference keeps the gates' block width at 256 (RecurrentGemma 2B: width 2560, 10
heads; 9B: 4096, 16), which at the widths used here (d_model <= 256) is one block;
``num_heads: 4`` gives four blocks. ``conv_size`` 4 (``conv1d_temporal_width``).

Deliberate differences from the reference:

* the block around the mixer is the shared backbone's (pre-LayerNorm, GELU MLP with expansion
  4, zoology's init of the Linears: N(0, init_std), biases 0), not Griffin's residual block
  (RMSNorm, gated GeLU MLP with expansion 3, LeCun-normal Linears); Griffin's block does have an
  MLP, so ``mlp=True``. ``linear_out`` keeps the reference's name, so zoology's init leaves it
  at N(0, init_std) (the reference scales it by ``final_w_init_variance_scale``);
* the temporal conv is :class:`~mecheval.models.mixers.base.ShortConv` (weight [C, 1, k],
  tap k-1 = the current step; the reference's ``Conv1D.w`` is [k, C] in the same tap order),
  so that its output is the site ``mixer.conv.output``; the reference's document masks inside
  the conv are not needed with one document per sequence;
* 1 - a² is computed as -expm1(2 log a) (the reference: 1 - exp(2 log a)); the same function,
  without the cancellation near a = 1;
* everything runs in the model's dtype (the reference accumulates the scan in float32).

The RG-LRU's arithmetic (its gates; its scans: the forward pass's :func:`rglru_scan`, the
step-by-step reference and a chunked form) is in models/ops/rglru.py."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from mecheval.models.mixers.base import Mixer
from mecheval.models.mixers.modules import BlockDiagonalLinear, ShortConv, optional_conv
from mecheval.models.mixers.options import MixerOptions
from mecheval.models.ops.rglru import (
    rglru_inputs,
    rglru_scan,
    rglru_scan_from,
    rglru_scan_recurrent,
)


class HawkOptions(MixerOptions):
    lru_width: int | None = Field(
        None, ge=1, le=65536, description="width of the recurrence; null = d_model"
    )
    num_heads: int = Field(1, ge=1, le=4096, description="diagonal blocks of the RG-LRU gates")
    conv_size: int | None = Field(
        4, ge=1, le=64, description="width of the temporal conv (null: none)"
    )
    c: float = Field(8.0, gt=0.0, le=1e3, description="log a_t = -c softplus(Λ) r_t")
    min_rad: float = Field(0.9, gt=0.0, lt=1.0, description="Λ init: exp(-softplus(Λ)) >= this")
    max_rad: float = Field(0.999, gt=0.0, lt=1.0, description="... and <= this")
    chunk_size: int = Field(
        16, ge=1, le=4096, description="block length of rglru_scan_chunked (not the forward's)"
    )

    @model_validator(mode="after")
    def _radii(self) -> HawkOptions:
        if self.min_rad > self.max_rad:
            raise ValueError(
                f"min_rad={self.min_rad} must not exceed max_rad={self.max_rad} "
                "(model.mixer.min_rad, model.mixer.max_rad)"
            )
        return self


def rg_lru_a_init(
    a_param: torch.Tensor, min_rad: float, max_rad: float, eps: float = 1e-8
) -> torch.Tensor:
    """The reference's ``rnn_param_init`` (in place): r with r² uniform in
    [min_rad² + eps, max_rad² + eps], then Λ = softplus⁻¹(-log r) = log(exp(-log r) - 1)."""
    with torch.no_grad():
        a_param.uniform_(min_rad**2 + eps, max_rad**2 + eps)
        log_r = 0.5 * torch.log(a_param)
        return a_param.copy_(torch.log(torch.expm1(-log_r)))


class RGLRU(nn.Module):
    """The RG-LRU's parameters and gates (the reference's ``RGLRU``); the scan is separate."""

    def __init__(self, width: int, options: HawkOptions) -> None:
        super().__init__()
        self.options = options
        self.a_param = nn.Parameter(torch.empty(width))
        self.input_gate = BlockDiagonalLinear(width, options.num_heads)
        self.a_gate = BlockDiagonalLinear(width, options.num_heads)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.input_gate.reset_parameters()
        self.a_gate.reset_parameters()
        rg_lru_a_init(self.a_param, self.options.min_rad, self.options.max_rad)

    def scan_inputs(
        self, x: torch.Tensor, at_start: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, W] -> (log a_t, the normalised, gated input) of h_t = a_t h_{t-1} + ...:
        :func:`~mecheval.models.ops.rglru.rglru_inputs` of x and its gates (``at_start`` too)."""
        gate_x = torch.sigmoid(self.input_gate(x))
        gate_a = torch.sigmoid(self.a_gate(x))
        return rglru_inputs(x, gate_x, gate_a, self.a_param, self.options.c, at_start)


class Hawk(Mixer):
    def __init__(self, d_model: int, options: HawkOptions) -> None:
        super().__init__()
        self.options = options
        self.lru_width = options.lru_width or d_model
        if self.lru_width % options.num_heads:
            raise ValueError(
                f"model.mixer.num_heads: {options.num_heads} does not divide the RG-LRU width "
                f"{self.lru_width} (model.mixer.lru_width, null = model.d_model={d_model})"
            )
        self.linear_y = nn.Linear(d_model, self.lru_width)
        self.linear_x = nn.Linear(d_model, self.lru_width)
        self.conv = optional_conv(self.lru_width, options.conv_size, bias=True)
        self.rg_lru = RGLRU(self.lru_width, options)
        self.linear_out = nn.Linear(self.lru_width, d_model)
        self.init_special()

    @torch.no_grad()
    def init_special(self) -> None:
        # Conv1D: w ~ N(0, 0.01 / temporal width), b = 0; the RG-LRU's gates and Λ.
        if isinstance(self.conv, ShortConv):
            k = self.options.conv_size
            nn.init.normal_(self.conv.weight, mean=0.0, std=math.sqrt(0.01 / k))
            nn.init.zeros_(self.conv.bias)
        self.rg_lru.reset_parameters()

    def branches(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, d] -> (GeLU branch y, log a_t, scan input), each [B, T, lru_width]."""
        y = F.gelu(self.linear_y(x), approximate="tanh")
        log_a, drive = self.rg_lru.scan_inputs(self.conv(self.linear_x(x)))
        return y, log_a, drive

    def recurrent_state_size(self, seq_len: int) -> int:
        return self.lru_width

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        y, log_a, drive = self.branches(x)
        h = rglru_scan(log_a, drive)
        return self.linear_out(h * y)

    # Resuming from a prefix (Mixer.final_states): the state is the RG-LRU's h after each
    # position, [B, T, lru_width]; the temporal conv reads conv_size - 1 inputs before the cut.
    def halo(self) -> int:
        return self.conv.kernel_size - 1 if isinstance(self.conv, ShortConv) else 0

    def final_states(self, x: torch.Tensor) -> torch.Tensor:
        _, log_a, drive = self.branches(x)
        return rglru_scan(log_a, drive)

    carries = "state"

    def mix_from(
        self,
        x: torch.Tensor,
        offset: int,
        initial_state: torch.Tensor | None,
        replace: bool = False,
    ) -> torch.Tensor:
        if initial_state is None:  # no state: the window starts at the document's start
            return self.mix(x)[:, offset:]
        y = F.gelu(self.linear_y(x[:, offset:]), approximate="tanh")
        log_a, drive = self.rg_lru.scan_inputs(self.conv(self.linear_x(x))[:, offset:], False)
        # With ``replace``, the state after the window's first position is given.
        h = rglru_scan_from(log_a, drive, initial_state, replace_first=replace)
        return self.linear_out(h * y)

    def mix_recurrent(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`mix` with the step-by-step scan (for tests and debugging)."""
        y, log_a, drive = self.branches(x)
        return self.linear_out(rglru_scan_recurrent(log_a, drive) * y)
