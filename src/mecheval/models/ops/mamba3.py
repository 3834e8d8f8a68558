"""Mamba-3's SISO recurrence: an exponential-trapezoidal, data-dependently rotated SSM per head.

Per head, with x_t [P], B_t, C_t [N] (normalised and biased), Δ_t > 0, log-decay Δ_t A_t ≤ 0,
trapezoid weight λ_t in (0, 1) and angle steps Δ_t θ_t [R] (2R ≤ N):

    Φ_t = Φ_{t-1} + Δ_t θ_t                        cumulative angle per rotated pair
    k_t = rot(B_t, Φ_t),  q_t = rot(C_t, Φ_t)      pairs (2j, 2j+1), j < R, turned by Φ_t[j]
    α_t = exp(Δ_t A_t),  β_t = (1 - λ_t) Δ_t α_t,  γ_t = λ_t Δ_t
    h_t = α_t h_{t-1} + β_t x_{t-1} k_{t-1}ᵀ + γ_t x_t k_tᵀ        h_t: [P, N]
    y_t = h_t q_t + D x_t

The β term is the trapezoid rule's share of the previous step's input (a size-2 convolution
inside the state update); λ = 1 is Mamba-2's Euler step. Rotating B and C by the running angle
is the complex-valued state of the paper written over the reals: the rotation of h by Δ_t θ_t
at every step moves onto B and C as RoPE with data-dependent angles.

:func:`mamba3_recurrent` is the step-by-step reference; :func:`mamba3_chunked` the chunked
form the module runs (mamba_ssm's SISO kernel computes the same sums).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from mecheval.models.ops.decay import balanced_chunks, pad_steps, segment_sums

#: (h [b, H, P, N], k [b, H, N], x [b, H, P], Φ [b, H, R]): what one step hands the next; the
#: previous step's rotated B and its input carry the trapezoid's second term.
Mamba3State = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class Mamba3Inputs(NamedTuple):
    """The recurrence's operands, each [b, T, ...] (the module computes them from its input)."""

    x: torch.Tensor  #: [b, T, H, P]
    log_decay: torch.Tensor  #: Δ A, [b, T, H]
    dt: torch.Tensor  #: Δ, [b, T, H]
    lam: torch.Tensor  #: λ, [b, T, H]
    angle_steps: torch.Tensor  #: Δ θ, [b, T, H, R]
    B: torch.Tensor  #: [b, T, H, N], not yet rotated
    C: torch.Tensor  #: [b, T, H, N], not yet rotated

    def after(self, offset: int) -> Mamba3Inputs:
        """The operands of the steps from ``offset`` on."""
        return Mamba3Inputs(*(t[:, offset:] for t in self))


def rotate_pairs(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """x [..., N] with each pair (x_2j, x_2j+1), j < R, turned by angles[..., j] (the complex
    number x_2j + i x_2j+1 times exp(i angle)); angles [..., R], 2R ≤ N; the rest as given."""
    r = angles.shape[-1]
    pairs = x[..., : 2 * r].unflatten(-1, (r, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    cos, sin = angles.cos(), angles.sin()
    turned = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
    return torch.cat([turned.flatten(-2), x[..., 2 * r :]], dim=-1)


def mamba3_recurrent(
    inputs: Mamba3Inputs,
    D: torch.Tensor,
    initial: Mamba3State | None = None,
    keep: bool = False,
    replace_first: bool = False,
):
    """The recurrence one step at a time (the specification, not for speed).

    inputs: :class:`Mamba3Inputs`; D: [H] -> y [b, T, H, P].
    ``initial``: the state (h, k, x, Φ) before the first step (zeros: none), or with
    ``replace_first`` after it (its update skipped); with ``keep`` also every state after each
    step, a :data:`Mamba3State` of [b, T, ...] tensors (``Mixer.final_states``).
    """
    x, log_decay, dt, lam, angle_steps, B, C = inputs
    batch, length, heads, p = x.shape
    n, r = B.shape[-1], angle_steps.shape[-1]
    if initial is None:
        initial = (
            x.new_zeros(batch, heads, p, n),
            x.new_zeros(batch, heads, n),
            x.new_zeros(batch, heads, p),
            x.new_zeros(batch, heads, r),
        )
    h, k_prev, x_prev, phi = initial
    outs, kept = [], []
    for t in range(length):
        if t or not replace_first:
            phi = phi + angle_steps[:, t]
            k = rotate_pairs(B[:, t], phi)
            alpha = torch.exp(log_decay[:, t])[..., None, None]
            beta = (1 - lam[:, t]) * dt[:, t] * torch.exp(log_decay[:, t])
            gamma = lam[:, t] * dt[:, t]
            h = (
                alpha * h
                + beta[..., None, None] * x_prev[..., None] * k_prev[..., None, :]
                + gamma[..., None, None] * x[:, t, ..., None] * k[..., None, :]
            )
            k_prev, x_prev = k, x[:, t]
        q = rotate_pairs(C[:, t], phi)
        outs.append((h * q[..., None, :]).sum(-1) + D[:, None] * x[:, t])
        if keep:
            kept.append((h, k_prev, x_prev, phi))
    y = torch.stack(outs, dim=1)
    if not keep:
        return y
    return y, tuple(torch.stack(part, dim=1) for part in zip(*kept, strict=True))


def mamba3_chunked(inputs: Mamba3Inputs, D: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """The same function as :func:`mamba3_recurrent` from zeros, in chunks of at most
    ``chunk_size`` steps (:func:`~mecheval.models.ops.decay.balanced_chunks`).

    With q, k rotated by their running angle, x_s k_sᵀ enters the state at step s with weight
    γ_s and again at step s + 1 with β_{s+1} = α_{s+1} (1 - λ_{s+1}) Δ_{s+1}. Seen from any
    t > s both shares decay alike from s on, so x_s k_sᵀ carries one weight
    w_s = γ_s + (1 - λ_{s+1}) Δ_{s+1} (none past the last step), and the layer is Mamba-2's
    dual form with w in place of Δ off the diagonal:
    y_t = Σ_{s < t} (q_t · k_s) exp(S[t, s]) w_s x_s + γ_t (q_t · k_t) x_t + D x_t.
    The diagonal keeps γ_t alone (not w_t minus the later share, which would cancel only up
    to round-off): an output never reads a later step, not even through a zero sum.
    Within a chunk, S are segment sums of Δ A (every exponent ≤ 0); across chunks the state
    at each chunk's end is passed on, as :func:`~mecheval.models.ops.ssd.ssd_chunked` does.
    """
    x, log_decay, dt, lam, angle_steps, B, C = inputs
    batch, length, heads, p = x.shape
    n_state = B.shape[-1]
    phi = angle_steps.cumsum(1)
    k, q = rotate_pairs(B, phi), rotate_pairs(C, phi)
    # (1 - λ_{s+1}) Δ_{s+1} at s: the trapezoid's share of x_s paid one step later.
    later = F.pad(((1 - lam) * dt)[:, 1:], (0, 0, 0, 1))
    gamma = lam * dt
    weight = gamma + later
    diagonal = D[:, None] + (gamma * (q * k).sum(-1))[..., None]  # [batch, T, H, 1]

    n, c = balanced_chunks(length, chunk_size)
    pad = n * c - length
    # Trailing zeros: weight 0 writes nothing, log-decay 0 keeps the state; dropped at the end.
    xw, k, q = pad_steps(pad, -3, x * weight[..., None], k, q)
    (a,) = pad_steps(pad, -2, log_decay)
    # Head-major and contiguous, [batch, H, n, c, ...]: each contraction one batched matmul.
    xw = xw.reshape(batch, n, c, heads, p).permute(0, 3, 1, 2, 4).contiguous()
    k = k.reshape(batch, n, c, heads, n_state).permute(0, 3, 1, 2, 4).contiguous()
    q = q.reshape(batch, n, c, heads, n_state).permute(0, 3, 1, 2, 4).contiguous()
    a = a.reshape(batch, n, c, heads).permute(0, 3, 1, 2)  # [batch, H, n, c]
    segment = segment_sums(a)  # [batch, H, n, c, c]
    below = torch.ones(c, c, dtype=torch.bool, device=a.device).tril(-1)
    scores = (q @ k.transpose(-1, -2)) * segment.masked_fill(~below, -math.inf).exp()
    y = scores @ xw  # [batch, H, n, c, P]: the steps before each one in its chunk

    if n > 1:
        # Each chunk's share of the state at its own end, then the state entering each chunk:
        # h_0 = 0, h_{z+1} = exp(chunk z's total log-decay) h_z + its share.
        shares = (xw * segment[..., -1, :].exp()[..., None]).transpose(-1, -2) @ k
        chunk_decay = a.sum(-1).exp()[..., None, None]  # [batch, H, n, 1, 1]
        h = torch.zeros_like(shares[:, :, 0])
        entering = [h]
        for z in range(n - 1):
            h = torch.addcmul(shares[:, :, z], chunk_decay[:, :, z], h)
            entering.append(h)
        into = a.cumsum(-1).exp()[..., None]  # decay from the chunk's start to each step
        y = y + (q @ torch.stack(entering, dim=2).transpose(-1, -2)) * into

    y = y.permute(0, 2, 3, 1, 4).reshape(batch, n * c, heads, p)[:, :length]
    return y + diagonal * x
