"""H3's kernels: the shift SSM's kernel K[c, j] = Σ_m B[c, m] C[c, m + j] and the diagonal SSM's
kernel K[h, l] = 2 Re Σ_n C_n dB_n dA_n^l, from the parameters of each.

:func:`shift_kernel` chooses between the direct correlation (:func:`shift_kernel_direct`) and
an FFT. :func:`diag_ssm_discretize` is the diagonal SSM's discretisation in complex arithmetic
(the readable form); :func:`diag_ssm_kernel` the same in real arithmetic, straight to the
Vandermonde product (:func:`vandermonde`). The autograd functions beside them run the same
sums in C in a CPU training step.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F

from mecheval.models import native

#: Kernel lengths up to which :func:`shift_kernel` sums each lag directly rather than by FFT.
DIRECT_LAGS = 48

#: :func:`shift_kernel_direct` in a training step by ``csrc/shift_kernel.c``
#: (models/native.py): oneDNN's depthwise conv1d took ~0.25 ms per call for these
#: [64, 1024]-slot filters, the C sums a tenth of that.
_NativeShiftKernel = native.autograd_function(
    "shift_kernel",
    sizes=lambda b, c, lags: (*b.shape, lags),
    output=lambda b, c, lags: b.new_empty(b.shape[0], lags),
)


def shift_kernel(b: torch.Tensor, c: torch.Tensor, length: int) -> torch.Tensor:
    """K[ch, j] = sum_m b[ch, m] c[ch, m + j], j < min(N, length): ``[C, N], [C, N] ->
    [C, min(N, length)]``, the shift SSM's kernel.

    Up to :data:`DIRECT_LAGS` lags, a direct correlation (:func:`shift_kernel_direct`, cost
    ~L N per channel); beyond, a correlation by FFT of size 2N, whose cost does not shrink
    with L (at the quick presets' T ~ 11-24 it was a tenth of H3's training step)."""
    n_state = b.shape[-1]
    lags = min(n_state, length)
    if lags <= DIRECT_LAGS:
        return shift_kernel_direct(b, c, lags)
    n = 2 * n_state  # no wrap-around: m + j < 2N
    b_f = torch.fft.rfft(b, n=n)
    c_f = torch.fft.rfft(c, n=n)
    return torch.fft.irfft(b_f.conj() * c_f, n=n)[:, :lags]


def shift_kernel_direct(b: torch.Tensor, c: torch.Tensor, lags: int) -> torch.Tensor:
    """``K[ch, j] = sum_m b[ch, m] c[ch, m + j]`` for j < lags (c zero beyond its N slots):
    ``[C, N], [C, N] -> [C, lags]``, the shift SSM's kernel as a direct correlation, in the
    parameters' dtype (a function of the parameters alone; see :func:`diag_ssm_kernel`)."""
    with torch.autocast(b.device.type, enabled=False):
        if native.for_training("shift_kernel", b, c):
            return _NativeShiftKernel.apply(b.contiguous(), c.contiguous(), lags)
        return _ShiftKernel.apply(b, c, lags)


class _ShiftKernel(torch.autograd.Function):
    """Forward and both gradients as one depthwise ``conv1d`` each: autograd through the L
    product-sums of N slots (one per lag) took ~3.5 ms per layer at L = 24 against ~0.9.
    ``generate_vmap_rule`` keeps it usable under torch.func (stacked training)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(b: torch.Tensor, c: torch.Tensor, lags: int) -> torch.Tensor:  # type: ignore[override]
        c_padded = F.pad(c, (0, lags - 1)).unsqueeze(0)  # [1, C, N + lags - 1]
        return F.conv1d(c_padded, b.unsqueeze(1), groups=b.shape[0])[0]

    @staticmethod
    def setup_context(
        ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: torch.Tensor
    ) -> None:
        b, c, lags = inputs
        ctx.save_for_backward(b, c)
        ctx.lags = lags

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        b, c = ctx.saved_tensors
        channels, lags = b.shape[0], ctx.lags
        # dK[j]/db[m] = c[m + j]: grad_b[m] = sum_j grad[j] c[m + j], again a correlation.
        c_padded = F.pad(c, (0, lags - 1)).unsqueeze(0)
        grad_b = F.conv1d(c_padded, grad.unsqueeze(1), groups=channels)[0]
        # dK[j]/dc[i] = b[i - j]: grad_c[i] = sum_j grad[j] b[i - j], a causal convolution.
        b_padded = F.pad(b, (lags - 1, 0)).unsqueeze(0)
        grad_c = F.conv1d(b_padded, grad.flip(-1).unsqueeze(1), groups=channels)[0]
        return grad_b, grad_c, None


def diag_ssm_discretize(
    log_dt: torch.Tensor,
    inv_a_real: torch.Tensor,
    a_imag: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    discretization: Literal["bilinear", "zoh"] = "bilinear",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The S4D-Lin diagonal SSM discretised: log dt [H], log(-Re A) and Im A [H, N/2], B and C
    [H, N/2, 2] (complex as (real, imaginary) pairs) -> (dA, dB, C), each complex ``[H, N/2]``:
    x_t = dA x_{t-1} + dB u_t, y_t = 2 Re C.x_t. Bilinear (zoology's default) or ZOH."""
    dt = torch.exp(log_dt).unsqueeze(-1)
    a = torch.complex(-torch.exp(inv_a_real), a_imag)
    b = torch.view_as_complex(b)
    c = torch.view_as_complex(c)
    dta = a * dt
    if discretization == "zoh":
        return torch.exp(dta), b * (torch.exp(dta) - 1.0) / a, c
    return (1.0 + dta / 2) / (1.0 - dta / 2), b * dt / (1.0 - dta / 2), c


def diag_ssm_kernel(
    log_dt: torch.Tensor,
    inv_a_real: torch.Tensor,
    a_imag: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    length: int,
    discretization: Literal["bilinear", "zoh"] = "bilinear",
) -> torch.Tensor:
    """The diagonal SSM's kernel K[h, l] = 2 Re sum_n C_n dB_n dA_n^l for l < length, ``[H, L]``
    (parameters as :func:`diag_ssm_discretize` takes them).

    The kernel is a function of the parameters alone (no activations): always computed in
    float32, as mixed-precision SSMs do. Under a bf16 autocast its matmul would otherwise run
    in bf16, and _Vandermonde's backward (run outside autocast) would then meet a bf16
    gradient and float32 powers."""
    # :func:`diag_ssm_discretize` written out in real arithmetic, straight to what the
    # Vandermonde product takes: C dB (real, imaginary) and log dA = log|dA| + i arg(dA).
    # Complex autograd ops (division, the complex log) on these [H, N/2] tensors cost more than
    # the product itself at T ~ 10-35 on the CPU. dt A = x + i y.
    with torch.autocast(log_dt.device.type, enabled=False):
        dt = torch.exp(log_dt).unsqueeze(-1)
        a_re, a_im = -torch.exp(inv_a_real), a_imag
        x, y = a_re * dt, a_im * dt
        b_re, b_im = b.unbind(-1)
        c_re, c_im = c.unbind(-1)
        if discretization == "zoh":
            # dA = e^x (cos y + i sin y); dB = B (dA - 1) / A.
            log_abs, arg = x, y
            ex = torch.exp(x)
            f_re, f_im = ex * torch.cos(y) - 1.0, ex * torch.sin(y)  # dA - 1
            a_norm = a_re * a_re + a_im * a_im
            g_re = (f_re * a_re + f_im * a_im) / a_norm  # (dA - 1) / A
            g_im = (f_im * a_re - f_re * a_im) / a_norm
        else:
            # dA = (1 + dtA/2) / (1 - dtA/2) = (1 - |dtA|^2/4 + i y) / den,
            # dB = B dt / (1 - dtA/2) = B dt ((1 - x/2) + i y/2) / den, den = |1 - dtA/2|^2.
            half_x, half_y = x / 2, y / 2
            den = (1 - half_x) ** 2 + half_y**2
            log_abs = 0.5 * (torch.log((1 + half_x) ** 2 + half_y**2) - torch.log(den))
            arg = torch.atan2(y, 1 - half_x**2 - half_y**2)
            g_re, g_im = dt * (1 - half_x) / den, dt * half_y / den
        db_re, db_im = b_re * g_re - b_im * g_im, b_re * g_im + b_im * g_re
        cb_re, cb_im = c_re * db_re - c_im * db_im, c_re * db_im + c_im * db_re
        return vandermonde(cb_re, cb_im, log_abs, arg, length)


def by_head(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[B, T, h * p] -> [B, T, p, h]: x[b, t, h * p + i], copied so that the head index is
    contiguous."""
    b, t, _ = x.shape
    return x.view(b, t, n_heads, -1).transpose(2, 3).contiguous()


def head_outer(k: torch.Tensor, v: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The diagonal SSM's input: the heads' outer products k' v, [B, T, h * p] each ->
    [B, T, p * p * h]."""
    # Channels laid out (i, j, head): channel (i, j, h) = k'[h, i] * v[h, j]. With the
    # head innermost, the products and the sum over i run over contiguous memory (laid
    # out (h, i, j), a 2 x 2 trailing block, they took a quarter of H3's training step);
    # each channel is convolved with its head's kernel.
    kv = by_head(k, n_heads).unsqueeze(3) * by_head(v, n_heads).unsqueeze(2)  # [B, T, i, j, h]
    return kv.reshape(*k.shape[:2], -1)


def head_readout(y: torch.Tensor, q: torch.Tensor, n_heads: int) -> torch.Tensor:
    """y_j = sum_i q_i SSM(k' v)_ij per head: the diagonal SSM's output y [B, S, p * p * h]
    (channels as :func:`head_outer` lays them out) and q [B, S, h * p] -> [B, S, p * h],
    laid out (j, head), as zoology's output."""
    b, s, d = q.shape
    p = d // n_heads
    return (y.view(b, s, p, p, n_heads) * by_head(q, n_heads).unsqueeze(3)).sum(2).reshape(b, s, d)


def vandermonde(
    cb_re: torch.Tensor, cb_im: torch.Tensor, w_re: torch.Tensor, w_im: torch.Tensor, length: int
) -> torch.Tensor:
    """``K[..., l] = 2 Re sum_n cb[..., n] exp(l w[..., n])`` for l < length ([..., N] -> [..., L]).

    Baby step, giant step: with m = ceil(sqrt(L)) and l = a m + b, ``cb z^l = (cb z^{a m}) z^b``,
    so K is one real matrix product of the giant factors [..., L/m, N] with the baby powers
    [..., N, m] (real parts stacked over imaginary parts). That builds 2 sqrt(L) N powers
    instead of the L N of a full Vandermonde matrix, [H, N/2, L] = 573k entries per layer at
    d_state 1024, T = 35, whose exp, cos and sin (forward and backward) were most of H3's
    training step. The powers are real arithmetic, |z|^l (cos l arg z, sin l arg z): much
    faster than a complex exp on the CPU. The gradient is written out (:class:`_Vandermonde`):
    two matrix products and the chain rule through the powers, ~25 % less than autograd's.
    """
    if cb_re.dim() == 2 and native.for_training("vandermonde", cb_re, cb_im, w_re, w_im):
        parts = (t.contiguous() for t in (cb_re, cb_im, w_re, w_im))
        return _NativeVandermonde.apply(*parts, length)
    return _Vandermonde.apply(cb_re, cb_im, w_re, w_im, length)[0]


class _NativeVandermonde(torch.autograd.Function):
    """:func:`vandermonde` in a training step by ``csrc/vandermonde.c`` (models/native.py):
    z = exp(w) once in float64 (vectorised by PyTorch, kept for the backward), the powers by
    one complex product per position, forward and backward in one pass over the modes each.
    The baby-step giant-step form takes some 40 small PyTorch calls forward and backward per
    layer: at the quick preset's T = 11, 3 ms per layer of H3's 22 ms step."""

    @staticmethod
    def forward(ctx, cb_re, cb_im, w_re, w_im, length):  # type: ignore[override]
        lib = native.library("vandermonde", cb_re.dtype)
        magnitude, angle = torch.exp(w_re.double()), w_im.double()
        z_re, z_im = magnitude * torch.cos(angle), magnitude * torch.sin(angle)
        heads, modes = cb_re.shape
        k = cb_re.new_empty(heads, length)
        native.call(lib.vandermonde_forward, heads, modes, length, cb_re, cb_im, z_re, z_im, k)
        ctx.save_for_backward(cb_re, cb_im, z_re, z_im)
        ctx.length = length
        return k

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        cb_re, cb_im, z_re, z_im = ctx.saved_tensors
        lib = native.library("vandermonde", grad.dtype)
        grads = [torch.empty_like(cb_re) for _ in range(4)]
        heads, modes = cb_re.shape
        args = (heads, modes, ctx.length, cb_re, cb_im, z_re, z_im, grad.contiguous(), *grads)
        native.call(lib.vandermonde_backward, *args)
        return (*grads, None)


class _Vandermonde(torch.autograd.Function):
    """(K, and the factors its gradient reads, which are not differentiable outputs).
    ``generate_vmap_rule`` keeps it usable under torch.func (stacked training)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(  # type: ignore[override]
        cb_re: torch.Tensor,
        cb_im: torch.Tensor,
        w_re: torch.Tensor,
        w_im: torch.Tensor,
        length: int,
    ) -> tuple[torch.Tensor, ...]:
        m = math.isqrt(max(length - 1, 0)) + 1
        giants = math.ceil(length / m)
        steps = torch.arange(m, device=w_re.device, dtype=w_re.dtype)
        babies_re, babies_im = _polar(w_re.unsqueeze(-1) * steps, w_im.unsqueeze(-1) * steps)
        big = steps[:giants] * m
        far_re, far_im = _polar(
            w_re.unsqueeze(-2) * big[:, None], w_im.unsqueeze(-2) * big[:, None]
        )
        c_re, c_im = cb_re.unsqueeze(-2), cb_im.unsqueeze(-2)
        # P = cb z^{a m} [..., L/m, N]; K[a m + b] = 2 Re sum_n P[a, n] z_n^b.
        p_re, p_im = c_re * far_re - c_im * far_im, c_re * far_im + c_im * far_re
        left = torch.cat([p_re, -p_im], -1)
        babies = torch.cat([babies_re, babies_im], dim=-2)
        k = 2 * torch.matmul(left, babies).flatten(-2)[..., :length]
        return k, left, babies, far_re, far_im

    @staticmethod
    def setup_context(
        ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple
    ) -> None:
        cb_re, cb_im, _, _, length = inputs
        _, left, babies, far_re, far_im = output
        ctx.mark_non_differentiable(left, babies, far_re, far_im)
        ctx.save_for_backward(cb_re, cb_im, left, babies, far_re, far_im)
        ctx.length = length

    @staticmethod
    def backward(ctx, grad: torch.Tensor, *_: torch.Tensor):  # type: ignore[override]
        cb_re, cb_im, left, babies, far_re, far_im = ctx.saved_tensors
        length = ctx.length
        m = math.isqrt(max(length - 1, 0)) + 1
        giants = math.ceil(length / m)
        steps = torch.arange(m, device=grad.device, dtype=grad.dtype)
        n = cb_re.shape[-1]
        grad_k = 2 * F.pad(grad, (0, giants * m - length)).unflatten(-1, (giants, m))
        grad_left = torch.matmul(grad_k, babies.transpose(-1, -2))  # [..., L/m, 2N]
        grad_babies = torch.matmul(left.transpose(-1, -2), grad_k)  # [..., 2N, m]
        gp_re, gp_im = grad_left[..., :n], -grad_left[..., n:]
        c_re, c_im = cb_re.unsqueeze(-2), cb_im.unsqueeze(-2)
        grad_cb_re = (gp_re * far_re + gp_im * far_im).sum(-2)
        grad_cb_im = (gp_im * far_re - gp_re * far_im).sum(-2)
        # z^k = exp(k w): d/dRe w = k z^k, d/dIm w = i k z^k, for the giants (k = a m) and
        # the babies (k = b).
        gf_re, gf_im = gp_re * c_re + gp_im * c_im, gp_im * c_re - gp_re * c_im
        big = (steps[:giants] * m)[:, None]
        grad_w_re = (big * (gf_re * far_re + gf_im * far_im)).sum(-2)
        grad_w_im = (big * (gf_im * far_re - gf_re * far_im)).sum(-2)
        b_re, b_im = babies[..., :n, :], babies[..., n:, :]
        gb_re, gb_im = grad_babies[..., :n, :], grad_babies[..., n:, :]
        grad_w_re = grad_w_re + ((gb_re * b_re + gb_im * b_im) * steps).sum(-1)
        grad_w_im = grad_w_im + ((gb_im * b_re - gb_re * b_im) * steps).sum(-1)
        return grad_cb_re, grad_cb_im, grad_w_re, grad_w_im, None


def _polar(log_abs: torch.Tensor, angle: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    magnitude = torch.exp(log_abs)
    return magnitude * torch.cos(angle), magnitude * torch.sin(angle)
