"""Retention (RetNet): S_t = γ S_{t-1} + k_t v_tᵀ per head with a fixed decay γ_h.

:func:`retention_recurrent` is the step-by-step reference; :func:`retention_parallel` the
parallel (decay-masked attention) form the module runs.
"""

from __future__ import annotations

import torch


def retention_decays(
    num_heads: int, dtype: torch.dtype = torch.float64, device: torch.device | None = None
) -> torch.Tensor:
    """γ_h = 1 - 2^(-5 - h) for h = 0 .. H-1 (fla's ``1 - 2**(-5 - arange(H))``)."""
    return 1 - 2.0 ** (-5 - torch.arange(num_heads, dtype=dtype, device=device))


def retention_recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gamma: torch.Tensor
) -> torch.Tensor:
    """Retention one step at a time: S_t = γ S_{t-1} + k_t v_tᵀ, o_t = q_tᵀ S_t.

    q, k: [B, H, T, d_k]; v: [B, H, T, d_v]; gamma: [H] -> o: [B, H, T, d_v]. q as given."""
    b, h, length, d_k = k.shape
    state = k.new_zeros(b, h, d_k, v.shape[-1])
    decay = gamma.to(k.dtype)[:, None, None]
    outs = []
    for t in range(length):
        state = decay * state + k[:, :, t, :, None] * v[:, :, t, None]
        outs.append((q[:, :, t, :, None] * state).sum(-2))
    return torch.stack(outs, dim=2)


def retention_parallel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gamma: torch.Tensor
) -> torch.Tensor:
    """The same function as :func:`retention_recurrent`: (Q Kᵀ ⊙ D) V with
    D_ts = exp((t - s) log γ) for s <= t and 0 above the diagonal (every exponent <= 0)."""
    t = q.shape[2]
    pos = torch.arange(t, device=q.device)
    gaps = pos[:, None] - pos[None, :]
    causal = gaps >= 0
    log_gamma = torch.log(gamma).to(q.dtype)[:, None, None]  # [H, 1, 1]
    decay = torch.exp(log_gamma * gaps.clamp(min=0).to(q.dtype)) * causal  # [H, T, T]
    return ((q @ k.transpose(-1, -2)) * decay) @ v
