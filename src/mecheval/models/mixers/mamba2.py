"""Mamba-2 block (Dao & Gu, 2024: "Transformers are SSMs", state space duality), as
``mamba_ssm``'s ``modules/mamba2.py`` ``Mamba2`` (and transformers' ``Mamba2Mixer``) builds it:

    z, xBC, dt = in_proj(u)                     d -> d_inner + (d_inner + 2 G N) + H
    x, B, C    = SiLU(conv(xBC))                one causal depthwise conv over x, B and C together
    Δ          = softplus(dt + dt_bias)         one step size per head
    h_t        = exp(Δ_t A) h_{t-1} + Δ_t x_t B_tᵀ    per head, A = -exp(A_log) a scalar per head,
    y_t        = h_t C_t + D x_t                      h_t: [headdim, N]; B, C shared by the
                                                      heads of a group (ngroups G)
    out        = out_proj(RMSNorm_group(y ⊙ SiLU(z)))  gated RMSNorm, gate before the norm
                                                       (mamba_ssm: norm_before_gate=False)

d_inner = expand · d_model, H = d_inner / headdim heads, N = d_state. As in the reference,
in_proj and out_proj have no bias, the conv has one, D is one scalar per head
(D_has_hdim=False) and the norm (eps 1e-5) normalises each group of d_inner / G channels.

Defaults are mamba_ssm's (expand 2, d_conv 4, ngroups 1, A ~ U[1, 16], Δ's init log-uniform in
[1e-3, 1e-1] floored at 1e-4, through an inverse softplus into dt_bias), with three choices:

* ``d_state`` defaults to 64, ``Mamba2Simple``'s value (``modules/mamba2.py``'s ``Mamba2``
  defaults to 128, which is ``d_state: 128``);
* ``headdim`` defaults to null = gcd(64, d_inner): mamba_ssm's 64 wherever 64 divides d_inner
  (d_model = 64 gives 2 heads of 64, as the reference), and the largest power-of-two divisor
  below it otherwise (d_model = 16: one head of 32), so that every width builds. An explicit
  headdim that does not divide d_inner is an error naming ``model.mixer.headdim``;
* ``chunk_size`` defaults to 64, not the kernel's 256: it only changes the arithmetic order
  (the output is the same function of the input). It is the longest chunk: T steps are cut
  into ceil(T / chunk_size) chunks of equal length
  (:func:`~mecheval.models.ops.decay.balanced_chunks`), so the paper's T = 35 is one
  chunk, with no state passing at all (at d = 64 the SSD scan's forward + backward took
  ~2 ms so, ~8 ms in chunks of 16), and T = 70 two chunks of 35.

``d_conv: null`` removes the conv (no ``mixer.conv.output`` site), as Mamba's "no conv"
ablation does. ``allow_neg_eigval: true`` (Grazzi et al., 2025; off by default, as mamba_ssm)
replaces each head's transition exp(Δ_t A) ∈ (0, 1) by 2 exp(Δ_t A) - 1 ∈ (-1, 1), the drive
unchanged, in every form (the chunked one then multiplies the decays over each span).
``dt_limit`` (no clamp by default in the reference), ``D_has_hdim``,
``rmsnorm=False``, ``d_ssm`` and learnable initial states are not offered. transformers'
``Mamba2Mixer`` inits A as 1..H rather than U[1, 16] and zeroes the conv bias; mecheval
follows mamba_ssm.

The SSD scan (models/ops/ssd.py) has two implementations: :func:`ssd_chunked`, the chunked
"dual" form used in the forward pass (Dao & Gu, 2024, §6; ``ssd_minimal_discrete``), and
:func:`ssd_recurrent`, the step-by-step recurrence that tests hold it to."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator
from torch import nn

from mecheval.models.mixers.mamba import SelectiveSSM
from mecheval.models.mixers.modules import GatedRMSNorm, ShortConv
from mecheval.models.mixers.options import (
    SCALAR_NEG_EIGVAL,
    SSDHeadOptions,
    neg_eigval_field,
)
from mecheval.models.ops.ssd import ssd_chunked, ssd_recurrent


class Mamba2Options(SSDHeadOptions):
    d_conv: int | None = Field(
        4, ge=1, description="short conv kernel size over x, B, C; null removes the conv"
    )
    A_init_range: tuple[float, float] = Field(
        (1.0, 16.0), description="A = -U[lo, hi] per head at init (A_log = log U)"
    )
    allow_neg_eigval: bool = neg_eigval_field(SCALAR_NEG_EIGVAL)

    @field_validator("A_init_range")
    @classmethod
    def _a_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = value
        if not 0 < low <= high:
            raise ValueError(f"expected 0 < low <= high, got {list(value)}")
        return value


class SSDHeads(SelectiveSSM):
    """What Mamba-2 and Mamba-3 share: heads of ``headdim`` channels over d_inner, groups of
    heads sharing B and C, and one short conv over x, B and C together (``conv_dim``)."""

    def __init__(self, d_model: int, options: SSDHeadOptions) -> None:
        super().__init__()
        self.options = options
        self.d_inner, self.headdim, self.nheads = options.heads(d_model)
        self.ngroups, self.d_state = options.ngroups, options.d_state
        self.conv_dim = self.d_inner + 2 * options.ngroups * options.d_state

    def split_xbc(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[batch, T, conv_dim] -> x [batch, T, d_inner], B and C [batch, T, G * N]."""
        groups_state = self.ngroups * self.d_state
        return xbc.split([self.d_inner, groups_state, groups_state], dim=-1)


class Mamba2(SSDHeads):
    def __init__(self, d_model: int, options: Mamba2Options) -> None:
        super().__init__(d_model, options)
        o = options

        # Order as the reference: [z, x, B, C, dt].
        self.in_proj = nn.Linear(d_model, self.d_inner + self.conv_dim + self.nheads, bias=o.bias)
        if o.d_conv is not None:
            self.conv = ShortConv(self.conv_dim, o.d_conv, bias=o.conv_bias)
        self.dt_bias = nn.Parameter(torch.empty(self.nheads))
        self.A_log = nn.Parameter(torch.empty(self.nheads))
        self.D = nn.Parameter(torch.empty(self.nheads))
        self.norm = GatedRMSNorm(
            self.d_inner, o.norm_eps, group_size=self.d_inner // o.ngroups, norm_before_gate=False
        )
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=o.bias)
        self.init_special()

    @torch.no_grad()
    def init_special(self) -> None:
        # Δ = softplus(dt_bias) at zero input: log-uniform in [dt_min, dt_max], floored.
        self.init_dt_bias(self.dt_bias)
        self.A_log.copy_(torch.log(torch.empty(self.nheads).uniform_(*self.options.A_init_range)))
        self.D.fill_(1.0)
        self.norm.weight.fill_(1.0)

    def ssd_inputs(
        self, u: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """u [batch, T, d] -> x [batch, T, H, P], Δ [batch, T, H], B, C [batch, T, G, N], z."""
        batch, length, _ = u.shape
        z, xbc, dt = self.in_proj(u).split([self.d_inner, self.conv_dim, self.nheads], dim=-1)
        if self.has_conv:
            xbc = self.conv(xbc)
        x, b, c = self.split_xbc(F.silu(xbc))
        x = x.view(batch, length, self.nheads, self.headdim)
        b = b.view(batch, length, self.ngroups, self.d_state)
        c = c.view(batch, length, self.ngroups, self.d_state)
        delta = F.softplus(dt + self.dt_bias)
        return x, delta, b, c, z

    def finish(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """SSD output [batch, T, H, P] and gate z -> mixer output [batch, T, d]."""
        return self.out_proj(self.norm(y.flatten(2), z))

    def recurrent_state_size(self, seq_len: int) -> int:
        return self.nheads * self.headdim * self.d_state

    def mix(self, u: torch.Tensor) -> torch.Tensor:
        x, delta, b, c, z = self.ssd_inputs(u)
        o = self.options
        y = ssd_chunked(x, delta, self.A(), b, c, self.D, o.chunk_size, o.allow_neg_eigval)
        return self.finish(y, z)

    def mix_recurrent(self, u: torch.Tensor) -> torch.Tensor:
        """:meth:`mix` with the step-by-step recurrence (for tests and debugging)."""
        x, delta, b, c, z = self.ssd_inputs(u)
        neg = self.options.allow_neg_eigval
        return self.finish(ssd_recurrent(x, delta, self.A(), b, c, self.D, neg_eigval=neg), z)

    # Resuming from a prefix (Mixer.final_states): h after each position, by the recurrence.
    carries = "state"
    resume_from_prefix = False  # recomputing the window is faster (Mixer.resume_from_prefix)

    def final_states(self, u: torch.Tensor) -> torch.Tensor:
        x, delta, b, c, _ = self.ssd_inputs(u)
        neg = self.options.allow_neg_eigval
        return ssd_recurrent(x, delta, self.A(), b, c, self.D, keep=True, neg_eigval=neg)[1]

    def mix_from(
        self,
        u: torch.Tensor,
        offset: int,
        initial_state: torch.Tensor | None,
        replace: bool = False,
    ) -> torch.Tensor:
        x, delta, b, c, z = (t[:, offset:] for t in self.ssd_inputs(u))
        y = ssd_recurrent(
            x,
            delta,
            self.A(),
            b,
            c,
            self.D,
            initial=initial_state,
            replace_first=replace,
            neg_eigval=self.options.allow_neg_eigval,
        )
        return self.finish(y, z)
