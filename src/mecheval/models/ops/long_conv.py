"""Causal depthwise long convolutions y[t] = Σ_{s ≤ t} k[t - s] u[s] (Hyena, BaseConv, H3),
and the arithmetic of the implicit filters that parametrise their kernels.

A long convolution mixes channel ``c`` of ``u [B, T, C]`` with its own kernel ``k[c]``:
``y[b, t, c] = sum_{s <= t} k[c, t - s] * u[b, s, c]``. :func:`direct_causal_conv` is the
time-domain reference; the others compute the same function:

* :func:`fft_causal_conv` zero-pads to ``2T`` so the FFT's circular convolution equals the
  linear (hence causal) one on ``[0, T)``; O(T log T).
* :func:`direct_causal_conv` is a depthwise ``conv1d`` with ``T - 1`` left zero padding;
  O(T^2). Its output at ``t`` is computed from inputs ``<= t`` only, so it is *bitwise*
  causal, whereas FFT rounding spreads ~1e-7 of every input over all positions.
* :func:`toeplitz_causal_conv` multiplies by the lower-triangular Toeplitz matrix
  ``M[c, t, s] = k[c, t - s]``; O(T^2) like the direct form and causal in the same bitwise
  sense for finite inputs (a later input meets an exact zero, and adding ``0 * u = +-0`` to
  a partial sum leaves it unchanged), but a batched matrix product, whose forward and
  backward are several times faster on a CPU than the depthwise conv's at T <= ~100.

:func:`causal_long_conv` is what the mixers call: on the CPU, where the intervention tests
demand bitwise causality and the sequences are short, the Toeplitz product up to
:data:`TOEPLITZ_MAX_LEN` positions and the direct form beyond (the [C, T, T] matrix grows
quadratically), in a training step up to that length the direct sum in C
(``csrc/long_conv.c``, models/native.py); the FFT on a GPU, where speed matters
(tests/test_mixers_conv.py checks that they compute the same function).

The implicit filters (models/mixers/long_conv.py) read :func:`positional_features`, and
Hyena's multiplies its MLP's output by :func:`decay_window`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mecheval.models import native

#: Longest sequence for which :func:`causal_long_conv` builds the Toeplitz matrix on a CPU.
TOEPLITZ_MAX_LEN = 128


#: The causal depthwise convolution y[b, t, c] = sum_j taps[c, j] u[b, t - j, c] by
#: ``csrc/long_conv.c`` (u [B, T, C], taps [C, L] with L <= T, contiguous): the direct sum,
#: vectorised over channels, and its two gradients.
_NativeCausalConv = native.autograd_function(
    "long_conv",
    sizes=lambda u, taps: (*u.shape, taps.shape[1]),
    output=lambda u, taps: torch.empty_like(u),
)


def _kernel_for_length(k: torch.Tensor, t: int) -> torch.Tensor:
    """Cut or zero-extend a ``[C, Lk]`` kernel to exactly ``t`` taps."""
    if k.shape[-1] >= t:
        return k[..., :t]
    return F.pad(k, (0, t - k.shape[-1]))


def fft_causal_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Causal depthwise convolution by FFT. ``u [B, T, C]``, ``k [C, Lk]`` -> ``[B, T, C]``.

    Taps beyond ``T`` cannot reach any output and are dropped; a kernel shorter than ``T``
    acts as if zero-extended. Half-precision inputs (under bf16 autocast on a GPU) are
    transformed in float32 and the result cast back, as zoology's ``fft_conv`` casts its
    input to the float32 kernel: the FFTs have no bfloat16 kernel on any device.
    """
    t = u.shape[1]
    k = _kernel_for_length(k, t)
    n = 2 * t  # >= 2T - 1: no output in [0, T) wraps around
    wide = u.float() if u.dtype in (torch.bfloat16, torch.float16) else u
    u_f = torch.fft.rfft(wide, n=n, dim=1)  # [B, n//2 + 1, C]
    k_f = torch.fft.rfft(k.to(wide.dtype), n=n, dim=-1).transpose(0, 1)  # [n//2 + 1, C]
    return torch.fft.irfft(u_f * k_f, n=n, dim=1)[:, :t].to(u.dtype)


def direct_causal_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Causal depthwise convolution in the time domain (reference and bitwise-causal path)."""
    t, c = u.shape[1], u.shape[2]
    k = _kernel_for_length(k, t).to(u.dtype)
    h = F.pad(u.transpose(1, 2), (t - 1, 0))
    # conv1d cross-correlates, so the kernel is flipped: tap j then multiplies u[t - j].
    y = F.conv1d(h, k.flip(-1).unsqueeze(1), groups=c)
    return y.transpose(1, 2)


def toeplitz_causal_conv(u: torch.Tensor, k: torch.Tensor, start: int = 0) -> torch.Tensor:
    """Causal depthwise convolution as a product with the ``[C, T, T]`` Toeplitz matrix; with
    ``start``, its output rows ``start``.. alone: ``[B, T - start, C]``."""
    t = u.shape[1]
    k = _kernel_for_length(k, t).to(u.dtype)
    # r[c, j] = k[c, t - 1 - j] for j < t, then t - 1 zeros, so window t - 1 - i of r is row i
    # of the matrix: M[c, i, s] = r[c, t - 1 - i + s] = k[c, i - s], and 0 for s > i.
    r = F.pad(k.flip(-1), (0, t - 1))
    toeplitz = r.unfold(-1, t, 1).flip(-2)
    # y[b, i, c] = sum_s u[b, s, c] M[c, i, s], batched over channels as [C, B, T] @ Mᵀ. The
    # explicit copy matters: given strided operands, bmm falls back to one small product
    # (and a clone) per channel.
    ut = u.permute(2, 0, 1).contiguous()
    return torch.matmul(ut, toeplitz[:, start:].transpose(-1, -2)).permute(1, 2, 0)


def causal_long_conv(u: torch.Tensor, k: torch.Tensor, start: int = 0) -> torch.Tensor:
    """Causal depthwise convolution of ``u [B, T, C]`` with ``k [C, Lk]``, at output positions
    ``start``.. (a mixer resumed from a prefix passes the whole history and wants the rest):
    ``[B, T - start, C]``."""
    if u.is_cuda:
        return fft_causal_conv(u, k)[:, start:]
    if u.shape[1] <= TOEPLITZ_MAX_LEN:
        # In a training step, the direct sum in C (models/native.py): the Toeplitz product's
        # backward falls back to one small matrix product and a copy per channel inside bmm,
        # some 1,500 calls per H3 step at T = 11.
        direct = native_causal_conv(u, k)
        return toeplitz_causal_conv(u, k, start) if direct is None else direct[:, start:]
    return direct_causal_conv(u, k)[:, start:]


def native_causal_conv(u: torch.Tensor, taps: torch.Tensor) -> torch.Tensor | None:
    """u [B, T, C] convolved causally with taps [C, L] (tap j multiplies u[t - j]; taps past
    T - 1 cannot reach an output) by the C kernel, in a training step where
    :func:`~mecheval.models.native.for_training` allows it; None elsewhere."""
    taps = taps[:, : u.shape[1]]
    if not native.for_training("long_conv", u, taps):
        return None
    return _NativeCausalConv.apply(u.contiguous(), taps.contiguous())


def positional_features(l_max: int, emb_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Hyena's filter input: ``z [1, l_max, emb_dim]`` = [t, Re e^{-i f w}, Im e^{-i f w}] and
    the normalised time ``t [1, l_max, 1]`` in [0, 1].

    ``bands = (emb_dim - 1) // 2`` frequencies ``f = linspace(1e-4, bands - 1, bands)`` at
    angles ``w = 2 pi n / l_max``. (With the default emb_dim = 3 there is a single band at
    f = 1e-4, i.e. almost-constant features: that is what zoology computes.)
    """
    if emb_dim < 3 or emb_dim % 2 == 0:
        raise ValueError(f"emb_dim: must be odd and >= 3 (time, cos, sin), got {emb_dim}")
    t = torch.linspace(0, 1, l_max)[None, :, None]
    bands = (emb_dim - 1) // 2
    w = 2 * math.pi * torch.arange(l_max, dtype=torch.float32)[None, :, None] / l_max
    f = torch.linspace(1e-4, bands - 1, bands)[None, None]
    z = torch.exp(-1j * f * w)
    return torch.cat([t, z.real, z.imag], dim=-1), t


def window_decay_rates(
    channels: int, fast_decay_pct: float, slow_decay_pct: float, target: float
) -> torch.Tensor:
    """Hyena's per-channel decay rates, [1, 1, channels]: evenly spaced from the rate at which
    the window falls to ``target`` at ``slow_decay_pct`` of the (normalised) length to the one
    at which it does so at ``fast_decay_pct``."""
    max_decay = math.log(target) / fast_decay_pct
    min_decay = math.log(target) / slow_decay_pct
    return torch.linspace(min_decay, max_decay, channels)[None, None]


def decay_window(t: torch.Tensor, deltas: torch.Tensor, shift: float) -> torch.Tensor:
    """Hyena's exponential-decay modulation of its filter, ``exp(-t |delta_c|) + shift``:
    normalised time t [1, L, 1] and decay rates [1, 1, C] -> [1, L, C]."""
    return torch.exp(-t * deltas.abs()) + shift
