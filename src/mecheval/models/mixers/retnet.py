"""RetNet's multi-scale retention (Sun et al., 2023), following fla's layer
``fla/layers/multiscale_retention.py`` (``MultiScaleRetention``) and its kernels
``fla/ops/retention/`` (``parallel_retention``: simple GLA with a fixed log-decay per head):

    q, k    = W_q x, W_k x                  key width  d_k = expand_k * d  (fla: 1)
    v, g    = W_v x, W_g x                  value width d_v = expand_v * d (fla: 2)
    q, k    = RoPE(q), RoPE(k)              per head, fla's ``RotaryEmbedding(dim=d_k / H)``:
                                            base 10000, halves rotated (GPT-NeoX layout, not
                                            interleaved), no xPos scaling (scale_base=None),
                                            positions 0, 1, ... from the sequence start
    γ_h     = 1 - 2^(-5 - h),  h = 0 .. H-1 (fla: ``1 - 2**(-5 - arange(H))``)
    per head: o_t = Σ_{s<=t} γ_h^(t-s) (q_t · k_s / sqrt(d_k / H)) v_s
              (recurrently: S_t = γ_h S_{t-1} + k_t v_tᵀ, o_t = (q_t / sqrt(d_k / H))ᵀ S_t)
    out     = o_proj(RMSNorm_head(o) ⊙ swish(g))   fla's FusedRMSNormGated (one weight of the
                                                   head's value width, shared by the heads)

Defaults are fla's layer defaults: ``num_heads=8``, ``expand_k=1``, ``expand_v=2``,
``norm_eps=1e-5``, gated output with swish, no short convolution, no feature map. (fla's GLA
layer defaults to 4 heads; its retention layer to 8, which divides 16 and 64: at d_model 16,
8 heads of key width 2 and value width 4.) The decays depend on the number of heads, as in fla.

Deliberate differences from fla:

* the per-head output norm is fla's RMSNorm, not the paper's GroupNorm (fla's choice); the
  paper's retention-score normalisations (by Σ of the decay row and max(|·|, 1)) are not
  applied, as in fla's kernels;
* the rotary tables are computed in the model's dtype (fla: float32, then cast);
* the output projection keeps fla's name ``o_proj``, so zoology's init leaves it at
  N(0, init_std) (not rescaled), as in DeltaNet here;
* no GQA (``num_kv_heads``), ``feature_map`` or short-convolution options.

The forward pass uses the parallel form :func:`retention_parallel` (models/ops/retention.py)
(the decay matrix D_ts = γ^(t-s) for s <= t, 0 above the diagonal, T x T per head: T is at most
a few hundred here); :func:`retention_recurrent` is the step-by-step recurrence (for tests and
:meth:`RetNet.mix_recurrent`)."""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from mecheval.models.mixers.base import Mixer
from mecheval.models.mixers.modules import gated_head_output
from mecheval.models.mixers.options import MixerOptions, check_divides
from mecheval.models.ops.retention import retention_decays, retention_parallel, retention_recurrent


class RetNetOptions(MixerOptions):
    num_heads: int = Field(8, ge=1, le=1024, description="heads (fla's layer default 8)")
    expand_k: int = Field(1, ge=1, le=16, description="key width = expand_k * d")
    expand_v: int = Field(2, ge=1, le=16, description="value width = expand_v * d")
    rotary_base: float = Field(10000.0, gt=1.0, le=1e9, description="RoPE base (fla: 10000)")
    norm_eps: float = Field(1e-5, gt=0.0, le=1.0, description="eps of the output RMSNorm")


def rotary(x: torch.Tensor, base: float) -> torch.Tensor:
    """RoPE as fla's ``RotaryEmbedding(dim=D)`` (non-interleaved): x [B, T, H, D] at positions
    0..T-1; the pair (x_i, x_{i + D/2}) is rotated by the angle t / base^(2i / D)."""
    t, d = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d)
    angles = torch.outer(torch.arange(t, dtype=x.dtype, device=x.device), inv_freq)
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]  # [T, 1, D/2]
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class RetNet(Mixer):
    def __init__(self, d_model: int, options: RetNetOptions) -> None:
        super().__init__()
        o = options
        check_divides(d_model, "num_heads", o.num_heads)
        self.options = o
        self.num_heads = o.num_heads
        self.key_dim = d_model * o.expand_k
        self.value_dim = d_model * o.expand_v
        self.head_k_dim = self.key_dim // o.num_heads
        self.head_v_dim = self.value_dim // o.num_heads
        if self.head_k_dim % 2:
            raise ValueError(
                f"model.mixer.num_heads: {o.num_heads} heads leave an odd key width per head "
                f"({self.head_k_dim} = model.d_model={d_model} * expand_k={o.expand_k} / "
                f"{o.num_heads}); the rotary embedding needs an even one"
            )
        self.q_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.g_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False)
        self.g_norm_swish_gate = nn.RMSNorm(self.head_v_dim, eps=o.norm_eps)

    def decays(self, device: torch.device | None = None) -> torch.Tensor:
        """γ_h of every head, float64, made on ``device``."""
        return retention_decays(self.num_heads, device=device)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, d] -> rotated q (scaled), k [B, H, T, d_k/H] and v [B, H, T, d_v/H]."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_k_dim)
        k = self.k_proj(x).view(b, t, self.num_heads, self.head_k_dim)
        v = self.v_proj(x).view(b, t, self.num_heads, self.head_v_dim)
        base = self.options.rotary_base
        q = rotary(q, base) * self.head_k_dim**-0.5
        k = rotary(k, base)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def finish(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Retention output o [B, H, T, d_v/H] -> mixer output [B, T, d]."""
        return gated_head_output(o, self.g_proj(x), self.g_norm_swish_gate, self.o_proj)

    def recurrent_state_size(self, seq_len: int) -> int:
        return self.num_heads * self.head_k_dim * self.head_v_dim

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x)
        gamma = self.decays(x.device)
        return self.finish(retention_parallel(q, k, v, gamma), x)

    def mix_recurrent(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`mix` with the step-by-step recurrence (for tests and debugging)."""
        q, k, v = self.qkv(x)
        gamma = self.decays(x.device)
        return self.finish(retention_recurrent(q, k, v, gamma), x)
