"""Gated linear attention, GLA (Yang et al., 2024), following fla's layer
``fla/layers/gla.py`` (``GatedLinearAttention``) and its reference recurrence
``fla/ops/gla/naive.py`` (``naive_recurrent_gla``):

    q, k    = W_q x, W_k x                  key width  d_k = int(expand_k * d)  (fla: 0.5)
    v, g    = W_v x, W_g x                  value width d_v = int(expand_v * d) (fla: 1)
    α_t     = logsigmoid(W_up W_down x_t) / gate_logit_normalizer   (per key channel, <= 0)
                                            low-rank gate ``gk_proj`` (rank 16, bias on the
                                            second Linear only), normaliser 16
    per head (d_k / H keys, d_v / H values):
    S_t     = diag(exp(α_t)) S_{t-1} + k_t v_tᵀ,      o_t = (q_t / sqrt(d_k / H))ᵀ S_t
    out     = o_proj(RMSNorm_head(o) ⊙ swish(g))   fla's FusedRMSNormGated (one weight of the
                                                   head's value width, shared by the heads)

Defaults are fla's layer defaults (``num_heads=4``, ``expand_k=0.5``, ``expand_v=1``,
``gate_low_rank_dim=16``, ``gate_logit_normalizer=16``, ``use_output_gate=True``,
``gate_fn="swish"``, ``norm_eps=1e-5``, no feature map, no short convolution). At d_model 16
they give 4 heads of key width 2 and value width 4.

``conv_size`` (None by default, as fla's ``use_short_conv=False``) adds fla's short
convolutions: a causal depthwise conv of that kernel size (no bias unless ``conv_bias``) and a
SiLU on each of q, k and v (fla's ``ShortConvolution(activation="silu")``), submodules
``q_conv``, ``k_conv`` and ``v_conv`` whose outputs are the sites ``mixer.q_conv.output`` etc.
(before the SiLU).

Deliberate differences from fla:

* fla's mixed-precision details (float32 accumulation of a bfloat16 model) do not arise: the
  whole layer runs in the model's dtype;
* the output projection keeps fla's name ``o_proj``, so zoology's init (which rescales only
  ``out_proj``/``fc2`` by 1/sqrt(2 n_layers)) leaves it at N(0, init_std), as in DeltaNet here;
  fla's own init is N(0, 0.02) for every Linear, biases 0, norms 1, which the backbone's
  default init_std equals;
* no GQA (``num_kv_heads``), ``feature_map``, ``clamp_min`` or ungated-output variants.

The forward pass uses the chunked form :func:`gla_chunked` (models/ops/gla.py), or in a
training step on a CPU the recurrence in C (``csrc/gla.c``, models/native.py);
:func:`gla_recurrent` is fla's naive recurrence, one step at a time (the specification, for
tests and :meth:`GLA.mix_recurrent`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from mecheval.models import native
from mecheval.models.mixers.base import Mixer
from mecheval.models.mixers.modules import ShortConv, gated_head_output
from mecheval.models.mixers.options import MixerOptions, chunk_size_field
from mecheval.models.ops.gla import gla_chunked, gla_recurrent

#: :func:`gla_recurrent` from a zero state in a training step, by ``csrc/gla.c``
#: (models/native.py): q, k, g [B, H, T, d_k], v [B, H, T, d_v], contiguous. A head's state
#: is d_k x d_v floats (8 x 16 at d = 64), so the recurrence costs little; the chunked form's
#: per-channel decay products took ~13 of GLA's ~32 ms training step at T = 35.
_NativeGLA = native.autograd_function(
    "gla",
    sizes=lambda q, k, v, g: (q.shape[0] * q.shape[1], q.shape[2], q.shape[3], v.shape[3]),
    output=lambda q, k, v, g: v.new_empty(v.shape),
)


class GLAOptions(MixerOptions):
    num_heads: int = Field(4, ge=1, le=1024, description="heads (fla's layer default 4)")
    expand_k: float = Field(0.5, gt=0.0, le=16.0, description="key width = int(expand_k * d)")
    expand_v: float = Field(1.0, gt=0.0, le=16.0, description="value width = int(expand_v * d)")
    gate_low_rank_dim: int = Field(16, ge=1, le=4096, description="rank of the gate projection")
    gate_logit_normalizer: float = Field(
        16.0, gt=0.0, le=1e4, description="log-gates = logsigmoid(gk_proj x) / this"
    )
    conv_size: int | None = Field(
        None, ge=1, le=64, description="kernel size of q/k/v short convs; null: none (fla)"
    )
    conv_bias: bool = Field(False, description="bias of the short convs (fla: False)")
    norm_eps: float = Field(1e-5, gt=0.0, le=1.0, description="eps of the output RMSNorm")
    chunk_size: int = chunk_size_field(16, le=4096)


class GLA(Mixer):
    def __init__(self, d_model: int, options: GLAOptions) -> None:
        super().__init__()
        o = options
        self.options = o
        self.key_dim = int(d_model * o.expand_k)
        self.value_dim = int(d_model * o.expand_v)
        for name, width, expand in [
            ("expand_k", self.key_dim, o.expand_k),
            ("expand_v", self.value_dim, o.expand_v),
        ]:
            if width < 1:
                raise ValueError(
                    f"model.mixer.{name}: int(d_model={d_model} * {expand}) = 0, need >= 1"
                )
            if width % o.num_heads:
                raise ValueError(
                    f"model.mixer.num_heads: {o.num_heads} does not divide the width "
                    f"{width} = int(model.d_model={d_model} * model.mixer.{name}={expand})"
                )
        self.num_heads = o.num_heads
        self.head_k_dim = self.key_dim // o.num_heads
        self.head_v_dim = self.value_dim // o.num_heads
        self.q_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.g_proj = nn.Linear(d_model, self.value_dim, bias=False)
        if o.conv_size is not None:
            self.q_conv = ShortConv(self.key_dim, o.conv_size, bias=o.conv_bias)
            self.k_conv = ShortConv(self.key_dim, o.conv_size, bias=o.conv_bias)
            self.v_conv = ShortConv(self.value_dim, o.conv_size, bias=o.conv_bias)
        self.gk_proj = nn.Sequential(
            nn.Linear(d_model, o.gate_low_rank_dim, bias=False),
            nn.Linear(o.gate_low_rank_dim, self.key_dim, bias=True),
        )
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False)
        self.g_norm_swish_gate = nn.RMSNorm(self.head_v_dim, eps=o.norm_eps)

    @property
    def has_conv(self) -> bool:
        return self.options.conv_size is not None

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, H * e] -> [B, H, T, e]"""
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, -1).transpose(1, 2)

    def qkvg(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, d] -> q (scaled), k, g (log-gates) [B, H, T, d_k/H] and v [B, H, T, d_v/H]."""
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.has_conv:
            q, k, v = F.silu(self.q_conv(q)), F.silu(self.k_conv(k)), F.silu(self.v_conv(v))
        g = F.logsigmoid(self.gk_proj(x)) / self.options.gate_logit_normalizer
        q = self.heads(q) * self.head_k_dim**-0.5
        return q, self.heads(k), self.heads(v), self.heads(g)

    def finish(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Recurrence output o [B, H, T, d_v/H] -> mixer output [B, T, d]."""
        return gated_head_output(o, self.g_proj(x), self.g_norm_swish_gate, self.o_proj)

    def recurrent_state_size(self, seq_len: int) -> int:
        return self.num_heads * self.head_k_dim * self.head_v_dim

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v, g = self.qkvg(x)
        if native.for_training("gla", q, k, v, g):
            o = _NativeGLA.apply(*(t.contiguous() for t in (q, k, v, g)))
        else:
            o = gla_chunked(q, k, v, g, self.options.chunk_size)
        return self.finish(o, x)

    def mix_recurrent(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`mix` with the step-by-step recurrence (for tests and debugging)."""
        q, k, v, g = self.qkvg(x)
        return self.finish(gla_recurrent(q, k, v, g), x)

    # Resuming from a prefix (Mixer.final_states): S after each position, by the recurrence.
    carries = "state"

    def halo(self) -> int:
        return self.options.conv_size - 1 if self.has_conv else 0

    def final_states(self, x: torch.Tensor) -> torch.Tensor:
        return gla_recurrent(*self.qkvg(x), keep=True)[1]

    def mix_from(
        self,
        x: torch.Tensor,
        offset: int,
        initial_state: torch.Tensor | None,
        replace: bool = False,
    ) -> torch.Tensor:
        q, k, v, g = (t[:, :, offset:] for t in self.qkvg(x))
        o = gla_recurrent(q, k, v, g, initial=initial_state, replace_first=replace)
        return self.finish(o, x[:, offset:])
