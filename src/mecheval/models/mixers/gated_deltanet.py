"""Gated DeltaNet (Yang, Kautz & Hatamizadeh, 2025), as fla's ``fla.layers.GatedDeltaNet``
builds it (``layers/gated_deltanet.py``, recurrence as ``ops/gated_delta_rule/naive.py``):

    q, k, v = SiLU(q_conv(W_q x)), SiLU(k_conv(W_k x)), SiLU(v_conv(W_v x))   per head:
    q, k    = q / |q|, k / |k|              (fla: use_qk_l2norm_in_kernel=True)
    q       = q / sqrt(d_k)                 (the kernel's default scale)
    β_t     = sigmoid(b_proj x_t)           one per head
    g_t     = -exp(A_log) softplus(a_proj x_t + dt_bias)   log-decay per head, ≤ 0 (Mamba-2's)
    S_t     = exp(g_t) S_{t-1} + β_t (v_t - exp(g_t) S_{t-1} k_t) k_tᵀ,   o_t = S_t q_t
    out     = o_proj(RMSNorm_head(o) ⊙ SiLU(g_proj x))   (use_gate=True: FusedRMSNormGated,
                                                          the norm before the gate)

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

The forward pass uses the chunked form (:func:`gated_delta_rule_chunked`, the delta rule's
UT-transform chunks with the decays folded in); :func:`gated_delta_rule_recurrent` is the
step-by-step specification it is tested against.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from mecheval.models.mixers.base import Mixer, optional_conv
from mecheval.models.mixers.decay import balanced_chunks, segment_sums
from mecheval.models.mixers.deltanet import l2_normalize, unit_lower_inverse
from mecheval.models.mixers.mamba2 import GatedRMSNorm

#: fla's init of A (uniform) and Δ (log-uniform, floored), hard-coded in its layer
A_INIT_RANGE = (0.0, 16.0)
DT_MIN, DT_MAX, DT_INIT_FLOOR = 1e-3, 1e-1, 1e-4


class GatedDeltaNetOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_heads: int = Field(1, ge=1)
    head_dim: int | None = Field(None, ge=1, description="q/k size per head; null = d / heads")
    expand_v: float = Field(2.0, gt=0.0, description="value head size = expand_v * head_dim")
    use_gate: bool = Field(True, description="output gate SiLU(g_proj x) after the head norm")
    conv_size: int | None = Field(
        4, ge=1, description="kernel size of the q, k and v short convs (null: none)"
    )
    conv_bias: bool = False
    norm_eps: float = Field(1e-5, gt=0.0)
    chunk_size: int = Field(
        64, ge=1, description="longest block of the chunked form (blocks are balanced)"
    )


def gated_delta_rule_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    initial: torch.Tensor | None = None,
    keep: bool = False,
    replace_first: bool = False,
):
    """The gated delta rule one step at a time (the specification, not for speed).

    q, k: [B, H, T, d_k]; v: [B, H, T, d_v]; beta, g: [B, H, T] (g the log-decay, ≤ 0)
    -> o: [B, H, T, d_v]. q and k are used as given (normalisation and scaling are the
    caller's). ``initial`` [B, H, d_v, d_k]: the state before the first step, or with
    ``replace_first`` after it (its update skipped); with ``keep`` also every state after each
    step, [B, T, H, d_v, d_k] (resuming from a prefix: ``Mixer.prefix_states``).
    """
    b, h, length, d_k = k.shape
    # S maps keys to values: S k ≈ v
    state = k.new_zeros(b, h, v.shape[-1], d_k) if initial is None else initial
    outs, states = [], []
    for t in range(length):
        k_t, v_t, q_t = k[:, :, t], v[:, :, t], q[:, :, t]
        if t or not replace_first:
            state = torch.exp(g[:, :, t])[..., None, None] * state
            predicted = (state @ k_t[..., None])[..., 0]
            error = beta[:, :, t, None] * (v_t - predicted)
            state = state + error[..., :, None] * k_t[..., None, :]
        outs.append((state @ q_t[..., None])[..., 0])
        states.append(state)
    o = torch.stack(outs, dim=2)
    return (o, torch.stack(states, dim=1)) if keep else o


def gated_delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    chunk_size: int,
) -> torch.Tensor:
    """The same function as :func:`gated_delta_rule_recurrent`, in chunks of at most
    ``chunk_size`` steps (:func:`~mecheval.models.mixers.decay.balanced_chunks`).

    Within a chunk from S_0, with Λ_t the running sum of g and γ_t = exp(Λ_t), the state is
    S_t = γ_t S_0 + Σ_{s≤t} exp(Λ_t - Λ_s) u_s k_sᵀ with pseudo-values
    u_t = β_t (v_t - exp(g_t) S_{t-1} k_t). For the chunk's rows they solve
        (I + L) U = diag(β) V - diag(β γ) K S_0ᵀ,   L[t, s] = β_t exp(Λ_t - Λ_s) k_t·k_s (s < t),
    :func:`~mecheval.models.mixers.deltanet.delta_rule_chunked`'s unit lower-triangular
    system with the decays in, through the explicit inverse T = (I + L)⁻¹
    (:func:`unit_lower_inverse`, the UT transform): U = T β V - (T β γ K) S_0ᵀ. Outputs:
    O = diag(γ) Q S_0ᵀ + (Q Kᵀ ⊙ exp(Λ_t - Λ_s), s ≤ t) U; the next chunk starts from
    γ_end S_0 + Σ_s exp(Λ_end - Λ_s) u_s k_sᵀ. The first chunk starts from S_0 = 0, so its
    terms in S_0 are skipped (one chunk, as T = 35 with the default chunk size, has none).
    Every exponent is a sum of g over a span
    (:func:`~mecheval.models.mixers.decay.segment_sums`, each span summed on its own rather
    than as a difference of running sums), so ≤ 0: nothing overflows, and entries above the
    diagonal are -inf before the exp (gradients 0).
    """
    b, h, length, d_k = k.shape
    d_v = v.shape[-1]
    n, c = balanced_chunks(length, chunk_size)
    pad = n * c - length
    if pad:
        # Trailing zeros: β = 0 and g = 0 leave the state untouched; outputs there are dropped.
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        beta, g = F.pad(beta, (0, pad)), F.pad(g, (0, pad))
    q, k, v = (x.reshape(b, h, n, c, x.shape[-1]) for x in (q, k, v))
    beta = beta.reshape(b, h, n, c, 1)
    g = g.reshape(b, h, n, c)
    segment = segment_sums(g)  # [b, h, n, c, c]: Λ_t - Λ_s summed over its own span
    decay = segment.exp()
    k_beta = k * beta
    strict = torch.ones(c, c, dtype=torch.bool, device=k.device).tril(-1)
    inverse = unit_lower_inverse((k_beta @ k.transpose(-1, -2)) * (decay * strict))
    scores = (q @ k.transpose(-1, -2)) * decay
    if n == 1:
        # (scores T) (β V): the [c, c] product first is the cheaper order, forward and back.
        return ((scores @ inverse) @ (v * beta)).reshape(b, h, c, d_v)[:, :, :length]
    u = inverse @ (v * beta)  # the pseudo-values of a chunk entered with S_0 = 0

    gamma = g.cumsum(-1).exp()[..., None]  # γ_t = exp(Λ_t): [b, h, n, c, 1]
    w = inverse @ (k_beta * gamma)  # u = T β V - w S_0ᵀ
    q_gamma = q * gamma
    k_to_end = (k * decay[..., -1, :, None]).transpose(-1, -2)  # exp(Λ_end - Λ_s) k_s, columns
    chunk_decay = g.sum(-1).exp()[..., None, None]  # [b, h, n, 1, 1]

    # The state is stored transposed (Sᵀ, [d_k, d_v]) so rows multiply on the left.
    u_i = u[:, :, 0]
    outs = [scores[:, :, 0] @ u_i]
    state = k_to_end[:, :, 0] @ u_i
    for i in range(1, n):
        u_i = u[:, :, i] - w[:, :, i] @ state
        outs.append(q_gamma[:, :, i] @ state + scores[:, :, i] @ u_i)
        if i < n - 1:
            state = chunk_decay[:, :, i] * state + k_to_end[:, :, i] @ u_i
    return torch.stack(outs, dim=2).reshape(b, h, n * c, d_v)[:, :, :length]


class GatedDeltaNet(Mixer):
    def __init__(self, d_model: int, options: GatedDeltaNetOptions) -> None:
        super().__init__()
        o = options
        heads = o.num_heads
        if o.head_dim is None and d_model % heads:
            raise ValueError(
                f"model.mixer.num_heads: {heads} does not divide model.d_model={d_model} "
                "(or set model.mixer.head_dim)"
            )
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

    # Resuming from a prefix (Mixer.prefix_states): S after each position, by the recurrence.
    has_recurrent_state = True
    resume_from_prefix = False  # recomputing the window is faster (Mixer.resume_from_prefix)

    def prefix_halo(self) -> int:
        size = self.options.conv_size
        return 0 if size is None else size - 1

    def prefix_states(self, x: torch.Tensor) -> torch.Tensor:
        return gated_delta_rule_recurrent(*self.rule_inputs(x), keep=True)[1]

    def mix_from(
        self, x: torch.Tensor, offset: int, state: torch.Tensor | None, replace: bool = False
    ) -> torch.Tensor:
        inputs = (t[:, :, offset:] for t in self.rule_inputs(x))
        o = gated_delta_rule_recurrent(*inputs, initial=state, replace_first=replace)
        return self.finish(o, x[:, offset:])
