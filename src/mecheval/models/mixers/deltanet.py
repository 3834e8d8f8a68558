"""DeltaNet (Schlag et al., 2021; Yang et al., 2024), following the defaults of fla's
``fla.layers.DeltaNet`` that the paper trains (it gives no table for DeltaNet):

    q, k, v = SiLU(q_conv(W_q x)), SiLU(k_conv(W_k x)), SiLU(v_conv(W_v x))   per head:
    q, k    = q / |q|, k / |k|          (fla: qk_activation="silu", qk_norm="l2")
    q       = q / sqrt(d_head)          (fla's kernels scale q by d_k^-0.5 by default)
    β_t     = sigmoid(w_β · x_t)        one per head (use_beta=True)
    S_t     = S_{t-1} + β_t (v_t - S_{t-1} k_t) k_tᵀ,   o_t = S_t q_t
    out     = o_proj(RMSNorm_head(o))    fla normalises each head's output (o_norm) when
                                         use_gate=False, its default

As in fla, the projections, β and the convolutions have no bias (conv_bias=False) and the
convolutions have kernel size 4. The output projection keeps fla's name ``o_proj``: the paper's
init (zoology's ``_init_weights``) rescales only ``out_proj``/``fc2`` by 1/sqrt(2 n_layers), so
``o_proj`` stays at N(0, init_std), as in the paper's models.

Heads: fla's layer defaults to 4, but the paper's code builds it with ``num_heads: n_head``
(tinylang ``tinylang/model/zoology.py``, mixer ``delta_net``) and every released config sets
``n_head: 1``, so ``num_heads`` defaults to 1 here; ``num_heads: 4`` gives fla's default.

The forward pass uses the chunked parallel form (:func:`delta_rule_chunked`); the step-by-step
:func:`delta_rule_recurrent` computes the same function one step at a time (for debugging and
the state interface). Both, and the whole layer, are tested against a delta rule and a layer
written out independently in tests/test_references.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from mecheval.models.mixers.base import Mixer, optional_conv
from mecheval.models.mixers.decay import balanced_chunks


class DeltaNetOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

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
    chunk_size: int = Field(
        64, ge=1, description="longest block of the chunked form (balanced; fla's chunks: 64)"
    )


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # fla's form (eps inside the root), so a zero vector maps to zero with finite gradients.
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def delta_rule_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    keep: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The delta rule one step at a time (the specification, not for speed).

    q, k: [B, H, T, d_k]; v: [B, H, T, d_v]; beta: [B, H, T] -> o: [B, H, T, d_v].
    q and k are used as given (normalisation and scaling happen in the caller).
    With ``keep`` also every state after each step, [B, T, H, d_v, d_k].
    """
    b, h, length, d_k = k.shape
    # S maps keys to values: S k ≈ v
    state = k.new_zeros(b, h, v.shape[-1], d_k)
    outs, states = [], []
    for t in range(length):
        k_t, v_t, q_t = k[:, :, t], v[:, :, t], q[:, :, t]
        predicted = (state @ k_t[..., None])[..., 0]
        error = beta[:, :, t, None] * (v_t - predicted)
        state = state + error[..., :, None] * k_t[..., None, :]
        outs.append((state @ q_t[..., None])[..., 0])
        states.append(state)
    o = torch.stack(outs, dim=2)
    return (o, torch.stack(states, dim=1)) if keep else o


class _UnitLowerInverse(torch.autograd.Function):
    """T = (I + L)⁻¹ for strictly lower-triangular L [..., c, c] (entries on and above the
    diagonal are not read), by one triangular solve against the identity.

    Autograd through ``solve_triangular(I + L, rhs)`` costs a second triangular solve in the
    backward pass (and, with a wide right-hand side, dominated the chunked rule's time); with
    the inverse at hand the adjoint is two matmuls, dL = -(Tᵀ dT Tᵀ) below the diagonal.
    ``generate_vmap_rule`` keeps it usable under torch.func (stacked training).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(strict: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        eye = torch.eye(strict.shape[-1], dtype=strict.dtype, device=strict.device)
        # LAPACK leaves the solution column-major; row-major keeps the matmuls on it fast.
        return torch.linalg.solve_triangular(
            strict, eye.expand_as(strict), upper=False, unitriangular=True
        ).contiguous()

    @staticmethod
    def setup_context(
        ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: torch.Tensor
    ) -> None:
        ctx.save_for_backward(output)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> torch.Tensor:
        (inverse,) = ctx.saved_tensors  # type: ignore[attr-defined]
        t = inverse.transpose(-1, -2)
        return -(t @ grad @ t).tril(-1)


def unit_lower_inverse(strict: torch.Tensor) -> torch.Tensor:
    """(I + L)⁻¹ for the strictly lower-triangular part L of ``strict`` [..., c, c], in float32
    at least (LAPACK has no half-precision triangular solve; under a bf16 autocast the
    products that build L come in as bf16)."""
    if strict.dtype in (torch.float16, torch.bfloat16):
        strict = strict.float()
    return _UnitLowerInverse.apply(strict)


def delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int,
    initial: torch.Tensor | None = None,
) -> torch.Tensor:
    """The same function as :func:`delta_rule_recurrent`, in chunks (Yang et al., 2024, §3).

    Write the state as S_t = S_0 + Σ_{s≤t} u_s k_sᵀ within a chunk that starts from S_0.
    The "pseudo-values" u_t = β_t (v_t - S_{t-1} k_t) then satisfy, for the chunk's rows,
        (I + L) U = diag(β) V - diag(β) K S_0ᵀ,   L = strictly-lower(diag(β) K Kᵀ),
    a unit lower-triangular system (the UT transform of the WY representation), solved for
    every chunk at once. Outputs are O = Q S_0ᵀ + causal(Q Kᵀ) U and the next chunk starts
    from S_0 + Uᵀ K; only this cheap hand-over between chunks stays sequential. ``initial``
    [B, H, d_v, d_k]: the state before the first step (zeros if None).
    """
    b, h, length, d_k = k.shape
    d_v = v.shape[-1]
    n, c = balanced_chunks(length, chunk_size)
    pad = n * c - length
    if pad:
        # Trailing zeros: β = 0 leaves the state untouched and the padded outputs are dropped;
        # being after every real step they cannot reach a real output anyway.
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        beta = F.pad(beta, (0, pad))
    q, k, v = (x.reshape(b, h, n, c, x.shape[-1]) for x in (q, k, v))
    beta = beta.reshape(b, h, n, c, 1)

    k_beta = k * beta
    # T = (I + L)⁻¹ once (above the diagonal L is not read), then both halves of U as one
    # product: u = T β V and w = T β K. A chunk entered with S_0 = 0 (the first, without
    # ``initial``) reads no w, and a single such chunk (T = 35 at the default size) none.
    inverse = unit_lower_inverse(k_beta @ k.transpose(-1, -2))
    if n == 1 and initial is None:
        u, w = inverse @ (v * beta), None
    else:
        u, w = (inverse @ torch.cat([v * beta, k_beta], dim=-1)).split([d_v, d_k], dim=-1)
    causal = torch.ones(c, c, dtype=torch.bool, device=k.device).tril()
    scores = (q @ k.transpose(-1, -2)) * causal

    # Stored transposed (Sᵀ) so rows multiply on the left; None while it is zero.
    state = None if initial is None else initial.transpose(-1, -2)
    outs = []
    for i in range(n):
        if state is None:
            u_i = u[:, :, i]
            outs.append(scores[:, :, i] @ u_i)
        else:
            u_i = u[:, :, i] - w[:, :, i] @ state
            outs.append(q[:, :, i] @ state + scores[:, :, i] @ u_i)
        if i < n - 1:  # the state after the last chunk is not returned
            written = k[:, :, i].transpose(-1, -2) @ u_i
            state = written if state is None else state + written
    return torch.stack(outs, dim=2).reshape(b, h, n * c, d_v)[:, :, :length]


class DeltaNet(Mixer):
    def __init__(self, d_model: int, options: DeltaNetOptions) -> None:
        super().__init__()
        if d_model % options.num_heads:
            raise ValueError(
                f"model.d_model: {d_model} is not divisible by "
                f"model.mixer.num_heads={options.num_heads}"
            )
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

    # Resuming from a prefix (Mixer.prefix_states): the state is S after each position,
    # [B, T, H, d_v, d_k]; the q, k, v convs read conv_size - 1 inputs before the cut.
    def prefix_halo(self) -> int:
        return 0 if self.options.conv_size is None else self.options.conv_size - 1

    def prefix_states(self, x: torch.Tensor) -> torch.Tensor:
        return delta_rule_recurrent(*self.qkv_beta(x), keep=True)[1]

    def mix_from(
        self, x: torch.Tensor, offset: int, state: torch.Tensor | None, replace: bool = False
    ) -> torch.Tensor:
        q, k, v, beta = (t[:, :, offset:] for t in self.qkv_beta(x))
        chunk = self.options.chunk_size
        if not replace:
            return self.finish(delta_rule_chunked(q, k, v, beta, chunk, initial=state))
        # The state after the window's first position is given: its output reads it, the
        # rest of the window continues from it.
        first = (state @ q[:, :, 0, :, None]).transpose(2, 3)
        if q.shape[2] == 1:
            return self.finish(first)
        rest = delta_rule_chunked(
            q[:, :, 1:], k[:, :, 1:], v[:, :, 1:], beta[:, :, 1:], chunk, state
        )
        return self.finish(torch.cat([first, rest], dim=2))

    has_recurrent_state = True
    resume_from_prefix = False  # recomputing the window is faster (Mixer.resume_from_prefix)

    def mix_recurrent(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`mix` with the step-by-step delta rule (for tests and debugging)."""
        q, k, v, beta = self.qkv_beta(x)
        return self.finish(delta_rule_recurrent(q, k, v, beta))
