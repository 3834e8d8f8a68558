"""H3 (Fu et al., 2023), as zoology's ``H3`` with its default kernels:

    q, k, v = Linear(u)                                  (d -> d each, with bias)
    k'      = ShiftSSM(k)        = conv(k, K_shift) + D_shift * k      -> site ``mixer.conv.output``
    y       = q (x) DiagSSM(k' (x) v) = q * (conv(k' v, K_diag) + D * k' v)   (per head, see below)
    out     = output_linear(y)

**Shift SSM** (``conv``), per channel: state x in R^N, x_t = shift(x_{t-1}) + B u_t,
y_t = C . x_t + D u_t, with ``shift`` moving every entry one slot down. Its convolution
kernel is K_shift[j] = sum_m B[m] C[m + j] for j < N (zero beyond): a learned causal FIR
filter of length N = d_state, which is why it plays the role of the other mixers' short
convolution. Init as zoology: B = e_1 (so K_shift = C at init), C ~ U(+-1/sqrt(N)) (the
Conv1d default), D ~ N(0, 1); B, C, D all trained.

**Diagonal SSM** (S4D-Lin, ``ssm``), per head h: N/2 complex modes
A_n = -exp(inv_A_real_n) + i A_imag_n (init -1/2 + i pi n), B = 1, C ~ CN(0, 1),
dt = exp(log_dt) with log_dt ~ U[log 1e-3, log 1e-1]; discretised bilinearly (zoology's
default; ``discretization="zoh"`` is available) and evaluated as the kernel
K_diag[l] = 2 Re sum_n C_n dB_n dA_n^l (a Vandermonde product) of length min(T, l_max), then a
causal long convolution, plus D ~ N(0, 1) times the input. All SSM parameters are trained.

**d_state** defaults to the paper's 1024 (Table 1; = l_max). It matters for the mechanism,
not just for speed: the shift SSM's kernel is d_state long, so with d_state >= T the "short"
filter spans the whole sequence. The diagonal kernel costs O(d/head_dim * d_state/2 * sqrt(T))
memory per forward; lower ``d_state`` for cheap CPU experiments (not paper-faithful).

**head_dim** defaults to 2, the value the paper's code passes (tinylang
``tinylang/model/zoology.py``, mixer ``h3``: ``head_dim: 2`` with ``d_state = l_max``); zoology's
own default is 1 (scalar gating). Table 1's 1024 cannot divide d_model <= 256. With
head_dim = p each of the d/p heads forms the outer product k'_i v_j (p x p channels that
share the head's diagonal SSM) and y_j = sum_i q_i SSM(k' v)_ij; outputs are laid out
(j, head) as in zoology.

The output projection keeps zoology's name ``output_linear``: zoology's GPT-2 init rescales
only ``out_proj``/``fc2`` weights by 1/sqrt(2 n_layers), and so does mecheval's backbone.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from mecheval.models.mixers.base import Mixer, index_states, table1_constant, with_history
from mecheval.models.ops.h3 import shift_kernel_direct, vandermonde
from mecheval.models.ops.long_conv import causal_long_conv
from mecheval.models.sites import Site


class H3Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    l_max: int = Field(1024, ge=1, description="longest SSM kernel; longer inputs see a cut kernel")
    d_state: int = Field(
        1024,
        ge=2,
        description="state size N of both SSMs (shift-SSM kernel length; N/2 complex diagonal "
        "modes); paper: 1024",
    )
    head_dim: int = Field(
        2, ge=1, description="must divide d_model (paper's runs: 2; zoology default 1)"
    )
    discretization: Literal["bilinear", "zoh"] = Field(
        "bilinear", description="diagonal SSM discretisation (zoology default: bilinear)"
    )
    dt_min: float = Field(0.001, gt=0.0)
    dt_max: float = Field(0.1, gt=0.0)
    dropout: float = table1_constant(0.0)

    @field_validator("d_state")
    @classmethod
    def _even(cls, v: int) -> int:
        if v % 2:
            raise ValueError(f"must be even (N/2 complex-conjugate modes), got {v}")
        return v


#: Kernel lengths up to which ShiftSSM.kernel sums each lag directly rather than by FFT.
DIRECT_LAGS = 48


class ShiftSSM(nn.Module):
    """Per-channel shift SSM ``[B, T, C] -> [B, T, C]`` (see module docstring)."""

    #: a d_state-tap causal FIR filter: a short mixing step (``models.sites.local_mixing_sites``)
    local_mixing = True

    def __init__(self, channels: int, d_state: int, l_max: int) -> None:
        super().__init__()
        self.d_state = d_state
        self.l_max = l_max
        self.B = nn.Parameter(torch.empty(channels, d_state))
        self.C = nn.Parameter(torch.empty(channels, d_state))
        self.D = nn.Parameter(torch.empty(channels))
        self.output = Site()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.B.zero_()
            self.B[:, 0] = 1.0
        bound = 1.0 / math.sqrt(self.d_state)
        nn.init.uniform_(self.C, -bound, bound)
        nn.init.normal_(self.D)

    def kernel(self, length: int) -> torch.Tensor:
        """K[c, j] = sum_m B[c, m] C[c, m + j], j < min(N, length): ``[C, min(N, length)]``.

        Up to :data:`DIRECT_LAGS` lags, a direct correlation (:func:`shift_kernel_direct`,
        cost ~L N per channel); beyond, a correlation by FFT of size 2N, whose cost does not
        shrink with L (at the quick presets' T ~ 11-24 it was a tenth of H3's training
        step)."""
        lags = min(self.d_state, length)
        if lags <= DIRECT_LAGS:
            return shift_kernel_direct(self.B, self.C, lags)
        n = 2 * self.d_state  # no wrap-around: m + j < 2N
        b_f = torch.fft.rfft(self.B, n=n)
        c_f = torch.fft.rfft(self.C, n=n)
        return torch.fft.irfft(b_f.conj() * c_f, n=n)[:, :lags]

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.forward_from(u, 0)

    def forward_from(self, u: torch.Tensor, start: int) -> torch.Tensor:
        """:meth:`forward` at positions ``start``.. of ``u`` [B, T, C], the input's whole
        history: [B, T - start, C] (a mixer resumed from a prefix)."""
        k = self.kernel(min(u.shape[1], self.l_max))
        return self.output(causal_long_conv(u, k, start) + u[:, start:] * self.D)


class DiagSSMKernel(nn.Module):
    """S4D-Lin diagonal SSM kernel: ``forward(L) -> [H, L]`` (see module docstring)."""

    def __init__(
        self,
        channels: int,
        d_state: int,
        discretization: Literal["bilinear", "zoh"] = "bilinear",
        dt_min: float = 0.001,
        dt_max: float = 0.1,
    ) -> None:
        super().__init__()
        self.discretization = discretization
        self.dt_min, self.dt_max = dt_min, dt_max
        half = d_state // 2
        self.log_dt = nn.Parameter(torch.empty(channels))
        self.inv_A_real = nn.Parameter(torch.empty(channels, half))
        self.A_imag = nn.Parameter(torch.empty(channels, half))
        # Complex B and C stored as (real, imag) pairs in a trailing axis.
        self.B = nn.Parameter(torch.empty(channels, half, 2))
        self.C = nn.Parameter(torch.empty(channels, half, 2))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        h, half = self.inv_A_real.shape
        lo, hi = math.log(self.dt_min), math.log(self.dt_max)
        with torch.no_grad():
            self.log_dt.copy_(torch.rand(h) * (hi - lo) + lo)
            self.inv_A_real.fill_(math.log(0.5))
            self.A_imag.copy_(math.pi * torch.arange(half, dtype=torch.float32).expand(h, half))
            self.B.copy_(torch.view_as_real(torch.ones(h, half, dtype=torch.cfloat)))
            self.C.copy_(torch.view_as_real(torch.randn(h, half, dtype=torch.cfloat)))

    def discretize(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dA, dB, C), each complex ``[H, N/2]``: x_t = dA x_{t-1} + dB u_t, y_t = 2 Re C.x_t."""
        dt = torch.exp(self.log_dt).unsqueeze(-1)
        a = torch.complex(-torch.exp(self.inv_A_real), self.A_imag)
        b = torch.view_as_complex(self.B)
        c = torch.view_as_complex(self.C)
        dta = a * dt
        if self.discretization == "zoh":
            return torch.exp(dta), b * (torch.exp(dta) - 1.0) / a, c
        return (1.0 + dta / 2) / (1.0 - dta / 2), b * dt / (1.0 - dta / 2), c

    def forward(self, length: int) -> torch.Tensor:
        # The kernel is a function of the parameters alone (no activations): always computed in
        # float32, as mixed-precision SSMs do. Under a bf16 autocast its matmul would otherwise
        # run in bf16, and _Vandermonde's backward (run outside autocast) would then meet a bf16
        # gradient and float32 powers.
        with torch.autocast(self.log_dt.device.type, enabled=False):
            return self._kernel(length)

    def _kernel(self, length: int) -> torch.Tensor:
        # :meth:`discretize` written out in real arithmetic, straight to what the Vandermonde
        # product takes: C dB (real, imaginary) and log dA = log|dA| + i arg(dA). Complex
        # autograd ops (division, the complex log) on these [H, N/2] tensors cost more than
        # the product itself at T ~ 10-35 on the CPU. dt A = x + i y.
        dt = torch.exp(self.log_dt).unsqueeze(-1)
        a_re, a_im = -torch.exp(self.inv_A_real), self.A_imag
        x, y = a_re * dt, a_im * dt
        b_re, b_im = self.B.unbind(-1)
        c_re, c_im = self.C.unbind(-1)
        if self.discretization == "zoh":
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


class H3(Mixer):
    def __init__(self, d_model: int, options: H3Options) -> None:
        super().__init__()
        if d_model % options.head_dim:
            raise ValueError(
                f"model.mixer.head_dim: {options.head_dim} does not divide model.d_model={d_model}"
            )
        if options.dt_min > options.dt_max:
            raise ValueError(f"model.mixer.dt_min: {options.dt_min} exceeds dt_max")
        self.l_max = options.l_max
        self.head_dim = options.head_dim
        self.n_heads = d_model // options.head_dim
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.conv = ShiftSSM(d_model, options.d_state, options.l_max)
        self.ssm = DiagSSMKernel(
            self.n_heads, options.d_state, options.discretization, options.dt_min, options.dt_max
        )
        self.D = nn.Parameter(torch.empty(self.n_heads))
        self.output_linear = nn.Linear(d_model, d_model)
        nn.init.normal_(self.D)

    def init_special(self) -> None:
        self.conv.reset_parameters()
        self.ssm.reset_parameters()
        nn.init.normal_(self.D)

    def recurrent_state_size(self, seq_len: int) -> int:
        # Both SSMs as recurrences: the shift SSM's d_state-slot register per channel, and the
        # diagonal SSM's d_state / 2 complex modes (d_state floats) per channel of each head's
        # head_dim x head_dim outer product.
        d_state = self.conv.d_state
        return self.conv.D.shape[0] * d_state + self.n_heads * self.head_dim**2 * d_state

    def mix(self, u: torch.Tensor) -> torch.Tensor:
        return self._mixed(u, None)

    def _by_head(self, x: torch.Tensor) -> torch.Tensor:
        # [B, T, p, h]: x[b, t, h * p + i], copied so that the head index is contiguous.
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(2, 3).contiguous()

    def _outer(self, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The diagonal SSM's input: the heads' outer products k' v [B, T, p * p * h]."""
        # Channels laid out (i, j, head): channel (i, j, h) = k'[h, i] * v[h, j]. With the
        # head innermost, the products and the sum over i run over contiguous memory (laid
        # out (h, i, j), a 2 x 2 trailing block, they took a quarter of H3's training step);
        # each channel is convolved with its head's kernel.
        kv = self._by_head(k).unsqueeze(3) * self._by_head(v).unsqueeze(2)  # [B, T, i, j, h]
        return kv.reshape(*k.shape[:2], -1)

    def _mixed(
        self, u: torch.Tensor, before: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        """:meth:`mix`'s outputs at the positions of ``u`` [B, S, d], which follow positions
        whose inputs to the two SSMs were ``before`` = (k before the shift SSM [B, P, d],
        k' v [B, P, p * p * h]) (None: none; both convolutions read the whole history)."""
        b, s, d = u.shape
        p = self.head_dim
        q, k, v = self.q_proj(u), self.k_proj(u), self.v_proj(u)
        k_before, kv_before = (None, None) if before is None else before
        kv = self._outer(self.conv.forward_from(*with_history(k_before, k)), v)
        history, start = with_history(kv_before, kv)
        kernel = self.ssm(min(history.shape[1], self.l_max)).repeat(p * p, 1)
        y = causal_long_conv(history, kernel, start) + kv * self.D.repeat(p * p)
        y = (y.view(b, s, p, p, self.n_heads) * self._by_head(q).unsqueeze(3)).sum(2)
        # [B, S, j, h], laid out (j, head), as zoology's output.
        return self.output_linear(y.reshape(b, s, d))

    # Resuming from a prefix (Mixer.prefix_states): both SSMs are convolutions over their
    # input's whole history (the shift SSM's kernel is d_state = 1024 taps long), so the state
    # is those inputs at every position: k before the shift SSM, and k' v.
    def prefix_halo(self) -> int:
        return 0

    def prefix_state_size(self) -> int:
        return self.conv.D.shape[0] + self.head_dim**2 * self.n_heads

    def prefix_states(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.k_proj(u)
        return k, self._outer(self.conv(k), self.v_proj(u))

    def state_at(self, states, rows: torch.Tensor, start: int):
        # The history before the cut, not the state after one position.
        return None if states is None or start == 0 else index_states(states, rows, slice(start))

    def mix_from(self, u: torch.Tensor, offset: int, state, replace: bool = False) -> torch.Tensor:
        if replace:
            raise NotImplementedError("H3 has no recurrent state site")
        return self._mixed(u[:, offset:], state)
