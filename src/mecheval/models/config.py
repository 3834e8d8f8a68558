"""The model half of a run config: backbone shape plus architecture-specific mixer options."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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
    init_std: float = Field(0.02, gt=0.0)
    mixer: dict[str, Any] = Field(
        default_factory=dict,
        description="options of the chosen architecture (see its registry entry)",
    )
