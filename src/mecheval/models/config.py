"""The model half of a run config: backbone shape plus architecture-specific mixer options."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    architecture: str = Field("attention", description="a name from `mecheval models list`")
    d_model: int = Field(64, ge=1, le=65536)
    n_layers: int = Field(2, ge=1, le=64)
    vocab_size: int | None = Field(None, ge=2, description="filled in from the task when unset")
    max_len: int | None = Field(
        None, ge=1, description="position-embedding length; filled in from the task when unset"
    )
    position_embedding: bool | None = Field(
        None,
        description="learned absolute positions; unset: the architecture's default (the "
        "paper's figures: on for attention only, as in zoology; App. D.1)",
    )
    short_conv: int | Literal["none"] | None = Field(
        None,
        description="the short-convolution switch: a kernel size (>= 1; the paper's are 1-4), "
        "'none', or unset: the architecture's default. Sets the architecture's own short "
        "convs where it has them (Mamba's d_conv, DeltaNet's q/k/v convs, ...), otherwise adds "
        "one on the mixer's input (site layers.{i}.mixer.short_conv.output)",
    )
    init_std: float = Field(0.02, gt=0.0)
    mixer: dict[str, Any] = Field(
        default_factory=dict,
        description="options of the chosen architecture (see its registry entry)",
    )

    @field_validator("short_conv")
    @classmethod
    def _kernel_at_least_one(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"expected a kernel size >= 1, 'none' or null, got {v}")
        return v
