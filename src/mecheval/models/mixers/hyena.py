"""Hyena (Poli et al., 2023), the order-2 operator as zoology's ``Hyena`` with Table 1 defaults:

    x1, x2, v = split(ShortConv_3(in_proj(u)))       in_proj: d -> 3d; conv: depthwise causal,
                                                      size short_filter_order, over all 3d channels
    y = out_proj(x2 * LongConv(x1 * v))               LongConv: implicit filter + D skip

``conv`` (site ``mixer.conv.output``, [B, T, 3d]) is the short convolution; ``long_conv`` (site
``mixer.long_conv.output``, [B, T, d]) the implicit long convolution: filter MLP of width
``filter_order`` (64) over ``emb_dim`` (3) positional features with sin activations (shared
frequency, init 1) and exponential-decay modulation. As in zoology's Hyena (whose trainer
ignores the per-parameter learning rates it records), the positional features are trainable,
the decay rates fixed. One head, one block, unidirectional: the only configuration zoology's
code supports correctly.

The long-conv skip ``D * input`` (D ~ N(0, 1)): the paper's runs pass ``bias: false``, which
reaches zoology's ``Filter(bias=False)`` and multiplies D by 0 (tinylang
``tinylang/model/zoology.py``; zoology ``mixers/hyena.py``, ``Filter.forward``). So by
default the long convolution has no skip and the layer computes exactly
``out_proj(x2 * (k * (x1 v)))``; D is kept, inert, so parameter counts match the paper's
models. ``long_conv_skip: true`` trains it (Hyena's own default).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, field_validator
from torch import nn

from mecheval.models.mixers.base import Mixer, table1_constant, with_history
from mecheval.models.mixers.long_conv import ImplicitFilter, ImplicitLongConv
from mecheval.models.mixers.modules import ShortConv, optional_conv
from mecheval.models.mixers.options import MixerOptions


class HyenaOptions(MixerOptions):
    l_max: int = Field(1024, ge=1, description="longest sequence the implicit filter covers")
    filter_order: int = Field(64, ge=1, description="width of the implicit filter MLP")
    emb_dim: int = Field(3, ge=3, description="positional features of the filter (odd)")
    short_filter_order: int | None = Field(
        3, ge=1, description="size of the short causal conv (null: none)"
    )
    long_conv_skip: bool = Field(
        False,
        description="add the learned D * input skip to the long conv (paper's runs: off, "
        "zoology Filter(bias=False))",
    )
    num_heads: int = table1_constant(1)
    num_blocks: int = table1_constant(1)
    outer_mixing: Literal[False] = table1_constant(False)
    bidirectional: Literal[False] = table1_constant(False)
    dropout: float = table1_constant(0.0)
    filter_dropout: float = table1_constant(0.0)

    @field_validator("emb_dim")
    @classmethod
    def _odd(cls, v: int) -> int:
        if v % 2 == 0:
            raise ValueError(f"must be odd (time + cos/sin pairs), got {v}")
        return v


class Hyena(Mixer):
    def __init__(self, d_model: int, options: HyenaOptions) -> None:
        super().__init__()
        self.d_model = d_model
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.conv = optional_conv(3 * d_model, options.short_filter_order)
        self.long_conv = ImplicitLongConv(
            ImplicitFilter(
                d_model,
                options.l_max,
                order=options.filter_order,
                emb_dim=options.emb_dim,
                learn_positions=True,
            ),
            skip="learned" if options.long_conv_skip else "zeroed",
        )
        self.out_proj = nn.Linear(d_model, d_model)

    def init_special(self) -> None:
        if isinstance(self.conv, ShortConv):
            self.conv.reset_parameters()
        self.long_conv.reset_special()

    def max_length(self) -> int:
        return self.long_conv.filter.l_max

    def recurrent_state_size(self, seq_len: int) -> int:
        # The implicit long convolution reads the whole history of its input (x1 * v).
        return self.d_model * seq_len

    def mix(self, u: torch.Tensor) -> torch.Tensor:
        x1, x2, v = self.conv(self.in_proj(u)).split(self.d_model, dim=-1)
        return self.out_proj(x2 * self.long_conv(x1 * v))

    # Resuming from a prefix (Mixer.final_states): the long convolution reads its input's
    # whole history, so the state is that input, x1 * v, at every position [B, T, d] (as
    # attention's is its keys and values); the short conv reads its kernel size - 1 inputs
    # before the cut.
    def halo(self) -> int:
        return self.conv.kernel_size - 1 if isinstance(self.conv, ShortConv) else 0

    carries = "history"

    def final_states(self, u: torch.Tensor) -> torch.Tensor:
        x1, _, v = self.conv(self.in_proj(u)).split(self.d_model, dim=-1)
        return x1 * v

    def mix_from(
        self,
        u: torch.Tensor,
        offset: int,
        initial_state: torch.Tensor | None,
        replace: bool = False,
    ) -> torch.Tensor:
        if replace:
            raise NotImplementedError("Hyena has no recurrent state site")
        x1, x2, v = (t[:, offset:] for t in self.conv(self.in_proj(u)).split(self.d_model, -1))
        history = with_history(initial_state, x1 * v)
        return self.out_proj(x2 * self.long_conv.forward_from(*history))
