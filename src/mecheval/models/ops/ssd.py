"""Mamba-2's state space duality (SSD): a scalar-decay selective scan per head.

:func:`ssd_recurrent` is the step-by-step reference; :func:`ssd_chunked` the chunked form
(segment sums within a chunk, a recurrence across chunks) the module runs, as mamba_ssm's
``ssd_minimal``.

``neg_eigval`` (Grazzi et al., 2025) widens each head's transition from exp(dt_t A) ∈ (0, 1) to
2 exp(dt_t A) - 1 ∈ (-1, 1), the drive dt_t x_t B_tᵀ unchanged. A negative decay has no
logarithm, so the chunked form then multiplies the decays over each span
(:func:`~mecheval.models.ops.decay.segment_products`) instead of exponentiating sums of
log-decays.
"""

from __future__ import annotations

import torch

from mecheval.models.ops.decay import (
    balanced_chunks,
    pad_steps,
    segment_products,
    segment_sums,
)
from mecheval.models.ops.steps import run_steps


def ssd_recurrent(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    initial: torch.Tensor | None = None,
    keep: bool = False,
    replace_first: bool = False,
    neg_eigval: bool = False,
):
    """The SSD recurrence one step at a time (the specification, not for speed).

    x: [batch, T, H, P]; dt: [batch, T, H] (already softplus-ed); A, D: [H];
    B, C: [batch, T, G, N] with H a multiple of G (head h reads group h // (H / G))
    -> y: [batch, T, H, P], where per head
    h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_tᵀ,  y_t = h_t C_t + D x_t.
    ``initial`` [batch, H, P, N]: the state before the first step, or with ``replace_first``
    after it (its update skipped); with ``keep`` also every state after each step,
    [batch, T, H, P, N] (resuming from a prefix: ``Mixer.final_states``). ``neg_eigval``: the
    decay is 2 exp(dt_t A) - 1 instead of exp(dt_t A).
    """
    batch, length, heads, p = x.shape
    per_group = heads // B.shape[2]
    B = B.repeat_interleave(per_group, dim=2)  # [batch, T, H, N]
    C = C.repeat_interleave(per_group, dim=2)
    state = x.new_zeros(batch, heads, p, B.shape[-1]) if initial is None else initial

    def update(t: int, state: torch.Tensor) -> torch.Tensor:
        decay = torch.exp(dt[:, t] * A)[..., None, None]
        if neg_eigval:
            decay = 2 * decay - 1
        drive = (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, :, None, :]
        return decay * state + drive

    def read(t: int, state: torch.Tensor) -> torch.Tensor:
        return (state * C[:, t, :, None, :]).sum(-1) + D[:, None] * x[:, t]

    return run_steps(length, state, update, read, 1, keep, replace_first)


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    chunk_size: int,
    neg_eigval: bool = False,
) -> torch.Tensor:
    """The same function as :func:`ssd_recurrent`, in chunks of at most ``chunk_size`` steps
    (:func:`~mecheval.models.ops.decay.balanced_chunks`).

    With a_t = dt_t A (≤ 0), Λ_t its running sum inside a chunk and S[l, s] = a_{s+1} + ... +
    a_l (:func:`segment_sums`), the output splits into
    * within the chunk: y_l = Σ_{s≤l} (C_l · B_s) exp(S[l, s]) dt_s x_s (a masked,
      attention-like product: the "dual" quadratic form);
    * from earlier chunks: y_l += exp(Λ_l) C_l · h_in, with h_in the state entering the chunk.
    Each chunk's own contribution to the state at its end is Σ_s exp(S[end, s]) dt_s x_s B_sᵀ,
    and the state entering chunk z sums those of chunks j < z, decayed by the total decay of
    the chunks between (segment sums again, over chunk totals). Every exponent is a sum of
    a's, hence ≤ 0: no exp overflows, whatever Δ and A become in training.

    With ``neg_eigval`` the decays α_t = 2 exp(dt_t A) - 1 may be negative: every exp(sum of
    a's) above becomes the product of the α's over the same span (|α| ≤ 1, so no product
    grows either).
    """
    batch, length, heads, p = x.shape
    groups, n_state = B.shape[2], B.shape[3]
    per_group = heads // groups
    n, c = balanced_chunks(length, chunk_size)
    pad = n * c - length
    x_in = x
    # Trailing zeros: dt = 0 neither decays nor writes (exp(0) = 2 exp(0) - 1 = 1), and the
    # padded outputs are dropped.
    x, B, C = pad_steps(pad, -3, x, B, C)
    (dt,) = pad_steps(pad, -2, dt)
    # Heads split as (group, head in group): head h = g * per_group + r reads group g. Every
    # operand is laid out head-major and contiguous, [batch, G, (R,) n, c, ...], so that each
    # contraction is one batched matmul (strided operands send bmm down a per-matrix loop).
    xdt = (x * dt[..., None]).reshape(batch, n, c, groups, per_group, p)
    xdt = xdt.permute(0, 3, 4, 1, 2, 5).contiguous()  # [batch, G, R, n, c, P]
    Bc = B.reshape(batch, n, c, groups, n_state).permute(0, 3, 1, 2, 4).contiguous()
    Cc = C.reshape(batch, n, c, groups, n_state).permute(0, 3, 1, 2, 4).contiguous()
    log_decay = (dt * A).reshape(batch, n, c, groups, per_group).permute(0, 3, 4, 1, 2)
    if neg_eigval:
        signed = 2 * log_decay.exp() - 1  # [batch, G, R, n, c]
        within = segment_products(signed)  # [batch, G, R, n, c, c]
    else:
        segment = segment_sums(log_decay)  # [batch, G, R, n, c, c]
        within = segment.exp()

    scores = (Cc @ Bc.transpose(-1, -2))[:, :, None] * within  # [batch, G, R, n, l, s]
    y = scores @ xdt  # [batch, G, R, n, c, P]

    if n > 1:
        # Each chunk's contribution to the state at its own end: [batch, G, R, n, P, N].
        to_end = within[..., -1, :] if neg_eigval else segment[..., -1, :].exp()
        states = (xdt * to_end[..., None]).transpose(-1, -2) @ Bc[:, :, None]
        # State entering chunk z: h_0 = 0, h_{z+1} = exp(total decay of chunk z) h_z + states_z,
        # a short loop over the chunks (a matmul over the chunk index is n x n: tiny and slow).
        if neg_eigval:
            chunk_decay = signed.prod(-1)[..., None, None]
        else:
            chunk_decay = log_decay.sum(-1).exp()[..., None, None]  # [batch, G, R, n, 1, 1]
        h = torch.zeros_like(states[:, :, :, 0])
        entering = [h]
        for z in range(n - 1):
            h = torch.addcmul(states[:, :, :, z], chunk_decay[:, :, :, z], h)
            entering.append(h)
        entering = torch.stack(entering, dim=3)  # [batch, G, R, n, P, N]
        # exp(Λ_l): decay from the chunk's start to l
        into = signed.cumprod(-1) if neg_eigval else log_decay.cumsum(-1).exp()
        y = y + (Cc[:, :, None] @ entering.transpose(-1, -2)) * into[..., None]

    y = y.permute(0, 3, 4, 1, 2, 5).reshape(batch, n * c, heads, p)[:, :length]
    return y + D[:, None] * x_in
