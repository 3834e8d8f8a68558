"""The delta rule (DeltaNet): S_t = S_{t-1} + β_t k_t (v_t - S_{t-1}ᵀ k_t)ᵀ, o_t = S_tᵀ q_t.

:func:`delta_rule_recurrent` is the step-by-step reference; :func:`delta_rule_chunked` the
chunked (WY) form the module runs, as fla's ``ops/delta_rule`` (``naive`` and ``chunk``).
"""

from __future__ import annotations

from functools import partial

import torch

from mecheval.models.ops.decay import balanced_chunks, pad_steps
from mecheval.models.ops.steps import run_steps
from mecheval.models.ops.triton_path import triton_for_training


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

    def update(t: int, state: torch.Tensor) -> torch.Tensor:
        return delta_update(state, k[:, :, t], v[:, :, t], beta[:, :, t])

    return run_steps(length, state, update, partial(read_state, q), 2, keep)


def delta_update(
    state: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, beta_t: torch.Tensor
) -> torch.Tensor:
    """One step of the delta rule: S + β (v - S k) kᵀ, for the state S [..., d_v, d_k], k_t
    [..., d_k], v_t [..., d_v] and β_t [...]: the state corrects what it predicts for k_t
    towards v_t by the step size β_t."""
    predicted = (state @ k_t[..., None])[..., 0]
    error = beta_t[..., None] * (v_t - predicted)
    return state + error[..., :, None] * k_t[..., None, :]


def read_state(q: torch.Tensor, t: int, state: torch.Tensor) -> torch.Tensor:
    """The output S q_t at step t of a state S [B, H, d_v, d_k] that maps keys to values."""
    return (state @ q[:, :, t][..., None])[..., 0]


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
    [B, H, d_v, d_k]: the state before the first step (zeros if None). A CUDA training step
    from zeros may run the Triton kernels instead (models/ops/triton_path.py).
    """
    if initial is None and triton_for_training("delta_rule", q, k, v, beta):
        from mecheval.models.ops.delta_rule_triton import delta_rule_triton

        return delta_rule_triton(q, k, v, beta)
    b, h, length, d_k = k.shape
    d_v = v.shape[-1]
    n, c = balanced_chunks(length, chunk_size)
    pad = n * c - length
    # Trailing zeros: β = 0 leaves the state untouched and the padded outputs are dropped.
    q, k, v = pad_steps(pad, -2, q, k, v)
    (beta,) = pad_steps(pad, -1, beta)
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
