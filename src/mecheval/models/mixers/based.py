"""Based (Arora et al., 2024b): a hybrid alternating by layer, as zoology's ``Hybrid`` does
with the paper's config ``[BaseConv, Based]``:

* even layers: :class:`~mecheval.models.mixers.baseconv.BaseConv` with a short causal conv of
  size ``conv_kernel_size`` (default 3), or zoology's implicit long conv
  (``ImplicitLongConvolution``) when ``long_conv`` is set (the Fig. 4b ablation, tinylang's
  ``based_long_only``);
* odd layers: :class:`BasedLinearAttention`, causal linear attention with the 2nd-order
  Taylor feature map

      phi(x) = [1, x / d^(1/4), vec(x x^T) / (sqrt(2) sqrt(d))],   d = feature_dim,

  so phi(q) . phi(k) = 1 + q.k / sqrt(d) + (q.k)^2 / (2 d), the Taylor expansion of
  exp(q.k / sqrt(d)); always >= 1/2, so the normaliser never vanishes.

  y_t = sum_{s<=t} (phi(q_t) . phi(k_s)) v_s / (sum_{s<=t} phi(q_t) . phi(k_s) + eps)

  computed in the quadratic "train view" (masked [T, T] score matrix, as Table 1's
  train_view=quadratic); :func:`linear_attention_recurrent` computes the same function with
  the running state S_t = sum phi(k_s) v_s^T, z_t = sum phi(k_s), as a reference.

Projections follow zoology: q, k: d -> feature_dim * heads, v: d -> d, output d -> d, all
without bias. The output projection keeps zoology's name ``proj_o``: zoology's GPT-2 init
rescales only ``out_proj``/``fc2`` by 1/sqrt(2 n_layers), and so does mecheval's backbone.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from mecheval.models.mixers.base import Mixer
from mecheval.models.mixers.baseconv import BaseConv
from mecheval.models.mixers.options import MixerOptions, check_divides
from mecheval.models.ops.linear_attention import (
    EPS,
    linear_attention_quadratic,
    linear_attention_recurrent,
    taylor_exp,
)


class BasedOptions(MixerOptions):
    conv_kernel_size: int = Field(3, ge=1, description="short conv size of the BaseConv layers")
    long_conv: bool = Field(
        False, description="ablation (Fig. 4b): implicit long conv instead of the short conv"
    )
    use_act: bool = Field(False, description="BaseConv layers: SiLU on both branches")
    l_max: int = Field(1024, ge=1, description="longest sequence the long-conv filter covers")
    feature_dim: int = Field(8, ge=1, description="q/k dimension per head before the feature map")
    num_heads: int = Field(1, ge=1)
    num_key_value_heads: int = Field(1, ge=1, description="must equal num_heads")
    feature_name: str = Field(
        "taylor_exp", pattern="^taylor_exp$", description="only taylor_exp is implemented"
    )
    train_view: str = Field(
        "quadratic", pattern="^quadratic$", description="forward uses the quadratic form"
    )


class BasedLinearAttention(Mixer):
    def __init__(self, d_model: int, feature_dim: int = 8, num_heads: int = 1) -> None:
        super().__init__()
        check_divides(d_model, "num_heads", num_heads)
        self.feature_dim = feature_dim
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.proj_q = nn.Linear(d_model, feature_dim * num_heads, bias=False)
        self.proj_k = nn.Linear(d_model, feature_dim * num_heads, bias=False)
        self.proj_v = nn.Linear(d_model, d_model, bias=False)
        self.proj_o = nn.Linear(d_model, d_model, bias=False)

    def featurise(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [B, T, d]`` -> phi(q), phi(k) ``[B, H, T, F]`` and v ``[B, H, T, d / H]``."""
        b, t, _ = x.shape
        q = self.proj_q(x).view(b, t, self.num_heads, self.feature_dim).transpose(1, 2)
        k = self.proj_k(x).view(b, t, self.num_heads, self.feature_dim).transpose(1, 2)
        v = self.proj_v(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        return taylor_exp(q), taylor_exp(k), v

    def recurrent_state_size(self, seq_len: int) -> int:
        # S [features, head_dim] and the normaliser z [features] per head.
        features = 1 + self.feature_dim + self.feature_dim**2
        return self.num_heads * features * (self.head_dim + 1)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        y = linear_attention_quadratic(*self.featurise(x))
        return self.proj_o(y.transpose(1, 2).reshape(b, t, d))

    # Resuming from a prefix (Mixer.final_states): the state is (S, z) after each position.
    carries = "state"
    resume_from_prefix = False  # recomputing the window is faster (Mixer.resume_from_prefix)

    def halo(self) -> int:
        return 0

    def final_states(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return linear_attention_recurrent(*self.featurise(x), keep=True)[1]

    def mix_from(
        self,
        x: torch.Tensor,
        offset: int,
        initial_state: tuple[torch.Tensor, torch.Tensor] | None,
        replace: bool = False,
    ) -> torch.Tensor:
        x = x[:, offset:]
        b, t, d = x.shape
        q, k, v = self.featurise(x)
        # The quadratic form over the window plus the state's share, as the forward does:
        # num_t = phi(q_t) S + sum_s a_ts v_s, den_t = phi(q_t) z + sum_s a_ts, s <= t in the
        # window. A replaced state already holds the window's first position: its column drops.
        a = (q @ k.transpose(-1, -2)).tril()
        if replace:
            a = torch.cat([torch.zeros_like(a[..., :1]), a[..., 1:]], dim=-1)
        num, den = a @ v, a.sum(-1, keepdim=True)
        if initial_state is not None:
            num = num + q @ initial_state[0]
            den = den + (q * initial_state[1].unsqueeze(-2)).sum(-1, keepdim=True)
        y = num / (den + EPS)
        return self.proj_o(y.transpose(1, 2).reshape(b, t, d))


def build_based(layer: int, d_model: int, options: BasedOptions) -> Mixer:
    if options.num_key_value_heads != options.num_heads:
        raise ValueError(
            "model.mixer.num_key_value_heads: must equal mixer.num_heads "
            f"({options.num_key_value_heads} != {options.num_heads})"
        )
    if layer % 2 == 0:
        k = -1 if options.long_conv else options.conv_kernel_size
        return BaseConv(d_model, k, l_max=options.l_max, use_act=options.use_act)
    return BasedLinearAttention(
        d_model, feature_dim=options.feature_dim, num_heads=options.num_heads
    )
