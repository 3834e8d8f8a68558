"""The (gated) delta rule as two Triton kernels (forward, backward): the GPU form of
:func:`~mecheval.models.ops.delta_rule.delta_rule_chunked` (DeltaNet) and
:func:`~mecheval.models.ops.gated_delta_rule.gated_delta_rule_chunked` (Gated DeltaNet).

Why: at the paper's sizes (T = 35, a head's state 16 x 16 at d = 64) the chunked PyTorch forms
are dozens of small kernels forward and backward; here one program holds one head's state
[d_v, d_k] in registers and walks time once, as fla's ``fused_recurrent`` kernels do.

The recurrence is the references' (``delta_rule_recurrent``, ``gated_delta_rule_recurrent``):
S' = α_t S_{t-1} (α_t = exp(g_t), 1 without a gate), e_t = β_t (v_t - S' k_t),
S_t = S' + e_t k_tᵀ, o_t = S_t q_t. The backward walks time in reverse with the adjoint D of
S_t (D += do_t q_tᵀ; the error's adjoint de = D k_t; D' = D - β_t de k_tᵀ is S''s adjoint;
D ← α_t D' for S_{t-1}); the forward keeps every state for it.

The kernels take no parameters, only activations, so a vmapped stack of runs folds into the
batch (:func:`~mecheval.models.ops.triton_path.fold`): one launch for the whole stack.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mecheval.models.ops.triton_path import KernelGradient, fold, unfold


@triton.jit
def _forward_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, o_ptr, s_ptr,
    length, d_k, d_v,
    GATED: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)  # one (batch, head)
    i = tl.arange(0, BLOCK_V)
    j = tl.arange(0, BLOCK_K)
    i_ok, j_ok = i < d_v, j < d_k
    ij_ok = i_ok[:, None] & j_ok[None, :]
    state = tl.zeros([BLOCK_V, BLOCK_K], dtype=tl.float32)
    for t in range(length):
        pos = row * length + t
        q = tl.load(q_ptr + pos * d_k + j, mask=j_ok, other=0.0)
        k = tl.load(k_ptr + pos * d_k + j, mask=j_ok, other=0.0)
        v = tl.load(v_ptr + pos * d_v + i, mask=i_ok, other=0.0)
        beta = tl.load(beta_ptr + pos)
        if GATED:
            state = state * tl.exp(tl.load(g_ptr + pos))
        error = beta * (v - tl.sum(state * k[None, :], axis=1))
        state = state + error[:, None] * k[None, :]
        tl.store(o_ptr + pos * d_v + i, tl.sum(state * q[None, :], axis=1), mask=i_ok)
        tl.store(s_ptr + (pos * d_v + i[:, None]) * d_k + j[None, :], state, mask=ij_ok)


@triton.jit
def _backward_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, s_ptr, do_ptr,
    dq_ptr, dk_ptr, dv_ptr, dbeta_ptr, dg_ptr,
    length, d_k, d_v,
    GATED: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    i = tl.arange(0, BLOCK_V)
    j = tl.arange(0, BLOCK_K)
    i_ok, j_ok = i < d_v, j < d_k
    ij_ok = i_ok[:, None] & j_ok[None, :]
    zero = tl.zeros([BLOCK_V, BLOCK_K], dtype=tl.int32)  # t as a block, for the mask at t = 0
    adjoint = tl.zeros([BLOCK_V, BLOCK_K], dtype=tl.float32)  # of S_t, from later steps
    for step in range(length):
        t = length - 1 - step
        pos = row * length + t
        q = tl.load(q_ptr + pos * d_k + j, mask=j_ok, other=0.0)
        k = tl.load(k_ptr + pos * d_k + j, mask=j_ok, other=0.0)
        v = tl.load(v_ptr + pos * d_v + i, mask=i_ok, other=0.0)
        do = tl.load(do_ptr + pos * d_v + i, mask=i_ok, other=0.0)
        beta = tl.load(beta_ptr + pos)
        state = tl.load(s_ptr + (pos * d_v + i[:, None]) * d_k + j[None, :], mask=ij_ok, other=0.0)
        before = tl.load(s_ptr + ((pos - 1) * d_v + i[:, None]) * d_k + j[None, :],
                         mask=ij_ok & (zero + t > 0), other=0.0)  # fmt: skip
        if GATED:  # noqa: SIM108 - a compile-time branch of the kernel
            alpha = tl.exp(tl.load(g_ptr + pos))
        else:
            alpha = 1.0
        decayed = alpha * before  # S'
        adjoint = adjoint + do[:, None] * q[None, :]
        tl.store(dq_ptr + pos * d_k + j, tl.sum(state * do[:, None], axis=0), mask=j_ok)
        residual = v - tl.sum(decayed * k[None, :], axis=1)  # v - S' k
        error = beta * residual
        d_error = tl.sum(adjoint * k[None, :], axis=1)
        scaled = beta * d_error
        dk = tl.sum(adjoint * error[:, None], axis=0) - tl.sum(decayed * scaled[:, None], axis=0)
        tl.store(dk_ptr + pos * d_k + j, dk, mask=j_ok)
        tl.store(dv_ptr + pos * d_v + i, scaled, mask=i_ok)
        tl.store(dbeta_ptr + pos, tl.sum(d_error * residual, axis=0))
        adjoint = adjoint - scaled[:, None] * k[None, :]  # of S'
        if GATED:
            tl.store(dg_ptr + pos, tl.sum(tl.sum(adjoint * decayed, axis=1), axis=0))
        adjoint = alpha * adjoint


def _blocks(d_k: int, d_v: int) -> dict[str, int]:
    return {"BLOCK_K": triton.next_power_of_2(d_k), "BLOCK_V": triton.next_power_of_2(d_v)}


def rule_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, g: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [B, H, T, d_k]; v [B, H, T, d_v]; beta, g [B, H, T] (g None: no gate), float32
    -> o [B, H, T, d_v] and every state [B, H, T, d_v, d_k]."""
    q, k, v, beta = (t.contiguous() for t in (q, k, v, beta))
    batch, heads, length, d_k = k.shape
    d_v = v.shape[-1]
    o = torch.empty_like(v)
    states = v.new_empty(batch, heads, length, d_v, d_k)
    gate = beta if g is None else g.contiguous()  # not read without a gate
    _forward_kernel[(batch * heads,)](
        q, k, v, beta, gate, o, states, length, d_k, d_v, GATED=g is not None, **_blocks(d_k, d_v)
    )
    return o, states


def rule_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None,
    states: torch.Tensor,
    do: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """The gradients of :func:`rule_forward`'s o in q, k, v, beta and g (None without a gate)."""
    q, k, v, beta, states, do = (t.contiguous() for t in (q, k, v, beta, states, do))
    batch, heads, length, d_k = k.shape
    d_v = v.shape[-1]
    dq, dk, dv, dbeta = (torch.empty_like(t) for t in (q, k, v, beta))
    gate = beta if g is None else g.contiguous()
    dg = torch.empty_like(beta) if g is not None else dbeta  # not written without a gate
    _backward_kernel[(batch * heads,)](
        q, k, v, beta, gate, states, do, dq, dk, dv, dbeta, dg,
        length, d_k, d_v, GATED=g is not None, **_blocks(d_k, d_v),
    )  # fmt: skip
    return dq, dk, dv, dbeta, (dg if g is not None else None)


class _Rule(torch.autograd.Function):
    """:func:`rule_forward` with :func:`rule_backward` as its gradient; its vmap rule folds a
    stack of runs into the batch."""

    @staticmethod
    def forward(q, k, v, beta, g):  # type: ignore[override]
        return rule_forward(q, k, v, beta, g)

    @staticmethod
    def setup_context(
        ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple
    ) -> None:
        q, k, v, beta, g = inputs
        ctx.gated = g is not None
        ctx.save_for_backward(q, k, v, beta, output[1], *([g] if g is not None else []))
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, do, _dstates):  # type: ignore[override]
        q, k, v, beta, states, *gate = ctx.saved_tensors
        g = gate[0] if ctx.gated else None
        return _RuleGrad.apply(q, k, v, beta, g, states, do)

    @staticmethod
    def vmap(info, in_dims, q, k, v, beta, g):  # type: ignore[override]
        n = info.batch_size
        folded = [fold(n, t, dim) for t, dim in zip((q, k, v, beta), in_dims[:4], strict=True)]
        gate = None if g is None else fold(n, g, in_dims[4])
        o, states = _Rule.apply(*folded, gate)
        return (unfold(n, o), unfold(n, states)), (0, 0)


class _RuleGrad(KernelGradient):
    """:func:`rule_backward` as a function torch.func can vmap (not differentiable again)."""

    @staticmethod
    def forward(q, k, v, beta, g, states, do):  # type: ignore[override]
        return rule_backward(q, k, v, beta, g, states, do)

    @staticmethod
    def vmap(info, in_dims, q, k, v, beta, g, states, do):  # type: ignore[override]
        n = info.batch_size
        tensors = (q, k, v, beta, states, do)
        dims = (*in_dims[:4], *in_dims[5:])
        folded = [fold(n, t, dim) for t, dim in zip(tensors, dims, strict=True)]
        gate = None if g is None else fold(n, g, in_dims[4])
        grads = _RuleGrad.apply(*folded[:4], gate, *folded[4:])
        dims_out = tuple(None if grad is None else 0 for grad in grads)
        return tuple(None if grad is None else unfold(n, grad) for grad in grads), dims_out


def delta_rule_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
) -> torch.Tensor:
    """The delta rule (``g`` None) or the gated delta rule: q, k [B, H, T, d_k]; v
    [B, H, T, d_v]; beta, g [B, H, T] -> o [B, H, T, d_v]."""
    return _Rule.apply(q, k, v, beta, g)[0]
