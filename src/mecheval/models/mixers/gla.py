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

The forward pass uses the chunked form :func:`gla_chunked`, or in a training step on a CPU the
recurrence in C (``csrc/gla.c``, models/native.py); :func:`gla_recurrent` is fla's naive
recurrence, one step at a time (the specification, for tests and :meth:`GLA.mix_recurrent`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from mecheval.models import native
from mecheval.models.mixers.base import Mixer, ShortConv
from mecheval.models.mixers.decay import balanced_chunks

#: :func:`gla_recurrent` from a zero state in a training step, by ``csrc/gla.c``
#: (models/native.py): q, k, g [B, H, T, d_k], v [B, H, T, d_v], contiguous. A head's state
#: is d_k x d_v floats (8 x 16 at d = 64), so the recurrence costs little; the chunked form's
#: per-channel decay products took ~13 of GLA's ~32 ms training step at T = 35.
_NativeGLA = native.autograd_function(
    "gla",
    sizes=lambda q, k, v, g: (q.shape[0] * q.shape[1], q.shape[2], q.shape[3], v.shape[3]),
    output=lambda q, k, v, g: v.new_empty(v.shape),
)


class GLAOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

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
    chunk_size: int = Field(
        16, ge=1, le=4096, description="longest block of the chunked form (blocks are balanced)"
    )


def gla_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    initial: torch.Tensor | None = None,
    keep: bool = False,
    replace_first: bool = False,
):
    """The GLA recurrence one step at a time (fla's ``naive_recurrent_gla``, without its scale).

    q, k, g: [B, H, T, d_k] (g: log-gates, <= 0); v: [B, H, T, d_v] -> o: [B, H, T, d_v].
    S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ and o_t = q_tᵀ S_t; q is used as given.
    ``initial`` [B, H, d_k, d_v]: the state before the first step, or with ``replace_first``
    after it (its update skipped); with ``keep`` also every state after each step,
    [B, T, H, d_k, d_v] (resuming from a prefix: ``Mixer.prefix_states``).
    """
    b, h, length, d_k = k.shape
    state = k.new_zeros(b, h, d_k, v.shape[-1]) if initial is None else initial
    outs, states = [], []
    for t in range(length):
        if t or not replace_first:
            decayed = torch.exp(g[:, :, t, :, None]) * state
            state = decayed + k[:, :, t, :, None] * v[:, :, t, None]
        outs.append((q[:, :, t, :, None] * state).sum(-2))
        states.append(state)
    o = torch.stack(outs, dim=2)
    return (o, torch.stack(states, dim=1)) if keep else o


def _span_masks(
    m: int, e: int, with_state: bool, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, list[int]]:
    """0/1 rows R [rows, c] (c = m e steps of a chunk, sub-chunks of e) such that R @ g sums
    g_r over the spans :func:`gla_chunked` needs, each span on its own (no differences of
    running sums): per sub-chunk j and key s, s < r < j e (key s to the sub-chunk's start);
    per sub-chunk and pair (t, s) in it, s < r <= t; per step t, its sub-chunk's start <= r
    <= t (the sub-chunk's start to the query); with ``with_state`` also per step s, r > s
    (to the chunk's end) and, per step t, r <= t (the chunk's start to t). Returns the
    stacked rows and their group sizes."""
    c = m * e
    r = torch.arange(c, device=device)
    start = (r // e) * e  # each step's sub-chunk start
    sub_starts = torch.arange(m, device=device) * e
    to_sub = (r[None, :, None] < r[None, None, :]) & (r[None, None, :] < sub_starts[:, None, None])
    local = r.view(m, e)  # [m, e]: the steps of each sub-chunk
    pair = (local[:, None, :, None] < r) & (r <= local[:, :, None, None])  # [m, t, s, r]
    from_sub = (start[:, None] <= r[None, :]) & (r[None, :] <= r[:, None])
    groups = [to_sub.reshape(m * c, c), pair.reshape(m * e * e, c), from_sub]
    if with_state:
        groups += [r[None, :] > r[:, None], r[None, :] <= r[:, None]]
    return torch.cat(groups).to(dtype), [x.shape[0] for x in groups]


def gla_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    chunk_size: int,
    sub_chunk_size: int | None = None,
) -> torch.Tensor:
    """The same function as :func:`gla_recurrent`, in chunks of at most ``chunk_size`` steps
    (:func:`~mecheval.models.mixers.decay.balanced_chunks`), each cut into sub-chunks of
    about ``sub_chunk_size`` steps (None: about the square root of the chunk length).

    Within a chunk that starts from the state S_0, with the log-gates summed over spans
    (per key channel):
        o_t = (q_t ⊙ exp(Σ_{r<=t} g_r))ᵀ S_0 + Σ_{s<=t} (Σ_j q_tj k_sj exp(Σ_{s<r<=t} g_rj)) v_s
    and the next chunk starts from diag(exp(Σ_r g_r)) S_0 + Σ_s (k_s ⊙ exp(Σ_{r>s} g_r)) v_sᵀ.
    The scores within the chunk are a [c, c] matrix per head, then one matmul with V:
    * a key s before the query's sub-chunk (starting at p) splits the decay at p:
      exp(Σ_{s<r<p} g) ⊙ exp(Σ_{p<=r<=t} g), a key factor per (sub-chunk, key) and a query
      factor per query, so those scores are matmuls (fla's secondary chunking);
    * a key in the query's own sub-chunk takes the per-channel pairwise decay, a
      [e, e, d_k] tensor per sub-chunk.
    Every exponent is a sum of log-gates (<= 0) over a span, summed on its own as a 0/1
    matrix product with g (:func:`_span_masks`), never the difference of two running sums
    (which, with strong gates, would lose the small decays to cancellation in float32) and
    never negated, so nothing overflows however strong the gates; no division by a decay.
    Pairs above the diagonal are masked after the exponential of a finite (<= 0) exponent.
    """
    b, h, length, d_k = k.shape
    d_v = v.shape[-1]
    n, c = balanced_chunks(length, chunk_size)
    m, e = balanced_chunks(c, sub_chunk_size or math.isqrt(max(c - 1, 0)) + 1)
    c = m * e
    pad = n * c - length
    if pad:
        # Trailing zeros: g = 0 keeps the state, k = 0 writes nothing; the padded outputs come
        # after every real step and are dropped.
        q, k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g))
    q, k, v, g = (x.reshape(b, h, n, c, x.shape[-1]) for x in (q, k, v, g))
    rows, sizes = _span_masks(m, e, n > 1, g.device, g.dtype)
    # Every span sum (<= 0) as one matmul, time on the rows and all else on the columns (a
    # batched matmul with d_k columns would be thin and slow), then back to [b, h, n, rows, d_k].
    spans = rows @ g.permute(3, 0, 1, 2, 4).reshape(c, -1)
    spans = spans.view(-1, b, h, n, d_k).permute(1, 2, 3, 0, 4).split(sizes, dim=3)
    to_sub, pair, from_sub = spans[:3]

    # Keys before the query's sub-chunk: matmuls of decayed queries and keys.
    k_sub = k[:, :, :, None] * to_sub.unflatten(3, (m, c)).exp()  # [b, h, n, m, c, d_k]
    q_sub = (q * from_sub.exp()).view(b, h, n, m, e, d_k)
    sub_starts = torch.arange(m, device=g.device) * e
    before = torch.arange(c, device=g.device) < sub_starts[:, None, None]  # [m, 1, c]
    inter = (q_sub @ k_sub.transpose(-1, -2)) * before  # [b, h, n, m, e, c]
    # Keys in the query's own sub-chunk: per-channel pairwise decays (0 above the diagonal).
    causal = torch.ones(e, e, dtype=torch.bool, device=g.device).tril()[..., None]
    decay = pair.unflatten(3, (m, e, e)).exp() * causal
    qs, ks = q.view(b, h, n, m, e, 1, d_k), k.view(b, h, n, m, 1, e, d_k)
    intra = (qs * decay * ks).sum(-1)  # [b, h, n, m, e, e]
    eye = torch.eye(m, dtype=g.dtype, device=g.device)[:, None, :, None]
    scores = inter.view(b, h, n, m, e, m, e) + intra[..., None, :] * eye
    out = scores.view(b, h, n, c, c) @ v  # [b, h, n, c, d_v]
    if n == 1:
        return out.view(b, h, c, d_v)[:, :, :length]

    to_end, from_start = spans[3:]
    q_in = q * from_start.exp()  # reads the chunk's incoming state
    k_out = (k * to_end.exp()).transpose(-1, -2)  # writes, decayed to the chunk's end
    carry = from_start[..., -1, :].exp()[..., None]  # [b, h, n, d_k, 1]
    state = k_out[:, :, 0] @ v[:, :, 0]
    outs = [out[:, :, 0]]
    for i in range(1, n):
        outs.append(out[:, :, i] + q_in[:, :, i] @ state)
        if i < n - 1:
            state = carry[:, :, i] * state + k_out[:, :, i] @ v[:, :, i]
    return torch.stack(outs, dim=2).reshape(b, h, n * c, d_v)[:, :, :length]


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
        b, _, t, _ = o.shape
        gate = self.g_proj(x).view(b, t, self.num_heads, self.head_v_dim)
        o = self.g_norm_swish_gate(o.transpose(1, 2)) * F.silu(gate)
        return self.o_proj(o.reshape(b, t, self.value_dim))

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

    # Resuming from a prefix (Mixer.prefix_states): S after each position, by the recurrence.
    has_recurrent_state = True

    def prefix_halo(self) -> int:
        return self.options.conv_size - 1 if self.has_conv else 0

    def prefix_states(self, x: torch.Tensor) -> torch.Tensor:
        return gla_recurrent(*self.qkvg(x), keep=True)[1]

    def mix_from(
        self, x: torch.Tensor, offset: int, state: torch.Tensor | None, replace: bool = False
    ) -> torch.Tensor:
        q, k, v, g = (t[:, :, offset:] for t in self.qkvg(x))
        o = gla_recurrent(q, k, v, g, initial=state, replace_first=replace)
        return self.finish(o, x[:, offset:])
