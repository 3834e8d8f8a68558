"""BaseConv (Arora et al., 2024a), exactly as zoology's ``BaseConv``:

    y = conv(u) * projection(u) + u          (use_act=True: silu(conv(u)) * silu(projection(u)) + u)

with ``projection`` a Linear d -> d (with bias) and ``conv`` per layer either a causal depthwise
short convolution of size k (``ShortConv``) or, for k = -1, zoology's
``ImplicitLongConvolution`` (``mixers/convolution.py``): a kernel from fixed positional
features (t, cos, sin) -> Linear(3, 16) -> ReLU -> Linear(16, d), no decay window, plus an
unweighted ``+ u`` inside the convolution (``long_conv.MLPFilter``). There is no output
projection. Either way ``conv`` ends in an ``output`` site, so ``mixer.conv.output`` exists
in every layer.

The per-layer kernel size comes from a list that cycles over layers (paper default [3, -1]:
short conv in even layers, long conv in odd ones). zoology rejects lists shorter than the
layer count; cycling is a superset of that behaviour.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator
from torch import nn

from mecheval.models.mixers.base import Carry, Mixer, with_history
from mecheval.models.mixers.long_conv import ImplicitLongConv, MLPFilter
from mecheval.models.mixers.modules import ShortConv
from mecheval.models.mixers.options import MixerOptions

#: zoology's ImplicitLongConvolution hidden width (``d_hidden``; BaseConv passes none)
LONG_CONV_HIDDEN = 16


class BaseConvOptions(MixerOptions):
    kernel_size: list[int] = Field(
        default_factory=lambda: [3, -1],
        min_length=1,
        description="per-layer conv size, cycled over layers; -1 = implicit long convolution",
    )
    l_max: int = Field(1024, ge=1, description="longest sequence the long-conv filter covers")
    implicit_long_conv: bool = Field(
        True, description="kept for Table 1; only the implicit long convolution is implemented"
    )
    use_act: bool = Field(False, description="SiLU on both branches before the product")

    @field_validator("kernel_size")
    @classmethod
    def _sizes(cls, v: list[int]) -> list[int]:
        bad = [k for k in v if k != -1 and k < 1]
        if bad:
            raise ValueError(f"entries must be -1 (long conv) or >= 1, got {bad[0]}")
        return v

    @field_validator("implicit_long_conv")
    @classmethod
    def _implicit(cls, v: bool) -> bool:
        if not v:
            raise ValueError("only the implicit long convolution (True) is implemented")
        return v


class BaseConv(Mixer):
    def __init__(
        self, d_model: int, kernel_size: int, l_max: int = 1024, use_act: bool = False
    ) -> None:
        super().__init__()
        self.use_act = use_act
        self.projection = nn.Linear(d_model, d_model)
        self.conv: nn.Module
        if kernel_size == -1:
            self.conv = ImplicitLongConv(
                MLPFilter(d_model, l_max, hidden=LONG_CONV_HIDDEN), skip="identity"
            )
        elif kernel_size >= 1:
            self.conv = ShortConv(d_model, kernel_size)
        else:
            raise ValueError(
                f"model.mixer.kernel_size: expected -1 (long conv) or >= 1, got {kernel_size}"
            )

    def init_special(self) -> None:
        if isinstance(self.conv, ShortConv):
            self.conv.reset_parameters()
        else:
            self.conv.reset_special()

    def max_length(self) -> int | None:
        return self.conv.filter.l_max if isinstance(self.conv, ImplicitLongConv) else None

    # Resuming from a prefix (Mixer.final_states): a short conv reads kernel_size - 1 inputs
    # before the cut and carries nothing else, so the window alone resumes it (the default
    # prefix methods); a long convolution reads its input's whole history, which is then the
    # state, [B, T, d] (as attention's is its keys and values).
    def halo(self) -> int:
        return self.conv.kernel_size - 1 if isinstance(self.conv, ShortConv) else 0

    @property
    def carries(self) -> Carry | None:  # type: ignore[override]
        return None if isinstance(self.conv, ShortConv) else "history"

    def final_states(self, x: torch.Tensor) -> torch.Tensor | None:
        return None if isinstance(self.conv, ShortConv) else x

    def mix_from(
        self,
        x: torch.Tensor,
        offset: int,
        initial_state: torch.Tensor | None,
        replace: bool = False,
    ) -> torch.Tensor:
        if isinstance(self.conv, ShortConv) or replace:
            return super().mix_from(x, offset, initial_state, replace)
        u = x[:, offset:]
        return self._combine(self.conv.forward_from(*with_history(initial_state, u)), u)

    def recurrent_state_size(self, seq_len: int) -> int:
        # A short conv carries its buffer (counted by Mixer.state_size); a long convolution
        # reads the whole history of its input.
        return 0 if isinstance(self.conv, ShortConv) else self.projection.in_features * seq_len

    def mix(self, u: torch.Tensor) -> torch.Tensor:
        return self._combine(self.conv(u), u)

    def _combine(self, u_conv: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        u_proj = self.projection(u)
        if self.use_act:
            return F.silu(u_conv) * F.silu(u_proj) + u
        return u_conv * u_proj + u


def build_baseconv(layer: int, d_model: int, options: BaseConvOptions) -> BaseConv:
    k = options.kernel_size[layer % len(options.kernel_size)]
    return BaseConv(d_model, k, l_max=options.l_max, use_act=options.use_act)
