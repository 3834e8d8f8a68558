"""The one LM backbone every architecture shares (docs/architecture.md, "Models").

embedding (+ learned absolute positions) -> n_layers pre-norm blocks
``x + mixer(norm(x))``, ``x + mlp(LN(x))`` -> final LayerNorm -> LM head tied to the embedding.

Init is the one the paper's code applies to each block type (``Architecture.init``):

* ``"zoology"`` (zoology ``model.py`` ``_init_weights``, every TransformerBlock): every Linear
  and Embedding weight ~ N(0, init_std), biases 0, the residual-out projections (``out_proj``
  of a mixer, ``fc2`` of an MLP) ~ N(0, init_std / sqrt(2 * n_layers));
* ``"mamba"`` (mamba_ssm ``mixer_seq_simple._init_weights``, which the paper's MambaBlock path
  uses): Linear weights keep PyTorch's default (kaiming-uniform, a = sqrt(5): U(+-1/sqrt(fan_in))),
  Linear biases 0, Embeddings ~ N(0, init_std), ``out_proj`` redrawn kaiming-uniform and
  divided by sqrt(n_layers) (one residual branch per block);

then each mixer's ``init_special()`` applies what its architecture prescribes (Mamba's A and
dt, the convolutions' PyTorch defaults, …).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import BaseModel
from torch import nn

from mecheval.errors import ConfigError
from mecheval.models.config import LayerConfig, ModelConfig
from mecheval.models.mixers.base import Mixer
from mecheval.models.mixers.modules import ShortConv
from mecheval.models.mixers.parallel import ParallelMixer
from mecheval.models.registry import Architecture, get_architecture, parse_options
from mecheval.models.sites import Site, name_sites

RESIDUAL_OUT_NAMES = ("out_proj", "fc2")


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class MLP(nn.Module):
    def __init__(self, d: int, expansion: int = 4) -> None:
        super().__init__()
        self.input = Site()
        self.fc1 = nn.Linear(d, expansion * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(expansion * d, d)
        self.output = Site()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.fc2(self.act(self.fc1(self.input(x)))))


class Block(nn.Module):
    def __init__(self, d: int, mixer: Mixer, mlp: bool, norm: str) -> None:
        super().__init__()
        make_norm = RMSNorm if norm == "rms" else nn.LayerNorm
        self.input = Site()
        self.mixer_norm = make_norm(d)
        self.mixer = mixer
        self.mlp_norm = nn.LayerNorm(d) if mlp else None
        self.mlp = MLP(d) if mlp else None
        self.output = Site()

    def forward(self, x: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
        """``at`` (one position per row): the MLP and the output are computed at those
        positions only, [B, 1, d] -- valid for the last block when only the query matters."""
        x = self.input(x)
        x = x + self.mixer(self.mixer_norm(x))
        if at is not None:
            x = x[torch.arange(x.shape[0], device=x.device), at][:, None]
        if self.mlp is not None:
            x = x + self.mlp(self.mlp_norm(x))
        return self.output(x)

    def forward_from(
        self,
        x: torch.Tensor,
        offset: int,
        state: Any,
        at: torch.Tensor | None = None,
        replace: bool = False,
        whole: bool = False,
    ) -> torch.Tensor:
        """:meth:`forward` at positions ``offset``.. of the window ``x`` [R, W, d] of the
        residual stream, given the mixer's state carried into ``offset`` (see
        :meth:`Mixer.forward_from`) -> [R, W - offset, d]; ``at`` as in :meth:`forward`,
        counted from ``offset``; ``replace`` and ``whole`` as in :meth:`Mixer.forward_from`.
        Each site sees the suffix of positions it computes."""
        x = self.input(x)
        mixed = self.mixer.forward_from(self.mixer_norm(x), offset, state, replace, whole)
        x = x[:, offset:] + mixed
        if at is not None:
            x = x[torch.arange(x.shape[0], device=x.device), at][:, None]
        if self.mlp is not None:
            x = x + self.mlp(self.mlp_norm(x))
        return self.output(x)


class FinalNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.input = Site()
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
        """Normalise every position, or only ``at`` (one position per document) -> [B, 1, d]."""
        x = self.input(x)
        if at is not None:
            x = x[torch.arange(x.shape[0], device=x.device), at][:, None, :]
        return self.norm(x)


def switched_options(
    config: ModelConfig, arch: Architecture, options: dict, field: str = "model.mixer"
) -> dict:
    """A layer's mixer ``options`` (named ``field`` in messages) with the short-convolution
    switch applied: ``model.short_conv`` sets the option that sizes the architecture's own
    short convs (``Architecture.short_conv``; 'none' -> null); an architecture without one
    gets a conv on its input instead (see :class:`LanguageModel`), and one that refuses the
    switch is an error."""
    switch = config.short_conv
    if switch is None:
        return options
    if arch.no_conv_switch:
        raise ConfigError(f"model.short_conv: {arch.name} {arch.no_conv_switch}")
    if arch.short_conv is None:
        return options
    if arch.short_conv in options:
        raise ConfigError(
            f"model.short_conv: {arch.name} sizes its short conv with "
            f"{field}.{arch.short_conv}, which is set too; set one of the two"
        )
    return {**options, arch.short_conv: None if switch == "none" else switch}


def layer_architectures(config: ModelConfig) -> list[list[Architecture]]:
    """Each layer's registered architectures: one, or a parallel layer's one per branch."""
    return [
        [arch for arch, _, _ in _branches(layer, field)] for layer, field in config.layer_configs()
    ]


def _branches(layer: LayerConfig, field: str) -> list[tuple[Architecture, dict, str]]:
    """A layer's (architecture, options, options' field name) per mixer it holds."""
    if layer.parallel is None:
        assert layer.architecture is not None
        where = "model.architecture" if field == "model" else f"{field}.architecture"
        return [(get_architecture(layer.architecture, where), layer.mixer, f"{field}.mixer")]
    return [
        entry
        for k, branch in enumerate(layer.parallel)
        for entry in _branches(branch, f"{field}.parallel.{k}")
    ]


class LanguageModel(nn.Module):
    """A causal LM. ``forward(tokens)`` -> logits [B, T, V]; ``forward(tokens, at=pos)`` ->
    logits [B, V] at one position per document (the query), skipping the rest of the head."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ConfigError("model.vocab_size: must be set (normally filled in from the task)")
        layers = [(layer, _branches(layer, field)) for layer, field in config.layer_configs()]
        positions = uses_position_embedding(config)
        if positions and config.max_len is None:
            raise ConfigError("model.max_len: must be set when position_embedding is on")
        options = [
            [
                parse_options(arch.name, switched_options(config, arch, opts, field), field)
                for arch, opts, field in branches
            ]
            for _, branches in layers
        ]
        self.config = config
        d = config.d_model
        self.embedding = nn.Embedding(config.vocab_size, d)
        self.position = nn.Embedding(config.max_len, d) if positions else None
        try:
            mixers = [
                _layer_mixer(i, d, layer, branches, opts)
                for i, ((layer, branches), opts) in enumerate(zip(layers, options, strict=True))
            ]
        except ValueError as err:
            raise ConfigError(str(err)) from None
        # Every conv before any block: the order in which the default inits draw.
        for (_, branches), mixer in zip(layers, mixers, strict=True):
            inner = mixer.branches if isinstance(mixer, ParallelMixer) else [mixer]
            for (arch, _, _), branch in zip(branches, inner, strict=True):
                if isinstance(config.short_conv, int) and arch.short_conv is None:
                    branch.short_conv = ShortConv(d, config.short_conv)
        # A parallel layer's block (its MLP, its norm) is its first branch's architecture's.
        self.layers = nn.ModuleList(
            Block(d, mixer, branches[0][0].mlp, branches[0][0].norm)
            for (_, branches), mixer in zip(layers, mixers, strict=True)
        )
        self.final_norm = FinalNorm(d)
        self.reset_parameters()
        name_sites(self)

    @property
    def device(self) -> torch.device:
        """The device the model's parameters are on (as transformers' models have it; pyvene
        reads ``model.device``). A model lives on one device: ``load_run(..., device=)``,
        ``.to()``."""
        return self.embedding.weight.device

    def reset_parameters(self) -> None:
        """Each block by its own architecture's init (a hybrid's blocks differ); the
        embeddings are drawn alike by both."""
        std = self.config.init_std
        n_layers = self.config.n_layers
        archs = layer_architectures(self.config)
        for name, module in self.named_modules():
            parts = name.split(".")
            layer = archs[int(parts[1]) if parts[0] == "layers" and len(parts) > 1 else 0]
            # A parallel layer's branch by its own architecture, the rest by its block's.
            inside = parts[2:4] == ["mixer", "branches"] and len(parts) > 4
            arch = layer[int(parts[4])] if inside else layer[0]
            residual_branches = 2 if layer[0].mlp else 1
            if isinstance(module, nn.Linear):
                residual_out = name.rsplit(".", 1)[-1] in RESIDUAL_OUT_NAMES
                if arch.init == "mamba":
                    module.reset_parameters()  # PyTorch's default, as mamba_ssm leaves it
                    if residual_out:
                        # mamba_ssm: kaiming_uniform_(a=sqrt(5)), then / sqrt(n_residuals *
                        # n_layers), one residual branch per block without an MLP.
                        with torch.no_grad():
                            module.weight.div_(math.sqrt(residual_branches * n_layers))
                else:
                    out_std = std / math.sqrt(2 * n_layers)
                    nn.init.normal_(module.weight, 0.0, out_std if residual_out else std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, std)
        for module in self.modules():
            if isinstance(module, Mixer):
                module.init_special()

    # The forward is split in three so that an intervention engine can recompute only the
    # layers downstream of a patched block boundary.
    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        if self.position is not None:
            t = tokens.shape[1]
            if t > self.position.num_embeddings:
                raise ValueError(
                    f"tokens: length {t} exceeds model.max_len={self.position.num_embeddings}"
                )
            x = x + self.position.weight[:t]
        return x

    def head(self, x: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.final_norm(x, at) @ self.embedding.weight.T
        return logits[:, 0] if at is not None else logits

    def forward(self, tokens: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x, at)


def _layer_mixer(
    i: int,
    d: int,
    layer: LayerConfig,
    branches: list[tuple[Architecture, dict, str]],
    options: list[BaseModel],
) -> Mixer:
    """Layer ``i``'s mixer: its architecture's, or a parallel layer of its branches'."""
    mixers = [arch.build(i, d, opts) for (arch, _, _), opts in zip(branches, options, strict=True)]
    if layer.parallel is None:
        return mixers[0]
    return ParallelMixer(d, mixers, layer.combine)


def uses_position_embedding(config: ModelConfig) -> bool:
    """``model.position_embedding``, or where unset its architecture's default."""
    if config.position_embedding is not None:
        return config.position_embedding
    # A hybrid: on only where every layer's architecture has it on.
    return all(arch.position_embedding for layer in layer_architectures(config) for arch in layer)


def build_model(config: ModelConfig) -> LanguageModel:
    return LanguageModel(config)


def model_device(model: nn.Module) -> torch.device:
    """The device a model's parameters are on: where its inputs must go."""
    return next(model.parameters()).device


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def state_size(model: LanguageModel, seq_len: int) -> int | None:
    """Floats one sequence carries at inference after ``seq_len`` tokens, over all blocks
    (``Mixer.state_size``: KV cache, recurrent states, conv buffers); None if a mixer does
    not say."""
    sizes = [layer.mixer.state_size(seq_len) for layer in model.layers]
    return None if any(size is None for size in sizes) else sum(sizes)
