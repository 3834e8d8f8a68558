"""Option pieces several mixers share: the base class of every mixer's options, the check that
a head count or size divides the width, the fields of the chunked recurrences (chunk size,
negative eigenvalues), and the heads of Mamba-2's SSD layout, which Mamba-3 keeps (its
options' common fields and their layout)."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

#: mamba_ssm's default head size, used wherever it divides d_inner
REFERENCE_HEADDIM = 64


class MixerOptions(BaseModel):
    """A mixer's options (``model.mixer`` of a run config): a key the class does not declare is
    an error naming it, not ignored, so a misspelt option never trains the default."""

    model_config = ConfigDict(extra="forbid")


def check_divides(d_model: int, field: str, value: int, hint: str = "") -> None:
    """``model.mixer.<field>`` (a head count or size) must divide ``model.d_model``: one line
    naming both, and ``hint`` after it."""
    if d_model % value:
        raise ValueError(
            f"model.mixer.{field}: {value} does not divide model.d_model={d_model}{hint}"
        )


def chunk_size_field(default: int = 64, **bounds: Any) -> Any:
    """``chunk_size``: only the arithmetic order of a chunked form, not its function."""
    return Field(
        default,
        ge=1,
        description="longest block of the chunked form (blocks are balanced)",
        **bounds,
    )


def neg_eigval_field(effect: str) -> Any:
    """``allow_neg_eigval`` (off, as every reference): ``effect`` says what it does to the
    transition."""
    return Field(False, description=f"{effect} (Grazzi et al., 2025)")


#: Mamba's and Mamba-2's ``allow_neg_eigval``: the scalar transition per channel or head
SCALAR_NEG_EIGVAL = "transition 2 exp(ΔA) - 1 in (-1, 1) instead of exp(ΔA) in (0, 1)"


def dt_max_above_min(cls: type, value: float, info: ValidationInfo) -> float:
    """``dt_max``'s validator: not below ``dt_min``."""
    low = info.data.get("dt_min")
    if low is not None and value < low:
        raise ValueError(f"must not be below dt_min={low}")
    return value


class SSDHeadOptions(MixerOptions):
    """The fields Mamba-2 and Mamba-3 share: state size, heads and groups, Δ's init range, the
    norms' eps and the chunk (each subclass adds its conv, its A and what is its own)."""

    d_state: int = Field(64, ge=1, description="SSM state size N per head")
    expand: int = Field(2, ge=1, description="d_inner = expand * d_model")
    headdim: int | None = Field(
        None, ge=1, description="channels per head; null = gcd(64, d_inner) (64 where it fits)"
    )
    ngroups: int = Field(1, ge=1, description="groups of heads sharing B and C")
    conv_bias: bool = True
    bias: bool = Field(False, description="bias of in_proj and out_proj")
    dt_min: float = Field(1e-3, gt=0.0, description="Δ init is log-uniform in [dt_min, dt_max]")
    dt_max: float = Field(1e-1, gt=0.0)
    dt_init_floor: float = Field(1e-4, gt=0.0)
    norm_eps: float = Field(1e-5, gt=0.0, description="eps of the gated RMSNorm")
    chunk_size: int = chunk_size_field()

    _dt_range = field_validator("dt_max")(dt_max_above_min)

    def heads(self, d_model: int) -> tuple[int, int, int]:
        """(d_inner, head dimension, heads) at ``d_model``: ``headdim`` or the default, which
        must divide d_inner into heads that the ``ngroups`` groups of B and C divide."""
        d_inner = self.expand * d_model
        headdim = self.headdim or math.gcd(REFERENCE_HEADDIM, d_inner)
        if d_inner % headdim:
            raise ValueError(
                f"model.mixer.headdim: {headdim} does not divide d_inner = expand * d_model = "
                f"{d_inner}"
            )
        nheads = d_inner // headdim
        if nheads % self.ngroups:
            raise ValueError(
                f"model.mixer.ngroups: {self.ngroups} does not divide the {nheads} heads "
                f"(d_inner {d_inner} / headdim {headdim})"
            )
        return d_inner, headdim, nheads
