"""DeltaNet (Schlag et al., 2021; Yang et al., 2024), following the defaults of fla's
``fla.layers.DeltaNet`` that the paper trains (it gives no table for DeltaNet):

    q, k, v = SiLU(q_conv(W_q x)), SiLU(k_conv(W_k x)), SiLU(v_conv(W_v x))   per head:
    q, k    = q / |q|, k / |k|          (fla: qk_activation="silu", qk_norm="l2")
    q       = q / sqrt(d_head)          (fla's kernels scale q by d_k^-0.5 by default)
    β_t     = sigmoid(w_β · x_t)        one per head (use_beta=True); 2 sigmoid(w_β · x_t)
                                         with allow_neg_eigval
    S_t     = S_{t-1} + β_t (v_t - S_{t-1} k_t) k_tᵀ,   o_t = S_t q_t
    out     = o_proj(RMSNorm_head(o))    fla normalises each head's output (o_norm) when
                                         use_gate=False, its default

The state's transition I - β_t k_t k_tᵀ has eigenvalue 1 - β_t along k_t (1 elsewhere): in
(0, 1) by default. ``allow_neg_eigval: true`` doubles β into (0, 2), so that eigenvalue reaches
into (-1, 1), a reflection at β = 2 (Grazzi et al., 2025, "Unlocking State-Tracking in Linear
RNNs Through Negative Eigenvalues"; fla's ``allow_neg_eigval``, off by default there too). It
changes β alone, so every form of the rule takes it.

As in fla, the projections, β and the convolutions have no bias (conv_bias=False) and the
convolutions have kernel size 4. The output projection keeps fla's name ``o_proj``: the paper's
init (zoology's ``_init_weights``) rescales only ``out_proj``/``fc2`` by 1/sqrt(2 n_layers), so
``o_proj`` stays at N(0, init_std), as in the paper's models.

Heads: the paper names fla's DeltaNet but not its arguments (its Table 1 has no DeltaNet). A
later version of tinylang's ``tinylang/model/zoology.py`` builds it as
``fla.layers.DeltaNet(num_heads=n_head, conv_bias=bias, hidden_size=n_embd)``, and every
released config sets ``n_head: 1`` and ``bias: false``: ``num_heads`` defaults to 1 here, and
``num_heads: 4`` gives fla's own default.

The forward pass uses the chunked parallel form (:func:`delta_rule_chunked`, in
models/ops/delta_rule.py); the step-by-step :func:`delta_rule_recurrent` computes the same
function one step at a time (for debugging and the state interface). Both, and the whole layer,
are tested against a delta rule and a layer written out independently in
tests/test_references.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from mecheval.models.mixers.base import Mixer
from mecheval.models.mixers.modules import optional_conv
from mecheval.models.mixers.options import (
    MixerOptions,
    check_divides,
    chunk_size_field,
    neg_eigval_field,
)
from mecheval.models.ops.delta_rule import delta_rule_chunked, delta_rule_recurrent, l2_normalize


class DeltaNetOptions(MixerOptions):
    num_heads: int = Field(1, ge=1)
    conv_size: int | None = Field(
        4,
        ge=1,
        description="kernel size of the q, k and v short convs (null: none, fla's "
        "use_short_conv=False)",
    )
    conv_bias: bool = False
    output_norm: bool = Field(True, description="RMSNorm of each head's output before o_proj")
    norm_eps: float = Field(1e-5, gt=0.0)
    chunk_size: int = chunk_size_field()
    allow_neg_eigval: bool = neg_eigval_field(
        "β = 2 sigmoid(·) in (0, 2): transition eigenvalue 1 - β in (-1, 1), as fla's"
    )


class DeltaNet(Mixer):
    def __init__(self, d_model: int, options: DeltaNetOptions) -> None:
        super().__init__()
        check_divides(d_model, "num_heads", options.num_heads)
        self.options = options
        self.num_heads = options.num_heads
        self.head_dim = d_model // options.num_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.b_proj = nn.Linear(d_model, options.num_heads, bias=False)
        self.q_conv = optional_conv(d_model, options.conv_size, bias=options.conv_bias)
        self.k_conv = optional_conv(d_model, options.conv_size, bias=options.conv_bias)
        self.v_conv = optional_conv(d_model, options.conv_size, bias=options.conv_bias)
        self.o_norm = (
            nn.RMSNorm(self.head_dim, eps=options.norm_eps) if options.output_norm else None
        )
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, d] -> [B, H, T, d_head]"""
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def qkv_beta(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, d] -> q, k, v [B, H, T, d_head] and β [B, H, T], ready for the delta rule."""
        q = self.heads(F.silu(self.q_conv(self.q_proj(x))))
        k = self.heads(F.silu(self.k_conv(self.k_proj(x))))
        v = self.heads(F.silu(self.v_conv(self.v_proj(x))))
        q = l2_normalize(q) * self.head_dim**-0.5
        k = l2_normalize(k)
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)
        if self.options.allow_neg_eigval:
            beta = beta * 2.0
        return q, k, v, beta

    def finish(self, o: torch.Tensor) -> torch.Tensor:
        """Delta-rule output o [B, H, T, d_head] -> mixer output [B, T, d]."""
        if self.o_norm is not None:
            o = self.o_norm(o)
        b, _, t, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))

    def recurrent_state_size(self, seq_len: int) -> int:
        return self.num_heads * self.head_dim * self.head_dim

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v, beta = self.qkv_beta(x)
        return self.finish(delta_rule_chunked(q, k, v, beta, self.options.chunk_size))

    # Resuming from a prefix (Mixer.final_states): the state is S after each position,
    # [B, T, H, d_v, d_k]; the q, k, v convs read conv_size - 1 inputs before the cut.
    def halo(self) -> int:
        return 0 if self.options.conv_size is None else self.options.conv_size - 1

    def final_states(self, x: torch.Tensor) -> torch.Tensor:
        return delta_rule_recurrent(*self.qkv_beta(x), keep=True)[1]

    def mix_from(
        self,
        x: torch.Tensor,
        offset: int,
        initial_state: torch.Tensor | None,
        replace: bool = False,
    ) -> torch.Tensor:
        q, k, v, beta = (t[:, :, offset:] for t in self.qkv_beta(x))
        chunk = self.options.chunk_size
        if not replace:
            return self.finish(delta_rule_chunked(q, k, v, beta, chunk, initial=initial_state))
        # The state after the window's first position is given: its output reads it, the
        # rest of the window continues from it.
        first = (initial_state @ q[:, :, 0, :, None]).transpose(2, 3)
        if q.shape[2] == 1:
            return self.finish(first)
        rest = delta_rule_chunked(
            q[:, :, 1:], k[:, :, 1:], v[:, :, 1:], beta[:, :, 1:], chunk, initial_state
        )
        return self.finish(torch.cat([first, rest], dim=2))

    carries = "state"
    resume_from_prefix = False  # recomputing the window is faster (Mixer.resume_from_prefix)

    def mix_recurrent(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`mix` with the step-by-step delta rule (for tests and debugging)."""
        q, k, v, beta = self.qkv_beta(x)
        return self.finish(delta_rule_recurrent(q, k, v, beta))
