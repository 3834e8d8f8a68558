"""Mamba-1 block (Gu & Dao, 2023), as in ``mamba_ssm``'s ``mamba_simple.Mamba`` that the paper
trains through zoology; Table 1(f) defaults.

    x, z   = in_proj(u)                         d -> 2 * d_inner, d_inner = expand * d
    x      = SiLU(conv(x))                      causal depthwise conv of size d_conv (or none)
    dt,B,C = x_proj(x)                          d_inner -> dt_rank + 2 * d_state
    Δ      = softplus(dt_proj(dt))              dt_rank -> d_inner (bias carries dt's init)
    h_t    = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t x_t  per channel, A = -exp(A_log) [d_inner, d_state]
    y_t    = C_t · h_t + D ⊙ x_t
    out    = out_proj(y ⊙ SiLU(z))              d_inner -> d

``allow_neg_eigval: true`` (Grazzi et al., 2025, "Unlocking State-Tracking in Linear RNNs
Through Negative Eigenvalues"; off by default, as mamba_ssm) replaces the transition exp(Δ_t A)
∈ (0, 1) by 2 exp(Δ_t A) - 1 ∈ (-1, 1), the drive Δ_t B_t x_t unchanged, as that paper's code
does; the scan then runs its PyTorch form (the C and fused kernels take exp(Δ_t A) only).

``d_conv=None`` removes the convolution entirely (the paper's "no conv" ablation, §4.3, §5.3):
no ``conv`` submodule and no ``mixer.conv.output`` site, x goes straight into the SiLU.

The selective scan (models/ops/selective_scan.py) has two implementations:
:func:`selective_scan` (used in the forward pass; in a training step on a CPU it hands the scan
to C, ``csrc/selective_scan.c`` through models/native.py, and otherwise runs a PyTorch form
with a written-out adjoint) and :func:`selective_scan_reference`, a plain step-by-step
transcription of the recurrence that tests hold both forms to."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from mecheval.models.mixers.base import Mixer
from mecheval.models.mixers.modules import ShortConv
from mecheval.models.mixers.options import SCALAR_NEG_EIGVAL, MixerOptions, neg_eigval_field
from mecheval.models.ops.selective_scan import scan_states, scan_with_states, selective_scan


class MambaOptions(MixerOptions):
    d_state: int = Field(16, ge=1, description="SSM state size N per channel")
    expand: int = Field(2, ge=1, description="d_inner = expand * d_model")
    d_conv: int | None = Field(
        4, ge=1, description="short conv kernel size; null removes the conv (ablation)"
    )
    dt_rank: int | None = Field(None, ge=1, description="rank of Δ; null = ceil(d_model / 16)")
    conv_bias: bool = True
    bias: bool = Field(False, description="bias of in_proj and out_proj")
    dt_min: float = Field(1e-3, gt=0.0, description="Δ init is log-uniform in [dt_min, dt_max]")
    dt_max: float = Field(1e-1, gt=0.0)
    dt_init_floor: float = Field(1e-4, gt=0.0)
    dt_scale: float = Field(1.0, gt=0.0, description="scales dt_proj's weight init bound")
    allow_neg_eigval: bool = neg_eigval_field(SCALAR_NEG_EIGVAL)

    @model_validator(mode="after")
    def _dt_range(self) -> MambaOptions:
        if self.dt_min > self.dt_max:
            raise ValueError(f"dt_min={self.dt_min} must not exceed dt_max={self.dt_max}")
        return self


class SelectiveSSM(Mixer):
    """What Mamba and Mamba-2 share: ``options.d_conv`` sizes the optional short conv (``conv``)
    before the SSM, A = -exp(A_log), and Δ's init through the bias added before its softplus
    (``options.dt_min``, ``dt_max``, ``dt_init_floor``)."""

    @property
    def has_conv(self) -> bool:
        return self.options.d_conv is not None

    def A(self) -> torch.Tensor:
        return -torch.exp(self.A_log)

    def halo(self) -> int:
        """The conv reads d_conv - 1 inputs before the cut (Mixer.halo)."""
        return self.options.d_conv - 1 if self.has_conv else 0

    @torch.no_grad()
    def init_dt_bias(self, bias: torch.Tensor) -> None:
        """Δ = softplus(bias) at zero input: dt log-uniform in [dt_min, dt_max], floored at
        dt_init_floor, then bias = softplus^{-1}(dt) (mamba_ssm's init of each)."""
        o = self.options
        log_dt = torch.rand(bias.shape[0]) * (math.log(o.dt_max) - math.log(o.dt_min))
        dt = torch.exp(log_dt + math.log(o.dt_min)).clamp(min=o.dt_init_floor)
        bias.copy_(dt + torch.log(-torch.expm1(-dt)))


class Mamba(SelectiveSSM):
    def __init__(self, d_model: int, options: MambaOptions) -> None:
        super().__init__()
        if options.d_conv is not None and options.d_conv < 1:
            # Options validation already forbids this; kept for direct construction.
            raise ValueError(f"model.mixer.d_conv: expected >= 1 or null, got {options.d_conv}")
        self.options = options
        self.d_inner = options.expand * d_model
        self.d_state = options.d_state
        self.dt_rank = options.dt_rank or math.ceil(d_model / 16)

        self.in_proj = nn.Linear(d_model, 2 * self.d_inner, bias=options.bias)
        if options.d_conv is not None:
            self.conv = ShortConv(self.d_inner, options.d_conv, bias=options.conv_bias)
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * self.d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)
        self.A_log = nn.Parameter(torch.empty(self.d_inner, self.d_state))
        self.D = nn.Parameter(torch.empty(self.d_inner))
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=options.bias)
        self.init_special()

    @torch.no_grad()
    def init_special(self) -> None:
        # dt_proj: weight keeps Δ's initial spread independent of dt_rank; the bias is
        # softplus^{-1}(dt) with dt log-uniform in [dt_min, dt_max], so Δ starts in that range.
        bound = self.dt_rank**-0.5 * self.options.dt_scale
        nn.init.uniform_(self.dt_proj.weight, -bound, bound)
        self.init_dt_bias(self.dt_proj.bias)
        # S4D-real: A_n = -(n + 1) for every channel.
        a = torch.arange(1, self.d_state + 1, dtype=torch.float32)
        self.A_log.copy_(torch.log(a).expand(self.d_inner, -1))
        self.D.fill_(1.0)

    def ssm_inputs(
        self, u: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """u [B, T, d] -> (x, Δ, B, C, z): everything the selective scan and the gate need."""
        x, z = self.in_proj(u).chunk(2, dim=-1)
        if self.has_conv:
            x = self.conv(x)
        x = F.silu(x)
        dt, b, c = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.softplus(self.dt_proj(dt))
        return x, delta, b, c, z

    def recurrent_state_size(self, seq_len: int) -> int:
        return self.d_inner * self.d_state

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        xs, delta, b, c, z = self.ssm_inputs(x)
        y = selective_scan(
            xs, delta, self.A(), b, c, self.D, neg_eigval=self.options.allow_neg_eigval
        )
        return self.out_proj(y * F.silu(z))

    # Resuming from a prefix (Mixer.final_states): the state is the SSM's h after each
    # position, [B, T, d_inner, N]; the conv reads d_conv - 1 inputs before the cut.
    def final_states(self, x: torch.Tensor) -> torch.Tensor:
        xs, delta, b, _, _ = self.ssm_inputs(x)
        dt = delta.transpose(0, 1)
        states = scan_states(
            dt * xs.transpose(0, 1), dt, self.A(), b.transpose(0, 1), self.options.allow_neg_eigval
        )
        return states.transpose(0, 1)

    def mix_from(
        self,
        x: torch.Tensor,
        offset: int,
        initial_state: torch.Tensor | None,
        replace: bool = False,
    ) -> torch.Tensor:
        y, z = self._scan_from(x, offset, initial_state, replace=replace)
        return self.out_proj(y * F.silu(z))

    carries = "state"

    def _scan_from(
        self,
        x: torch.Tensor,
        offset: int,
        state: torch.Tensor | None,
        replace: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(y before the gate [R, W - offset, d_inner], z) from window position ``offset`` on."""
        xs, delta, b, c, z = (t[:, offset:] for t in self.ssm_inputs(x))
        xt, dt = xs.transpose(0, 1), delta.transpose(0, 1)
        bt, ct = b.transpose(0, 1), c.transpose(0, 1)
        out = scan_with_states(
            dt * xt,
            dt,
            self.A(),
            bt,
            ct,
            keep=False,
            initial=state,
            replace_first=replace,
            neg_eigval=self.options.allow_neg_eigval,
        )
        return (out[0] + xt * self.D).transpose(0, 1), z
