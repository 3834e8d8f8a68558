"""Gated DeltaNet (Yang, Kautz & Hatamizadeh, 2025), as fla's ``fla.layers.GatedDeltaNet``
builds it (``layers/gated_deltanet.py``, recurrence as ``ops/gated_delta_rule/naive.py``):

    q, k, v = SiLU(q_conv(W_q x)), SiLU(k_conv(W_k x)), SiLU(v_conv(W_v x))   per head:
    q, k    = q / |q|, k / |k|              (fla: use_qk_l2norm_in_kernel=True)
    q       = q / sqrt(d_k)                 (the kernel's default scale)
    β_t     = sigmoid(b_proj x_t)           one per head (2 sigmoid(b_proj x_t) with
                                            allow_neg_eigval)
    g_t     = -exp(A_log) softplus(a_proj x_t + dt_bias)   log-decay per head, ≤ 0 (Mamba-2's)
    S_t     = exp(g_t) S_{t-1} + β_t (v_t - exp(g_t) S_{t-1} k_t) k_tᵀ,   o_t = S_t q_t
    out     = o_proj(RMSNorm_head(o) ⊙ SiLU(g_proj x))   (use_gate=True: FusedRMSNormGated,
                                                          the norm before the gate)

The transition exp(g_t) (I - β_t k_t k_tᵀ) has eigenvalues exp(g_t) (1 - β_t) along k_t and
exp(g_t) elsewhere. ``allow_neg_eigval: true`` is fla's option of that name (Grazzi et al.,
2025): β = 2 sigmoid(b_proj x_t) ∈ (0, 2), so the eigenvalue along k_t lies in (-exp(g_t),
exp(g_t)); the decay gate is unchanged and multiplies the whole transition, as in fla's kernels.
Off by default, as in fla. It changes β alone, so every form of the rule takes it.

As in fla: no bias in any projection or conv (conv_bias=False), kernel size 4, A ~ U[0, 16]
(A_log = log A), dt_bias the inverse softplus of a log-uniform Δ in [1e-3, 1e-1] floored at
1e-4, the gated norm's eps 1e-5 and weight shared by the heads; ``use_gate: false`` gives
fla's plain per-head RMSNorm and no g_proj.

Sizes: fla defaults to num_heads 6 of head_dim 256 with expand_v 2 (value heads 512 wide),
sized for d_model 2048 (num_heads · head_dim = 0.75 d_model). That does not fit mecheval's
widths (16-64), so, as :mod:`~mecheval.models.mixers.deltanet` does (the paper builds fla
layers with num_heads = n_head = 1), ``num_heads`` defaults to 1 and ``head_dim`` to
d_model / num_heads; ``expand_v`` keeps fla's 2 (value width 2 · d_model). The output
projection keeps fla's name ``o_proj`` (zoology's init leaves it at N(0, init_std), as for
DeltaNet).

The forward pass uses the chunked form (models/ops/gated_delta_rule.py:
:func:`gated_delta_rule_chunked`, the delta rule's UT-transform chunks with the decays folded
in); :func:`gated_delta_rule_recurrent` is the step-by-step specification it is tested against."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from mecheval.models.mixers.base import Mixer
from mecheval.models.mixers.modules import GatedRMSNorm, optional_conv
from mecheval.models.mixers.options import (
    MixerOptions,
    check_divides,
    chunk_size_field,
    neg_eigval_field,
)
from mecheval.models.ops.delta_rule import l2_normalize
from mecheval.models.ops.gated_delta_rule import (
    gated_delta_rule_chunked,
    gated_delta_rule_recurrent,
)

#: fla's init of A (uniform) and Δ (log-uniform, floored), hard-coded in its layer
A_INIT_RANGE = (0.0, 16.0)
DT_MIN, DT_MAX, DT_INIT_FLOOR = 1e-3, 1e-1, 1e-4


class GatedDeltaNetOptions(MixerOptions):
    num_heads: int = Field(1, ge=1)
    head_dim: int | None = Field(None, ge=1, description="q/k size per head; null = d / heads")
    expand_v: float = Field(2.0, gt=0.0, description="value head size = expand_v * head_dim")
    use_gate: bool = Field(True, description="output gate SiLU(g_proj x) after the head norm")
    conv_size: int | None = Field(
        4, ge=1, description="kernel size of the q, k and v short convs (null: none)"
    )
    conv_bias: bool = False
    norm_eps: float = Field(1e-5, gt=0.0)
    chunk_size: int = chunk_size_field()
    allow_neg_eigval: bool = neg_eigval_field(
        "β = 2 sigmoid(·) in (0, 2): eigenvalue exp(g) (1 - β) along k in (-exp(g), exp(g)), "
        "as fla's"
    )


class GatedDeltaNet(Mixer):
    def __init__(self, d_model: int, options: GatedDeltaNetOptions) -> None:
        super().__init__()
        o = options
        heads = o.num_heads
        if o.head_dim is None:
            check_divides(d_model, "num_heads", heads, " (or set model.mixer.head_dim)")
        head_k = o.head_dim or d_model // heads
        head_v = head_k * o.expand_v
        if not math.isclose(head_v, round(head_v)) or round(head_v) < 1:
            raise ValueError(
                f"model.mixer.expand_v: {o.expand_v} * head_dim {head_k} = {head_v} is not a "
                "positive whole number"
            )
        self.options = o
        self.num_heads = heads
        self.head_k_dim = head_k
        self.head_v_dim = round(head_v)
        key_dim, value_dim = heads * head_k, heads * self.head_v_dim

        self.q_proj = nn.Linear(d_model, key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, value_dim, bias=False)
        self.a_proj = nn.Linear(d_model, heads, bias=False)
        self.b_proj = nn.Linear(d_model, heads, bias=False)
        self.A_log = nn.Parameter(torch.empty(heads))
        self.dt_bias = nn.Parameter(torch.empty(heads))
        self.q_conv = optional_conv(key_dim, o.conv_size, bias=o.conv_bias)
        self.k_conv = optional_conv(key_dim, o.conv_size, bias=o.conv_bias)
        self.v_conv = optional_conv(value_dim, o.conv_size, bias=o.conv_bias)
        if o.use_gate:
            self.g_proj = nn.Linear(d_model, value_dim, bias=False)
        self.o_norm = GatedRMSNorm(self.head_v_dim, o.norm_eps, norm_before_gate=True)
        self.o_proj = nn.Linear(value_dim, d_model, bias=False)
        self.init_special()

    @torch.no_grad()
    def init_special(self) -> None:
        self.A_log.copy_(torch.log(torch.empty(self.num_heads).uniform_(*A_INIT_RANGE)))
        log_dt = torch.rand(self.num_heads) * (math.log(DT_MAX) - math.log(DT_MIN))
        dt = torch.exp(log_dt + math.log(DT_MIN)).clamp(min=DT_INIT_FLOOR)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.o_norm.weight.fill_(1.0)

    def heads(self, x: torch.Tensor, size: int) -> torch.Tensor:
        """[B, T, H * size] -> [B, H, T, size]"""
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, size).transpose(1, 2)

    def rule_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [B, T, d] -> q, k [B, H, T, d_k], v [B, H, T, d_v], β and g [B, H, T]."""
        q = self.heads(F.silu(self.q_conv(self.q_proj(x))), self.head_k_dim)
        k = self.heads(F.silu(self.k_conv(self.k_proj(x))), self.head_k_dim)
        v = self.heads(F.silu(self.v_conv(self.v_proj(x))), self.head_v_dim)
        q = l2_normalize(q) * self.head_k_dim**-0.5
        k = l2_normalize(k)
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)
        if self.options.allow_neg_eigval:
            beta = beta * 2.0
        g = -torch.exp(self.A_log) * F.softplus(self.a_proj(x) + self.dt_bias)
        return q, k, v, beta, g.transpose(1, 2)

    def finish(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Rule output o [B, H, T, d_v] (and the mixer input x, for the gate) -> [B, T, d]."""
        b, _, t, _ = o.shape
        o = o.transpose(1, 2)  # [B, T, H, d_v]
        gate = None
        if self.options.use_gate:
            gate = self.g_proj(x).view(b, t, self.num_heads, self.head_v_dim)
        return self.o_proj(self.o_norm(o, gate).reshape(b, t, -1))

    def recurrent_state_size(self, seq_len: int) -> int:
        return self.num_heads * self.head_k_dim * self.head_v_dim

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        o = gated_delta_rule_chunked(*self.rule_inputs(x), self.options.chunk_size)
        return self.finish(o, x)

    def mix_recurrent(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`mix` with the step-by-step rule (for tests and debugging)."""
        return self.finish(gated_delta_rule_recurrent(*self.rule_inputs(x)), x)

    # Resuming from a prefix (Mixer.final_states): S after each position, by the recurrence.
    carries = "state"
    resume_from_prefix = False  # recomputing the window is faster (Mixer.resume_from_prefix)

    def halo(self) -> int:
        size = self.options.conv_size
        return 0 if size is None else size - 1

    def final_states(self, x: torch.Tensor) -> torch.Tensor:
        return gated_delta_rule_recurrent(*self.rule_inputs(x), keep=True)[1]

    def mix_from(
        self,
        x: torch.Tensor,
        offset: int,
        initial_state: torch.Tensor | None,
        replace: bool = False,
    ) -> torch.Tensor:
        inputs = (t[:, :, offset:] for t in self.rule_inputs(x))
        o = gated_delta_rule_recurrent(*inputs, initial=initial_state, replace_first=replace)
        return self.finish(o, x[:, offset:])
