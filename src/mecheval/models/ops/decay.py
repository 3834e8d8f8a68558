"""Decay matrices for the chunked forms of gated linear recurrences (Mamba-2, Gated DeltaNet,
GLA, Hawk): within a chunk, the decay from step s to step t is exp of a sum of log-decays."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def segment_sums(a: torch.Tensor) -> torch.Tensor:
    """a [..., c] -> S [..., c, c] with S[l, s] = a_{s+1} + ... + a_l for s ≤ l (0 on the
    diagonal) and -inf for s > l, so that exp(S) is the causal decay matrix.

    Each entry sums its own span (a masked cumsum, as mamba_ssm's ``segsum``), not the
    difference Λ_l - Λ_s of two running sums: with large decays the running sums reach
    thousands and their difference would lose the small spans to cancellation (float32:
    ~1e-3 relative error in the decays at |Λ| ~ 1e4). A sum of terms ≤ 0 is ≤ 0 in floating
    point too, so every exponent is ≤ 0; entries above the diagonal are -inf before any exp,
    so their gradients are 0, not inf · 0.
    """
    c = a.shape[-1]
    ones = torch.ones(c, c, dtype=torch.bool, device=a.device)
    rows = a[..., :, None].expand(*a.shape, c)  # rows[..., i, s] = a_i
    sums = rows.masked_fill(~ones.tril(-1), 0.0).cumsum(-2)  # Σ_{s < i ≤ l} a_i
    return sums.masked_fill(~ones.tril(), -math.inf)


def segment_products(a: torch.Tensor) -> torch.Tensor:
    """a [..., c] -> P [..., c, c] with P[l, s] = a_{s+1} · ... · a_l for s ≤ l (1 on the
    diagonal) and 0 for s > l: the causal decay matrix of decays that may be negative (no
    logarithm to sum), as :func:`segment_sums` builds it, each span multiplied on its own.
    For |a| ≤ 1 every entry is at most 1 in size."""
    c = a.shape[-1]
    ones = torch.ones(c, c, dtype=torch.bool, device=a.device)
    rows = a[..., :, None].expand(*a.shape, c)  # rows[..., i, s] = a_i
    products = rows.masked_fill(~ones.tril(-1), 1.0).cumprod(-2)  # Π_{s < i ≤ l} a_i
    return products.masked_fill(~ones.tril(), 0.0)


def segment_sums_per_channel(x: torch.Tensor) -> torch.Tensor:
    """:func:`segment_sums` of each channel: x [..., c, K] (time on dim -2) -> [..., c, c, K]."""
    return segment_sums(x.transpose(-1, -2)).movedim(-3, -1)


def pad_steps(pad: int, dim: int, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each of ``xs`` with ``pad`` zero steps appended along its time dimension ``dim``
    (counted from the end, < 0): a chunked form's padding to whole chunks. Steps after the
    last real one cannot reach a real output; each caller says why zeros also leave its
    state as it is."""
    if not pad:
        return xs
    return tuple(F.pad(x, (0, 0) * (-dim - 1) + (0, pad)) for x in xs)


def balanced_chunks(length: int, chunk_size: int) -> tuple[int, int]:
    """(number of chunks n, chunk length c) for ``length`` steps in chunks of at most
    ``chunk_size``: n = ceil(length / chunk_size) chunks of equal length c = ceil(length / n),
    so that the padding (n c - length < n steps) is as small as it can be: T = 35 with
    chunk_size 64 is one chunk of 35, T = 70 two of 35 (not one of 64 and one padded from 6)."""
    n = max(1, -(-length // max(1, chunk_size)))
    return n, max(1, -(-length // n))
