"""The gated delta rule (Gated DeltaNet): the delta rule with a per-step decay α_t of the state.

:func:`gated_delta_rule_recurrent` is the step-by-step reference; :func:`gated_delta_rule_chunked`
the chunked form the module runs, as fla's ``ops/gated_delta_rule``.
"""

from __future__ import annotations

from functools import partial

import torch

from mecheval.models.ops.decay import balanced_chunks, pad_steps, segment_sums
from mecheval.models.ops.delta_rule import delta_update, read_state, unit_lower_inverse
from mecheval.models.ops.steps import run_steps
from mecheval.models.ops.triton_path import triton_for_training


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
    step, [B, T, H, d_v, d_k] (resuming from a prefix: ``Mixer.final_states``).
    """
    b, h, length, d_k = k.shape
    # S maps keys to values: S k ≈ v
    state = k.new_zeros(b, h, v.shape[-1], d_k) if initial is None else initial

    def update(t: int, state: torch.Tensor) -> torch.Tensor:
        state = torch.exp(g[:, :, t])[..., None, None] * state
        return delta_update(state, k[:, :, t], v[:, :, t], beta[:, :, t])

    return run_steps(length, state, update, partial(read_state, q), 2, keep, replace_first)


def gated_delta_rule_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor,
    chunk_size: int,
) -> torch.Tensor:
    """The same function as :func:`gated_delta_rule_recurrent`, in chunks of at most
    ``chunk_size`` steps (:func:`~mecheval.models.ops.decay.balanced_chunks`).

    Within a chunk from S_0, with Λ_t the running sum of g and γ_t = exp(Λ_t), the state is
    S_t = γ_t S_0 + Σ_{s≤t} exp(Λ_t - Λ_s) u_s k_sᵀ with pseudo-values
    u_t = β_t (v_t - exp(g_t) S_{t-1} k_t). For the chunk's rows they solve
        (I + L) U = diag(β) V - diag(β γ) K S_0ᵀ,   L[t, s] = β_t exp(Λ_t - Λ_s) k_t·k_s (s < t),
    :func:`~mecheval.models.ops.delta_rule.delta_rule_chunked`'s unit lower-triangular
    system with the decays in, through the explicit inverse T = (I + L)⁻¹
    (:func:`unit_lower_inverse`, the UT transform): U = T β V - (T β γ K) S_0ᵀ. Outputs:
    O = diag(γ) Q S_0ᵀ + (Q Kᵀ ⊙ exp(Λ_t - Λ_s), s ≤ t) U; the next chunk starts from
    γ_end S_0 + Σ_s exp(Λ_end - Λ_s) u_s k_sᵀ. The first chunk starts from S_0 = 0, so its
    terms in S_0 are skipped (one chunk, as T = 35 with the default chunk size, has none).
    Every exponent is a sum of g over a span
    (:func:`~mecheval.models.ops.decay.segment_sums`, each span summed on its own rather
    than as a difference of running sums), so ≤ 0: nothing overflows, and entries above the
    diagonal are -inf before the exp (gradients 0). A CUDA training step may run the Triton
    kernels instead (models/ops/triton_path.py).
    """
    if triton_for_training("delta_rule", q, k, v, beta, g):
        from mecheval.models.ops.delta_rule_triton import delta_rule_triton

        return delta_rule_triton(q, k, v, beta, g)
    b, h, length, d_k = k.shape
    d_v = v.shape[-1]
    n, c = balanced_chunks(length, chunk_size)
    pad = n * c - length
    # Trailing zeros: β = 0 and g = 0 leave the state untouched; outputs there are dropped.
    q, k, v = pad_steps(pad, -2, q, k, v)
    beta, g = pad_steps(pad, -1, beta, g)
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
