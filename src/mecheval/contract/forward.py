"""The contract's checks of a model's forward pass: shapes, causality, batch independence,
the logits at the query, and gradients (what each guards: :mod:`mecheval.contract`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mecheval.contract.fixtures import VOCAB, make_model, max_diff, random_tokens, require
from mecheval.models.mixers.base import Mixer, is_inert


def check_shapes(arch: str, options: Mapping[str, Any] | None = None) -> str:
    model = make_model(arch, options)

    mixers = {m: n for n, m in model.named_modules() if isinstance(m, Mixer)}

    def same_shape(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
        # Checked here, before the residual add turns a wrong shape into a broadcast or a crash.
        seen, given = tuple(output.shape), tuple(inputs[0].shape)
        require(seen == given, f"{mixers[module]}: output {seen} for input {given}")

    handles = [m.register_forward_hook(same_shape) for m in mixers]
    try:
        for b, t in [(1, 1), (3, 7), (2, 45)]:
            with torch.no_grad():
                out = model(random_tokens(b, t))
            require(out.shape == (b, t, VOCAB), f"B={b} T={t}: logits {tuple(out.shape)}")
            require(bool(torch.isfinite(out).all()), f"B={b} T={t}: non-finite logits")
    finally:
        for handle in handles:
            handle.remove()
    return "logits [B, T, V] for T in 1, 7, 45; each mixer's output has its input's shape"


def check_causality(arch: str, options: Mapping[str, Any] | None = None) -> str:
    x = random_tokens(2, 37)
    t = 20
    y = x.clone()
    y[:, t + 1 :] = (y[:, t + 1 :] + 5) % VOCAB
    worst = 0.0
    for position_embedding in (True, False):
        model = make_model(arch, options, position_embedding=position_embedding).double()
        with torch.no_grad():
            a, b = model(x), model(y)
        leak = max_diff(a[:, : t + 1], b[:, : t + 1])
        require(
            leak < 1e-10,
            f"output at t <= {t} changed by {leak:.2e} when only later tokens changed "
            f"(position_embedding={position_embedding})",
        )
        require(not torch.allclose(a[:, t + 1 :], b[:, t + 1 :]), "later outputs ignore tokens")
        worst = max(worst, leak)
    return f"future tokens change past outputs by {worst:.1e} (float64)"


def check_batch_independence(arch: str, options: Mapping[str, Any] | None = None) -> str:
    model = make_model(arch, options).double()
    x = random_tokens(4, 19)
    with torch.no_grad():
        together = model(x)
        alone = torch.cat([model(x[i : i + 1]) for i in range(4)])
    diff = max_diff(together, alone)
    require(diff < 1e-10, f"a document's logits depend on its batch by {diff:.2e}")
    return f"batched vs one at a time: {diff:.1e} (float64)"


def check_query_logits(arch: str, options: Mapping[str, Any] | None = None) -> str:
    model = make_model(arch, options).double()
    x = random_tokens(3, 29)
    at = torch.tensor([28, 5, 17])
    rows = torch.arange(3)
    with torch.no_grad():
        full, picked = model(x), model(x, at=at)
        # The engine reads a document at its query in a batch padded to the longest document:
        # what comes after the query, even only how much, must not matter. (The same batch
        # cut at q, so that this compares lengths only.)
        prefix = torch.stack([model(x[:, : q + 1])[b, -1] for b, q in enumerate(at.tolist())])
    diff = max_diff(picked, full[rows, at])
    require(diff < 1e-10, f"model(tokens, at=q) differs from the full logits at q by {diff:.2e}")
    cut = max_diff(prefix, full[rows, at])
    require(
        cut < 1e-10,
        f"the logits at q change by {cut:.2e} when the sequence ends at q: the output depends "
        "on the length of what follows",
    )
    return f"logits at the query = full logits = the prefix's own ({max(diff, cut):.1e}, float64)"


def check_gradients(arch: str, options: Mapping[str, Any] | None = None) -> str:
    model = make_model(arch, options).train()
    x = random_tokens(4, 33)
    logits = model(x)
    target = random_tokens(4, 33, seed=2)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten()).backward()
    params = dict(model.named_parameters())
    inert = [n for n, p in params.items() if is_inert(p)]
    missing = [
        n for n, p in params.items() if n not in inert and (p.grad is None or not p.grad.any())
    ]
    require(not missing, f"parameters without gradient: {', '.join(missing)}")
    live = [n for n in inert if params[n].grad is not None and params[n].grad.any()]
    require(not live, f"parameters marked inert have a gradient: {', '.join(live)}")
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p.grad).all()]
    require(not bad, f"non-finite gradients: {', '.join(bad)}")
    return f"{sum(1 for _ in model.parameters())} parameters, all with a finite gradient"
