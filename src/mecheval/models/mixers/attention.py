"""Causal softmax multi-head attention (Vaswani et al., 2017) as zoology's ``MHA``
(``mixers/attention.py``): a fused q/k/v projection, without bias in the paper's runs (they pass
``bias: false``, which zoology applies to ``Wqkv`` only), and an output projection with bias.
The paper uses 1 head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from mecheval.models.mixers.base import Mixer, table1_constant
from mecheval.models.mixers.options import MixerOptions, check_divides


class AttentionOptions(MixerOptions):
    num_heads: int = Field(1, ge=1)
    dropout: float = table1_constant(0.0)
    qkv_bias: bool = Field(False, description="bias on the q/k/v projection (paper's runs: off)")


class Attention(Mixer):
    def __init__(self, d_model: int, options: AttentionOptions) -> None:
        super().__init__()
        check_divides(d_model, "num_heads", options.num_heads)
        self.num_heads = options.num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=options.qkv_bias)
        self.out_proj = nn.Linear(d_model, d_model)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [B, T, d] -> q, k, v, each [B, heads, T, d_head]."""
        b, t, d = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.num_heads, d // self.num_heads)
        return tuple(h.transpose(1, 2) for h in qkv.unbind(2))

    def recurrent_state_size(self, seq_len: int) -> int:
        # The key-value cache: keys and values of every position so far.
        return 2 * self.out_proj.in_features * seq_len

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.heads(x)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, d))

    # The same function with its attention pattern as a tensor of its own, for an estimator
    # that takes the pattern's change exactly (interventions/attribution.py, AtP*'s fix).

    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        """The causal softmax attention pattern of the mixer's input x [B, T, d] (after the
        short convolution, as :meth:`mix` reads it) -> [B, heads, T, T], rows summing to 1."""
        q, k, _ = self.heads(x)
        t = x.shape[1]
        scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        return scores.masked_fill(~causal, float("-inf")).softmax(-1)

    def attend(self, x: torch.Tensor, probabilities: torch.Tensor) -> torch.Tensor:
        """:meth:`mix` with the given attention pattern [B, heads, T, T] in place of its own."""
        b, t, d = x.shape
        _, _, v = self.heads(x)
        return self.out_proj((probabilities @ v).transpose(1, 2).reshape(b, t, d))

    # Resuming from a prefix (Mixer.final_states): the history is the key-value cache, the
    # keys and values at every position, [B, T, heads, head_dim] each.
    carries = "history"

    def halo(self) -> int:
        return 0

    def final_states(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, k, v = self.heads(x)
        return k.transpose(1, 2), v.transpose(1, 2)

    def mix_from(
        self,
        x: torch.Tensor,
        offset: int,
        initial_state: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        x = x[:, offset:]
        b, t, d = x.shape
        q, k, v = self.heads(x)
        if initial_state is not None:  # None at the document's start: nothing cached
            k_before, v_before = (part.transpose(1, 2) for part in initial_state)
            k, v = torch.cat([k_before, k], dim=2), torch.cat([v_before, v], dim=2)
        cached = k.shape[2] - t
        # Query i of the window sits at position cached + i and sees keys 0..cached + i.
        mask = torch.ones(t, cached + t, dtype=torch.bool, device=x.device).tril(cached)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, d))
