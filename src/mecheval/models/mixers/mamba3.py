"""Mamba-3 block (Lahoti et al., 2026: "Mamba-3: Improved Sequence Modeling using State Space
Principles"), SISO, as ``mamba_ssm``'s ``modules/mamba3.py`` ``Mamba3`` builds it:

    z, x, B, C, dt, a, trap, θ = in_proj(u)     d -> 2 d_inner + 2 G N + 3 H + R
    B, C  = RMSNorm(B), RMSNorm(C)              over N per group, learned weights
    B, C  = B + B_bias, C + C_bias              per head ([H, N], init 1)
    Δ     = softplus(dt + dt_bias)              one step size per head
    A     = min(-f(a), -A_floor)                a data-dependent decay per head and step;
                                                f = softplus (default) or the heavy tail
    λ     = sigmoid(trap)                       the trapezoid's weight per head and step
    Δθ    = Δ · π tanh(θ)                       R angle steps, shared by the heads but for Δ
    y     = mamba3 recurrence (models/ops/mamba3.py): exponential-trapezoidal, B and C
            rotated by the running angle (the complex state), + D x
    out   = out_proj(y ⊙ SiLU(z))               or a per-head gated RMSNorm (outproj_norm)

No short convolution and no activation on x, as the reference: the trapezoid's β term already
mixes each input with the previous one. ``d_conv: k`` (or ``model.short_conv``) adds a causal
depthwise conv over x, B and C before the norms (Mamba-2's place for it, with no SiLU added, so
that the switch changes the conv alone); its site is ``mixer.conv.output``.

RoPE covers ``rope_fraction`` of the state: R = floor(N · rope_fraction / 2) pairs (the
reference's 0.5 or 1.0), pairs (2j, 2j+1) as its SISO kernel. Defaults mirror our Mamba-2:
``d_state`` 64 (the reference's is 128) and ``headdim`` null = gcd(64, d_inner), so that
d_model = 64 gives 2 heads of 64 with a 64 x 64 state each, as our Mamba-2; ``chunk_size`` 64.
Init as the reference: dt_bias as Mamba-2's, B_bias = C_bias = D = 1, norms 1, no A_log (A
comes from the input). MIMO (``is_mimo``) is not offered.

A's activation: the reference's first releases (up to state-spaces/mamba 7438488) take
softplus, the default here; from c69aaab on it takes a heavier tail, f(a) = 1 + a for a >= 0
and 1 / (1 - a) below (``A_activation: heavy_tail``), which keeps a negative a's decay away
from zero (the reference's reason: stability at high learning rates).

:func:`~mecheval.models.ops.mamba3.mamba3_chunked` is the forward;
:func:`~mecheval.models.ops.mamba3.mamba3_recurrent` the step-by-step reference that tests
hold it to and that resumes from a prefix."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, ValidationInfo, field_validator
from torch import nn

from mecheval.models.mixers.mamba2 import SSDHeads
from mecheval.models.mixers.modules import GatedRMSNorm, ShortConv
from mecheval.models.mixers.options import SSDHeadOptions
from mecheval.models.ops.mamba3 import (
    Mamba3Inputs,
    Mamba3State,
    mamba3_chunked,
    mamba3_recurrent,
)


def heavy_tail(a: torch.Tensor) -> torch.Tensor:
    """1 + a for a >= 0, 1 / (1 - a) below: positive, with value and slope 1 at 0, and a
    tail that falls as 1 / |a| where softplus falls as e^a."""
    return a.clamp(min=0) + torch.reciprocal(1 - a.clamp(max=0))


class Mamba3Options(SSDHeadOptions):
    d_state: int = Field(64, ge=2, description="SSM state size N per head")
    rope_fraction: Literal[0.5, 1.0] = Field(
        0.5, validate_default=True, description="share of the state RoPE turns"
    )
    d_conv: int | None = Field(
        None, ge=1, description="short conv over x, B, C; null (default): none, as the reference"
    )
    A_floor: float = Field(1e-4, gt=0.0, description="A <= -A_floor: every step decays")
    A_activation: Literal["softplus", "heavy_tail"] = Field(
        "softplus",
        description="f in A = -f(a): softplus (mamba_ssm to 7438488) or heavy_tail, 1 + a for "
        "a >= 0 and 1 / (1 - a) below (mamba_ssm from c69aaab)",
    )
    outproj_norm: bool = Field(False, description="gated RMSNorm per head before out_proj")
    norm_eps: float = Field(1e-5, gt=0.0, description="eps of the B, C and output norms")

    @field_validator("rope_fraction")
    @classmethod
    def _some_pair_turns(cls, value: float, info: ValidationInfo) -> float:
        d_state = info.data.get("d_state")
        if d_state is not None and int(d_state * value) < 2:
            raise ValueError(f"{value} of d_state={d_state} turns no pair of the state")
        return value


class Mamba3(SSDHeads):
    def __init__(self, d_model: int, options: Mamba3Options) -> None:
        super().__init__(d_model, options)
        o = options
        self.n_angles = int(o.d_state * o.rope_fraction) // 2

        # Order as the reference: [z, x, B, C, dt, A, trap, angles].
        self.splits = [self.d_inner, self.conv_dim, *[self.nheads] * 3, self.n_angles]
        self.in_proj = nn.Linear(d_model, sum(self.splits), bias=o.bias)
        if o.d_conv is not None:
            self.conv = ShortConv(self.conv_dim, o.d_conv, bias=o.conv_bias)
        self.B_norm = GatedRMSNorm(o.d_state, o.norm_eps)
        self.C_norm = GatedRMSNorm(o.d_state, o.norm_eps)
        self.B_bias = nn.Parameter(torch.empty(self.nheads, o.d_state))
        self.C_bias = nn.Parameter(torch.empty(self.nheads, o.d_state))
        self.dt_bias = nn.Parameter(torch.empty(self.nheads))
        self.D = nn.Parameter(torch.empty(self.nheads))
        if o.outproj_norm:
            self.norm = GatedRMSNorm(
                self.d_inner, o.norm_eps, group_size=self.headdim, norm_before_gate=True
            )
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=o.bias)
        self.init_special()

    @torch.no_grad()
    def init_special(self) -> None:
        self.init_dt_bias(self.dt_bias)
        for ones in (self.B_bias, self.C_bias, self.D, self.B_norm.weight, self.C_norm.weight):
            ones.fill_(1.0)
        if self.options.outproj_norm:
            self.norm.weight.fill_(1.0)

    def recurrence_inputs(self, u: torch.Tensor) -> tuple[Mamba3Inputs, torch.Tensor]:
        """u [batch, T, d] -> the recurrence's operands (x, Δ A, Δ, λ, Δ θ, B, C) and the
        gate z."""
        batch, length, _ = u.shape
        z, xbc, dt, a, trap, theta = self.in_proj(u).split(self.splits, dim=-1)
        if self.has_conv:
            xbc = self.conv(xbc)
        x, b, c = self.split_xbc(xbc)
        per_group = self.nheads // self.ngroups
        b = self.B_norm(b.unflatten(-1, (self.ngroups, self.d_state)))
        c = self.C_norm(c.unflatten(-1, (self.ngroups, self.d_state)))
        b = b.repeat_interleave(per_group, dim=2) + self.B_bias
        c = c.repeat_interleave(per_group, dim=2) + self.C_bias
        delta = F.softplus(dt + self.dt_bias)
        activation = heavy_tail if self.options.A_activation == "heavy_tail" else F.softplus
        A = (-activation(a)).clamp(max=-self.options.A_floor)
        angle_steps = (torch.tanh(theta) * math.pi)[..., None, :] * delta[..., None]
        x = x.unflatten(-1, (self.nheads, self.headdim))
        return Mamba3Inputs(x, A * delta, delta, torch.sigmoid(trap), angle_steps, b, c), z

    def finish(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Recurrence output [batch, T, H, P] and gate z -> mixer output [batch, T, d]."""
        y = y.flatten(2)
        y = self.norm(y, z) if self.options.outproj_norm else y * F.silu(z)
        return self.out_proj(y)

    def recurrent_state_size(self, seq_len: int) -> int:
        # h [P, N], the previous step's rotated B [N] and input [P], the running angles [R].
        per_head = self.headdim * self.d_state + self.d_state + self.headdim + self.n_angles
        return self.nheads * per_head

    def mix(self, u: torch.Tensor) -> torch.Tensor:
        operands, z = self.recurrence_inputs(u)
        return self.finish(mamba3_chunked(operands, self.D, self.options.chunk_size), z)

    def mix_recurrent(self, u: torch.Tensor) -> torch.Tensor:
        """:meth:`mix` with the step-by-step recurrence (for tests and debugging)."""
        operands, z = self.recurrence_inputs(u)
        return self.finish(mamba3_recurrent(operands, self.D), z)

    # Resuming from a prefix (Mixer.final_states): (h, k, x, Φ) after each position, by the
    # recurrence; the state site patches all four, everything the next step reads.
    carries = "state"
    resume_from_prefix = False  # as Mamba-2: recomputing the window is the faster path

    def final_states(self, u: torch.Tensor) -> Mamba3State:
        operands, _ = self.recurrence_inputs(u)
        return mamba3_recurrent(operands, self.D, keep=True)[1]

    def mix_from(
        self, u: torch.Tensor, offset: int, initial_state: Mamba3State | None, replace: bool = False
    ) -> torch.Tensor:
        operands, z = self.recurrence_inputs(u)
        y = mamba3_recurrent(
            operands.after(offset), self.D, initial=initial_state, replace_first=replace
        )
        return self.finish(y, z[:, offset:])
