"""H3's two state space models as modules, their parameters and init (models/mixers/h3.py's
docstring describes both): :class:`ShiftSSM`, the shift SSM applied as a causal convolution
with its d_state-tap kernel, and :class:`DiagSSMKernel`, the S4D-Lin diagonal SSM's kernel.
The arithmetic of both kernels is in models/ops/h3.py."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from mecheval.models.ops.h3 import diag_ssm_discretize, diag_ssm_kernel, shift_kernel
from mecheval.models.ops.long_conv import causal_long_conv
from mecheval.models.sites import Site


class ShiftSSM(nn.Module):
    """Per-channel shift SSM ``[B, T, C] -> [B, T, C]`` (see models/mixers/h3.py)."""

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
        """K[c, j] = sum_m B[c, m] C[c, m + j], j < min(N, length): ``[C, min(N, length)]``
        (:func:`~mecheval.models.ops.h3.shift_kernel`)."""
        return shift_kernel(self.B, self.C, length)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.forward_from(u, 0)

    def forward_from(self, u: torch.Tensor, start: int) -> torch.Tensor:
        """:meth:`forward` at positions ``start``.. of ``u`` [B, T, C], the input's whole
        history: [B, T - start, C] (a mixer resumed from a prefix)."""
        k = self.kernel(min(u.shape[1], self.l_max))
        return self.output(causal_long_conv(u, k, start) + u[:, start:] * self.D)


class DiagSSMKernel(nn.Module):
    """S4D-Lin diagonal SSM kernel: ``forward(L) -> [H, L]`` (see models/mixers/h3.py)."""

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

    def _kernel_inputs(self) -> tuple[torch.Tensor, ...]:
        """(log dt, inv A real, A imag, B, C), as the kernels in models/ops/h3.py take them."""
        return self.log_dt, self.inv_A_real, self.A_imag, self.B, self.C

    def discretize(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dA, dB, C), each complex ``[H, N/2]``: x_t = dA x_{t-1} + dB u_t, y_t = 2 Re C.x_t
        (:func:`~mecheval.models.ops.h3.diag_ssm_discretize`, the readable form)."""
        return diag_ssm_discretize(*self._kernel_inputs(), self.discretization)

    def forward(self, length: int) -> torch.Tensor:
        """The kernel ``[H, length]`` (:func:`~mecheval.models.ops.h3.diag_ssm_kernel`: the
        discretisation in real arithmetic, then a Vandermonde product)."""
        return diag_ssm_kernel(*self._kernel_inputs(), length, self.discretization)
