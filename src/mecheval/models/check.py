"""The contract every architecture must meet, as checks runnable on any registered mixer.

``mecheval check-mixer NAME`` runs them on a built-in or a plugin architecture, and the test
suite runs them on every registered one (tests/test_models.py). Each check builds small
models itself and raises :class:`CheckFailed` with a one-line reason. What they guard:

* ``shapes``: logits are [B, T, V] and finite, for T = 1 too;
* ``causality``: the output at t never depends on tokens after t (float64, so that round-off
  cannot hide a small leak), with and without position embeddings;
* ``batch-independence``: a document's output does not depend on the others in its batch
  (the intervention engine stacks unrelated rows in one batch);
* ``query-logits``: ``model(tokens, at=q)`` equals the full logits at q;
* ``gradients``: every parameter gets a finite, non-zero gradient (no dead parameter), except
  those marked inert (:func:`~mecheval.models.mixers.base.mark_inert`), whose gradient is 0;
* ``sites``: the backbone sites exist, every site fires once per forward with a
  [B, T, C] tensor and is reachable by its dotted name;
* ``site-patching``: overwriting any site with its own value changes nothing; patching the
  mixer input at position p changes outputs from p on and nothing before p;
* ``interchange``: the batched intervention engine equals the naive one-forward-per-patch
  loop on this architecture (layer 0's sites, every role).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from mecheval.models.backbone import LanguageModel, build_model
from mecheval.models.config import ModelConfig
from mecheval.models.mixers.base import is_inert
from mecheval.models.registry import get_architecture, parse_options
from mecheval.models.sites import get_site, iter_sites, site_names

VOCAB = 23
MAX_LEN = 48
D_MODEL = 16
#: init_std of the models whose checks need every patch to matter
SIGNAL_INIT_STD = 0.5


class CheckFailed(AssertionError):
    pass


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str
    seconds: float


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
        cfg = ModelConfig(
            architecture=arch,
            d_model=d_model,
            n_layers=n_layers,
            vocab_size=VOCAB,
            max_len=MAX_LEN,
            mixer=dict(options or {}),
            **config,
        )
        return build_model(cfg).eval()


def random_tokens(b: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0


def check_shapes(arch: str, options: Mapping[str, Any] | None = None) -> str:
    model = make_model(arch, options)
    for b, t in [(1, 1), (3, 7), (2, 45)]:
        with torch.no_grad():
            out = model(random_tokens(b, t))
        _require(out.shape == (b, t, VOCAB), f"B={b} T={t}: logits {tuple(out.shape)}")
        _require(bool(torch.isfinite(out).all()), f"B={b} T={t}: non-finite logits")
    return "logits [B, T, V] for T in 1, 7, 45"


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
        leak = _max_diff(a[:, : t + 1], b[:, : t + 1])
        _require(
            leak < 1e-10,
            f"output at t <= {t} changed by {leak:.2e} when only later tokens changed "
            f"(position_embedding={position_embedding})",
        )
        _require(not torch.allclose(a[:, t + 1 :], b[:, t + 1 :]), "later outputs ignore tokens")
        worst = max(worst, leak)
    return f"future tokens change past outputs by {worst:.1e} (float64)"


def check_batch_independence(arch: str, options: Mapping[str, Any] | None = None) -> str:
    model = make_model(arch, options).double()
    x = random_tokens(4, 19)
    with torch.no_grad():
        together = model(x)
        alone = torch.cat([model(x[i : i + 1]) for i in range(4)])
    diff = _max_diff(together, alone)
    _require(diff < 1e-10, f"a document's logits depend on its batch by {diff:.2e}")
    return f"batched vs one at a time: {diff:.1e} (float64)"


def check_query_logits(arch: str, options: Mapping[str, Any] | None = None) -> str:
    model = make_model(arch, options)
    x = random_tokens(3, 29)
    at = torch.tensor([28, 5, 17])
    with torch.no_grad():
        full, picked = model(x), model(x, at=at)
    diff = _max_diff(picked, full[torch.arange(3), at])
    _require(diff < 1e-5, f"model(tokens, at=q) differs from the full logits at q by {diff:.2e}")
    return f"logits at the query equal the full logits ({diff:.1e})"


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
    _require(not missing, f"parameters without gradient: {', '.join(missing)}")
    live = [n for n in inert if params[n].grad is not None and params[n].grad.any()]
    _require(not live, f"parameters marked inert have a gradient: {', '.join(live)}")
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p.grad).all()]
    _require(not bad, f"non-finite gradients: {', '.join(bad)}")
    return f"{sum(1 for _ in model.parameters())} parameters, all with a finite gradient"


def check_sites(arch: str, options: Mapping[str, Any] | None = None) -> str:
    model = make_model(arch, options)
    names = site_names(model)
    _require(len(names) == len(set(names)), "site names are not unique")
    expected = {"final_norm.input"}
    for i in range(2):
        expected |= {f"layers.{i}.{s}" for s in ("input", "output", "mixer.input", "mixer.output")}
        if get_architecture(arch).mlp:
            expected |= {f"layers.{i}.mlp.input", f"layers.{i}.mlp.output"}
    absent = sorted(expected - set(names))
    _require(not absent, f"missing sites: {', '.join(absent)}")
    seen: dict[str, list[tuple[int, ...]]] = {}
    handles = [
        site.register_forward_hook(lambda m, i, o, n=name: seen.setdefault(n, []).append(o.shape))
        for name, site in iter_sites(model)
    ]
    try:
        with torch.no_grad():
            model(random_tokens(3, 11), at=torch.tensor([10, 10, 10]))
    finally:
        for handle in handles:
            handle.remove()
    silent = sorted(set(names) - set(seen))
    _require(not silent, f"sites that never fired: {', '.join(silent)}")
    for name, shapes in seen.items():
        _require(len(shapes) == 1, f"{name}: fired {len(shapes)} times in one forward")
        _require(
            len(shapes[0]) == 3 and shapes[0][:2] == (3, 11),
            f"{name}: saw shape {tuple(shapes[0])}, expected [B=3, T=11, C]",
        )
        _require(get_site(model, name).name == name, f"{name}: not named by its path")
    return f"{len(names)} sites, each fired once with [B, T, C]"


def check_site_patching(arch: str, options: Mapping[str, Any] | None = None) -> str:
    # A large init, so that every path carries signal: at init_std 0.02 a Hyena long filter is
    # ~1e-4 and a patch of the mixer input would move the logits by less than round-off.
    model = make_model(arch, options, init_std=SIGNAL_INIT_STD)
    x = random_tokens(2, 19)
    with torch.no_grad():
        ref = model(x)
        for name, site in iter_sites(model):
            handle = site.register_forward_hook(lambda m, i, o: o.clone())
            try:
                diff = _max_diff(model(x), ref)
            finally:
                handle.remove()
            _require(diff == 0.0, f"{name}: overwriting with its own value changed logits")
    p = 9
    # A random direction: a constant shift would vanish under a LayerNorm.
    direction = torch.randn(D_MODEL, generator=torch.Generator().manual_seed(4))

    def bump(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        output = output.clone()
        output[:, p] += direction
        return output

    for layer in range(2):
        site = get_site(model, f"layers.{layer}.mixer.input")
        with torch.no_grad():
            handle = site.register_forward_hook(bump)
            try:
                out = model(x)
            finally:
                handle.remove()
        before = _max_diff(out[:, :p], ref[:, :p])
        _require(before == 0.0, f"{site.name}: a patch at t={p} changed outputs before it")
        _require(_max_diff(out[:, p], ref[:, p]) > 1e-5, f"{site.name}: a patch had no effect")
    return "self-patches are no-ops; a patch at t acts from t on"


def check_interchange(arch: str, options: Mapping[str, Any] | None = None) -> str:
    from mecheval.interventions.engine import interchange, naive_interchange
    from mecheval.tasks import ARConfig, build_datasets, corrupt, vocab_size

    task = ARConfig(kind="ar", n_keys=8, n_values=8, n_pairs=3, n_train=0, n_dev=6, n_test=0)
    assert vocab_size(task) <= VOCAB
    model = make_model(arch, options)
    original = build_datasets(task)["dev"].batch(torch.arange(6))
    corrupted = corrupt(original, task, seed=3)
    # Layer 0's sites cover every way the engine restarts (block boundary, inside a block,
    # inside the mixer); the naive loop is too slow to run on every site of every layer.
    sites = [n for n in site_names(model) if n.startswith("layers.0.")] + ["final_norm.input"]
    fast = interchange(model, original, corrupted, sites=sites).table
    slow = naive_interchange(model, original, corrupted, sites=sites).table
    keys = ["condition", "site", "role", "metric"]
    merged = fast.merge(slow, on=keys, suffixes=("_fast", "_slow"), how="outer")
    _require(len(merged) == len(fast) == len(slow), "the two engines report different rows")
    diff = (merged["value_fast"] - merged["value_slow"]).abs().max()
    _require(bool(diff < 1e-5), f"batched and naive interchange differ by {diff:.2e}")
    return f"batched engine = naive loop over {len(fast)} values ({diff:.1e})"


CHECKS: dict[str, Callable[[str, Mapping[str, Any] | None], str]] = {
    "shapes": check_shapes,
    "causality": check_causality,
    "batch-independence": check_batch_independence,
    "query-logits": check_query_logits,
    "gradients": check_gradients,
    "sites": check_sites,
    "site-patching": check_site_patching,
    "interchange": check_interchange,
}


def run_checks(arch: str, options: Mapping[str, Any] | None = None) -> list[CheckResult]:
    """Run every check on ``arch``; a check that raises anything fails with that reason."""
    # An unknown name or a bad option is a usage error, not a failed check.
    parse_options(arch, dict(options or {}))
    results = []
    for name, check in CHECKS.items():
        start = time.perf_counter()
        try:
            detail, passed = check(arch, options), True
        except Exception as err:  # a crash inside a plugin mixer is a failed check too
            detail, passed = f"{type(err).__name__}: {err}", False
        results.append(CheckResult(name, passed, detail, time.perf_counter() - start))
    return results
