"""The model half of a run config: backbone shape plus architecture-specific mixer options,
one architecture for every layer or (``layers``) one per layer: a hybrid."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from mecheval.errors import validate

#: how a hybrid's name joins its layers' architectures (``mamba+attention``), and a parallel
#: layer's branches (``attention~mamba``: no character the shell reads, unlike ``|``)
HYBRID_JOIN = "+"
PARALLEL_JOIN = "~"


class LayerConfig(BaseModel):
    """One layer of a hybrid: an architecture with its options, or (``parallel``) several
    mixers on the layer's input whose outputs are summed or concatenated and projected."""

    model_config = ConfigDict(extra="forbid")

    architecture: str | None = Field(None, description="a name from `mecheval models list`")
    mixer: dict[str, Any] = Field(default_factory=dict, description="its options")
    parallel: list[LayerConfig] | None = Field(
        None,
        description="branches (a name or {architecture, mixer} each) run on the same input",
    )
    combine: Literal["sum", "concat"] = Field(
        "sum",
        description="a parallel layer's outputs: summed, or concatenated and projected to "
        "d_model (out_proj)",
    )

    @field_validator("parallel", mode="before")
    @classmethod
    def _names_are_branches(cls, v: Any) -> Any:
        return _names_as_layers(v)

    @model_validator(mode="after")
    def _one_kind(self) -> LayerConfig:
        if (self.architecture is None) == (self.parallel is None):
            raise ValueError("expected either architecture or parallel")
        if self.parallel is not None:
            if len(self.parallel) < 2:
                raise ValueError("parallel: expected at least 2 branches")
            if any(branch.parallel is not None for branch in self.parallel):
                raise ValueError("parallel: a branch is one architecture, not parallel again")
            if self.mixer:
                raise ValueError("mixer: a parallel layer's options go per branch")
        return self

    @property
    def name(self) -> str:
        """Its architecture, or its branches' joined by ``~``."""
        if self.parallel is None:
            assert self.architecture is not None
            return self.architecture
        return PARALLEL_JOIN.join(branch.name for branch in self.parallel)


def _names_as_layers(v: Any) -> Any:
    if isinstance(v, list):
        return [{"architecture": x} if isinstance(x, str) else x for x in v]
    return v


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
    layers: list[LayerConfig] | None = Field(
        None,
        description="one entry per layer, a name, {architecture, mixer} or {parallel: [...], "
        "combine}: a hybrid (docs/hybrids.md). Sets n_layers, and architecture to the names "
        "joined by '+'; options go per layer. Layers all alike are n_layers layers of one "
        "architecture. Unset: n_layers of architecture",
    )

    @field_validator("layers", mode="before")
    @classmethod
    def _names_are_layers(cls, v: Any) -> Any:
        return _names_as_layers(v)

    @field_validator("layers")
    @classmethod
    def _at_least_one_layer(
        cls, v: list[LayerConfig] | None, info: ValidationInfo
    ) -> list[LayerConfig] | None:
        if v is None:
            return v
        if not 1 <= len(v) <= 64:
            raise ValueError(f"expected 1 to 64 layers, got {len(v)}")
        if info.data.get("mixer"):
            raise ValueError(
                "model.mixer is set too: a model with layers takes its options per layer "
                "(model.layers.N.mixer)"
            )
        return v

    @model_validator(mode="after")
    def _layers_set_the_shape(self) -> ModelConfig:
        if self.layers is None:
            return self
        # object.__setattr__: assignment would validate again (and recurse here)
        object.__setattr__(self, "n_layers", len(self.layers))
        first = self.layers[0]
        if first.parallel is None and all(layer == first for layer in self.layers):
            # Not a hybrid: the same config as n_layers layers of one architecture.
            object.__setattr__(self, "architecture", first.architecture)
            object.__setattr__(self, "mixer", dict(first.mixer))
            object.__setattr__(self, "layers", None)
            return self
        joined = HYBRID_JOIN.join(layer.name for layer in self.layers)
        object.__setattr__(self, "architecture", joined)
        return self

    def layer_configs(self) -> list[tuple[LayerConfig, str]]:
        """Each layer's config and its field name for messages (``model.layers.1``; a model
        of one architecture: ``model``, whose ``mixer`` are every layer's options)."""
        if self.layers is None:
            one = LayerConfig(architecture=self.architecture, mixer=self.mixer)
            return [(one, "model")] * self.n_layers
        return [(layer, f"model.layers.{i}") for i, layer in enumerate(self.layers)]

    @property
    def is_hybrid(self) -> bool:
        """Whether its layers differ (architecture or options)."""
        return self.layers is not None

    @field_validator("short_conv")
    @classmethod
    def _kernel_at_least_one(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"expected a kernel size >= 1, 'none' or null, got {v}")
        return v


def layers_name(layers: list[Any]) -> str:
    """The architecture name a ``model.layers`` value gives a model (``mamba+attention``;
    one name where all layers are alike), as ModelConfig sets it."""
    return validate(ModelConfig, {"layers": layers}, prefix="model").architecture


def layers_named(name: str) -> list[Any] | None:
    """A hybrid's ``model.layers`` from its name (``mamba+attention~hyena`` -> ``["mamba",
    {"parallel": ["attention", "hyena"]}]``, each layer with its default options); None for
    the name of one architecture."""
    if HYBRID_JOIN not in name and PARALLEL_JOIN not in name:
        return None
    return [
        {"parallel": part.split(PARALLEL_JOIN)} if PARALLEL_JOIN in part else part
        for part in name.split(HYBRID_JOIN)
    ]
