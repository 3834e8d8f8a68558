"""Based's linear attention with the second-order Taylor feature map of exp.

:func:`linear_attention_recurrent` is the step-by-step reference; :func:`linear_attention_quadratic`
the causal quadratic form the module runs.
"""

from __future__ import annotations

import math

import torch

EPS = 1e-12  # zoology's Based eps


def taylor_exp(x: torch.Tensor) -> torch.Tensor:
    """2nd-order Taylor feature map over the last axis: ``[..., d] -> [..., 1 + d + d^2]``."""
    d = x.shape[-1]
    x2 = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2) / math.sqrt(2)
    return torch.cat([torch.ones_like(x[..., :1]), x / d**0.25, x2 / math.sqrt(d)], dim=-1)


def linear_attention_quadratic(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = EPS
) -> torch.Tensor:
    """Causal normalised linear attention; featurised ``q, k [B, H, T, F]``, ``v [B, H, T, E]``."""
    t = q.shape[-2]
    a = q @ k.transpose(-1, -2)
    # Masked scores are exactly zero, so outputs at t are bitwise independent of inputs > t.
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    a = a.masked_fill(~mask, 0.0)
    return (a @ v) / (a.sum(-1, keepdim=True) + eps)


def linear_attention_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    eps: float = EPS,
    keep: bool = False,
):
    """The same function as a recurrence over the state S = sum phi(k) v^T, z = sum phi(k).

    With ``keep`` also every state after each step, (S [B, T, H, F, E], z [B, T, H, F])."""
    b, h, t, f = q.shape
    s, z = q.new_zeros(b, h, f, v.shape[-1]), q.new_zeros(b, h, f)
    out, states, norms = [], [], []
    for i in range(t):
        s = s + k[:, :, i, :, None] * v[:, :, i, None, :]
        z = z + k[:, :, i]
        num = (q[:, :, i, :, None] * s).sum(-2)
        den = (q[:, :, i] * z).sum(-1, keepdim=True)
        out.append(num / (den + eps))
        if keep:
            states.append(s)
            norms.append(z)
    y = torch.stack(out, dim=2)
    return (y, (torch.stack(states, 1), torch.stack(norms, 1))) if keep else y
