"""Causal depthwise long convolutions y[t] = Σ_{s ≤ t} k[t - s] u[s] (Hyena, BaseConv, H3).

:func:`direct_causal_conv` is the time-domain reference; :func:`fft_causal_conv` (a GPU) and
:func:`toeplitz_causal_conv` (a CPU, short sequences) the fast forms; :func:`causal_long_conv`
chooses among them and the C direct sum.
"""

from __future__ import annotations

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
