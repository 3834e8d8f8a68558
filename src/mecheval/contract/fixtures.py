"""What the contract's checks share: the small models and random tokens they build, and how a
check fails (:class:`CheckFailed`, with a one-line reason)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mecheval.models.backbone import LanguageModel, build_model
from mecheval.models.config import ModelConfig, layers_named

VOCAB = 23
MAX_LEN = 48
D_MODEL = 16
#: init_std of the models whose checks need every patch to matter
SIGNAL_INIT_STD = 0.5


class CheckFailed(AssertionError):
    pass


def make_model(
    arch: str,
    options: Mapping[str, Any] | None = None,
    *,
    d_model: int = D_MODEL,
    n_layers: int = 2,
    seed: int = 0,
    **config: Any,
) -> LanguageModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers = layers_named(arch)  # a hybrid's layers, each with its default options
        shape = (
            {"layers": layers}
            if layers is not None
            else {"architecture": arch, "n_layers": n_layers, "mixer": dict(options or {})}
        )
        cfg = ModelConfig(d_model=d_model, vocab_size=VOCAB, max_len=MAX_LEN, **shape, **config)
        return build_model(cfg).eval()


def random_tokens(b: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def require(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0
