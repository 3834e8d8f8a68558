"""Causal softmax multi-head attention (Vaswani et al., 2017) as zoology's ``MHA``
(``mixers/attention.py``): a fused q/k/v projection, without bias in the paper's runs (they pass
``bias: false``, which zoology applies to ``Wqkv`` only), and an output projection with bias.
The paper uses 1 head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from mecheval.models.mixers.base import Mixer, table1_constant


class AttentionOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_heads: int = Field(1, ge=1)
    dropout: float = table1_constant(0.0)
    qkv_bias: bool = Field(False, description="bias on the q/k/v projection (paper's runs: off)")


class Attention(Mixer):
    def __init__(self, d_model: int, options: AttentionOptions) -> None:
        super().__init__()
        if d_model % options.num_heads:
            raise ValueError(
                f"model.d_model: {d_model} is not divisible by mixer.num_heads={options.num_heads}"
            )
        self.num_heads = options.num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=options.qkv_bias)
        self.out_proj = nn.Linear(d_model, d_model)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.num_heads, d // self.num_heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.out_proj(y.transpose(1, 2).reshape(b, t, d))
