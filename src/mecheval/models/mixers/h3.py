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

from typing import Literal

import torch
from pydantic import Field, field_validator
from torch import nn

from mecheval.models.mixers.base import Mixer, table1_constant, with_history
from mecheval.models.mixers.options import MixerOptions, check_divides
from mecheval.models.mixers.ssm import DiagSSMKernel, ShiftSSM
from mecheval.models.ops.h3 import head_outer, head_readout
from mecheval.models.ops.long_conv import causal_long_conv


class H3Options(MixerOptions):
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


class H3(Mixer):
    def __init__(self, d_model: int, options: H3Options) -> None:
        super().__init__()
        check_divides(d_model, "head_dim", options.head_dim)
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

    def _mixed(
        self, u: torch.Tensor, before: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        """:meth:`mix`'s outputs at the positions of ``u`` [B, S, d], which follow positions
        whose inputs to the two SSMs were ``before`` = (k before the shift SSM [B, P, d],
        k' v [B, P, p * p * h]) (None: none; both convolutions read the whole history)."""
        p = self.head_dim
        q, k, v = self.q_proj(u), self.k_proj(u), self.v_proj(u)
        k_before, kv_before = (None, None) if before is None else before
        kv = head_outer(self.conv.forward_from(*with_history(k_before, k)), v, self.n_heads)
        history, start = with_history(kv_before, kv)
        kernel = self.ssm(min(history.shape[1], self.l_max)).repeat(p * p, 1)
        y = causal_long_conv(history, kernel, start) + kv * self.D.repeat(p * p)
        return self.output_linear(head_readout(y, q, self.n_heads))

    # Resuming from a prefix (Mixer.final_states): both SSMs are convolutions over their
    # input's whole history (the shift SSM's kernel is d_state = 1024 taps long), so the state
    # is those inputs at every position: k before the shift SSM, and k' v.
    carries = "history"

    def halo(self) -> int:
        return 0

    def final_states(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.k_proj(u)
        return k, head_outer(self.conv(k), self.v_proj(u), self.n_heads)

    def mix_from(
        self, u: torch.Tensor, offset: int, initial_state, replace: bool = False
    ) -> torch.Tensor:
        if replace:
            raise NotImplementedError("H3 has no recurrent state site")
        return self._mixed(u[:, offset:], initial_state)
