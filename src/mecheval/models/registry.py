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
