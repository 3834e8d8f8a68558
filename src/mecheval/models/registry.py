"""The explicit architecture registry: name -> mixer builder + typed options.

Configs name an architecture by its registry key; no dotted import strings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from mecheval.errors import ConfigError, validate
from mecheval.models.mixers.attention import Attention, AttentionOptions
from mecheval.models.mixers.base import Mixer
from mecheval.models.mixers.baseconv import BaseConvOptions, build_baseconv
from mecheval.models.mixers.based import BasedOptions, build_based
from mecheval.models.mixers.deltanet import DeltaNet, DeltaNetOptions
from mecheval.models.mixers.h3 import H3Options, build_h3
from mecheval.models.mixers.hyena import HyenaOptions, build_hyena
from mecheval.models.mixers.mamba import Mamba, MambaOptions

#: (layer index, d_model, validated options) -> mixer for that layer
MixerBuilder = Callable[[int, int, BaseModel], Mixer]


@dataclass(frozen=True)
class Architecture:
    name: str
    options: type[BaseModel]
    build: MixerBuilder
    description: str
    mlp: bool = True  # Mamba blocks have no MLP
    norm: Literal["layer", "rms"] = "layer"  # pre-norm of each block; the final norm is LayerNorm


ARCHITECTURES: dict[str, Architecture] = {}


def register(arch: Architecture) -> Architecture:
    if arch.name in ARCHITECTURES:
        raise ValueError(f"architecture {arch.name!r} registered twice")
    ARCHITECTURES[arch.name] = arch
    return arch


def get_architecture(name: str) -> Architecture:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        known = ", ".join(sorted(ARCHITECTURES))
        raise ConfigError(
            f"model.architecture: unknown {name!r} (expected one of: {known})"
        ) from None


def parse_options(name: str, options: dict) -> BaseModel:
    return validate(get_architecture(name).options, options, prefix="model.mixer")


register(
    Architecture(
        name="attention",
        options=AttentionOptions,
        build=lambda layer, d, opts: Attention(d, opts),
        description="causal softmax attention (Transformer)",
    )
)

register(
    Architecture(
        name="mamba",
        options=MambaOptions,
        build=lambda layer, d, opts: Mamba(d, opts),
        description="Mamba-1 selective SSM with short conv (Gu & Dao, 2023); no MLP, RMSNorm",
        mlp=False,
        norm="rms",
    )
)

register(
    Architecture(
        name="deltanet",
        options=DeltaNetOptions,
        build=lambda layer, d, opts: DeltaNet(d, opts),
        description="DeltaNet: delta-rule linear attention with short convs (Yang et al., 2024)",
    )
)

register(
    Architecture(
        name="baseconv",
        options=BaseConvOptions,
        build=build_baseconv,
        description="BaseConv: conv(u) * linear(u) + u, conv size per layer from a cycled list "
        "(-1 = implicit long conv) (Arora et al., 2024a)",
    )
)

register(
    Architecture(
        name="based",
        options=BasedOptions,
        build=build_based,
        description="Based hybrid: BaseConv short-conv layers alternating with Taylor-feature "
        "linear attention (Arora et al., 2024b)",
    )
)

register(
    Architecture(
        name="h3",
        options=H3Options,
        build=build_h3,
        description="H3: q * DiagSSM(ShiftSSM(k) * v), S4D-Lin diagonal SSM (Fu et al., 2023)",
    )
)

register(
    Architecture(
        name="hyena",
        options=HyenaOptions,
        build=build_hyena,
        description="Hyena order 2: short conv, gating, implicit long conv (Poli et al., 2023)",
    )
)
