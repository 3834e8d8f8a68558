"""The contract every architecture must meet, as checks runnable on any registered mixer.

``mecheval check-mixer NAME`` runs them on a built-in or a plugin architecture, and the test
suite runs them on every registered one (tests/test_models.py). It uses models, tasks and
interventions together, so it sits above all three, beside experiments. Each check builds small
models itself and raises :class:`CheckFailed` with a one-line reason. What they guard:

* ``shapes``: every mixer maps [B, T, d] to [B, T, d] (checked at the mixer, before the
  residual add can broadcast or crash) and the logits are [B, T, V] and finite, for T = 1
  and T = 45 too (an overflow that grows with t shows there);
* ``causality``: the output at t never depends on tokens after t (float64, so that round-off
  cannot hide a small leak), with and without position embeddings;
* ``batch-independence``: a document's output does not depend on the others in its batch
  (the intervention engine stacks unrelated rows in one batch);
* ``query-logits``: ``model(tokens, at=q)`` equals the full logits at q, and so do the logits
  of the same batch cut after q: the engine reads each document at its query in a batch
  padded to the longest, so not even the length of what follows may matter. (``at`` never
  reaches a mixer: only the length half can be broken by a mixer alone);
* ``gradients``: every parameter gets a finite, non-zero gradient (no dead parameter), except
  those marked inert (:func:`~mecheval.models.mixers.base.mark_inert`), whose gradient is 0;
* ``sites``: the backbone sites exist, every site fires once per forward with a
  [B, T, C] tensor and is reachable by its dotted name, and no Site fires that is not a
  submodule of the model (one made in the forward could not be read or patched);
* ``site-patching``: overwriting any site with its own value changes nothing (no computation
  goes around a site or through an alias of it); patching the mixer input at position p
  changes outputs from p on and nothing before p;
* ``resume``: each mixer resumed at every position from its own prefix states gives its full
  forward's outputs from there (the engine runs patched rows so); the ``Mixer`` defaults,
  which recompute the window, pass by construction;
* ``interchange``: the batched intervention engine equals the naive one-forward-per-patch
  loop on this architecture (layer 0's sites and final_norm.input, every role), per document
  and in the table, to ENGINE_RTOL relative; and both do what a restore must: restoring the
  key at ``layers.0.input`` gives the original run, restoring any other role there, or any
  site right after the query, gives the corrupted run. The model is built at
  SIGNAL_INIT_STD in float64 and must move p(answer) by over SIGNAL_MARGIN * ENGINE_RTOL when
  the key is corrupted: at the default init no restore moves the mean p(answer) by more than
  4e-9..4e-6 on 5 of the 7 built-in architectures, and an engine that restored nothing passed.

tests/test_contract_breakers.py shows each check failing, on a mixer that breaks what it
guards (query-logits: also on a head that picks the wrong positions; interchange: on engines
that restore nothing, everything, or apply no patch hook).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mecheval.interventions import engine
from mecheval.models.backbone import LanguageModel, build_model
from mecheval.models.config import ModelConfig
from mecheval.models.mixers.base import Mixer, is_inert
from mecheval.models.registry import get_architecture, parse_options
from mecheval.models.sites import Site, get_site, iter_sites, site_names
from mecheval.tasks import ROLES, ARConfig, Batch, build_datasets, corrupt
from mecheval.tasks.scores import answer_scores

VOCAB = 23
MAX_LEN = 48
D_MODEL = 16
#: init_std of the models whose checks need every patch to matter
SIGNAL_INIT_STD = 0.5
#: documents of the interchange check
N_DOCS = 6
#: Relative tolerance of the interchange check, between the batched and the naive engine and
#: between a restore and the run it must equal. Both run the same float64 model and score it in
#: float64 (tasks/scores.py); what differs is the order of operations in the model's layers
#: (a batch of patched rows against one document), far below this.
ENGINE_RTOL = 1e-6
#: Corrupting the key must move p(answer) by more than SIGNAL_MARGIN * ENGINE_RTOL in some
#: document, or the check could not tell an engine that restores from one that does nothing.
SIGNAL_MARGIN = 1000


def likelihood(logits: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    return answer_scores(logits, answer, ["likelihood"])["likelihood"]


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

    mixers = {m: n for n, m in model.named_modules() if isinstance(m, Mixer)}

    def same_shape(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
        # Checked here, before the residual add turns a wrong shape into a broadcast or a crash.
        seen, given = tuple(output.shape), tuple(inputs[0].shape)
        _require(seen == given, f"{mixers[module]}: output {seen} for input {given}")

    handles = [m.register_forward_hook(same_shape) for m in mixers]
    try:
        for b, t in [(1, 1), (3, 7), (2, 45)]:
            with torch.no_grad():
                out = model(random_tokens(b, t))
            _require(out.shape == (b, t, VOCAB), f"B={b} T={t}: logits {tuple(out.shape)}")
            _require(bool(torch.isfinite(out).all()), f"B={b} T={t}: non-finite logits")
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
    diff = _max_diff(picked, full[rows, at])
    _require(diff < 1e-10, f"model(tokens, at=q) differs from the full logits at q by {diff:.2e}")
    cut = _max_diff(prefix, full[rows, at])
    _require(
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
    # Every module call, to catch a Site that fires but is not listed (made in the forward, or
    # kept outside the module tree): it could be neither read nor patched by name.
    listed = {id(site) for _, site in iter_sites(model)}
    paths = {id(module): name for name, module in model.named_modules()}
    inside: list[str] = []
    stray: list[str] = []

    def enter(module: torch.nn.Module, inputs: Any) -> None:
        if id(module) in paths:
            inside.append(paths[id(module)])

    def leave(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if isinstance(module, Site) and id(module) not in listed:
            stray.append(inside[-1] if inside else "the model")
        if id(module) in paths:
            inside.pop()

    handles += [
        torch.nn.modules.module.register_module_forward_pre_hook(enter),
        torch.nn.modules.module.register_module_forward_hook(leave),
    ]
    try:
        with torch.no_grad():
            model(random_tokens(3, 11), at=torch.tensor([10, 10, 10]))
    finally:
        for handle in handles:
            handle.remove()
    _require(
        not stray,
        f"an unlisted Site fired inside {stray[0] if stray else ''}: a site must be a submodule "
        "when the model is built, or it cannot be read or patched by name",
    )
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


def check_resume(arch: str, options: Mapping[str, Any] | None = None) -> str:
    """Every mixer resumed at every cut p from its own prefix states (``Mixer.prefix_states``,
    ``state_at``, ``forward_from``) gives its full forward's outputs at p.. (float64); with a
    recurrent state, replacing the state after p by itself changes nothing either."""
    model = make_model(arch, options, short_conv=None).double()
    x = torch.randn(3, 11, D_MODEL, generator=torch.Generator().manual_seed(5), dtype=torch.double)
    rows = torch.tensor([2, 0])
    worst, kinds = 0.0, set()
    with torch.no_grad():
        for i, mixer in enumerate(layer.mixer for layer in model.layers):
            full = mixer(x)
            halo = mixer.halo()
            states = None if halo is None else mixer.states_of(x)
            kinds.add("recomputes its window" if halo is None else f"resumes (halo {halo})")
            for start in range(x.shape[1]):
                lo = 0 if halo is None else max(0, start - halo)
                state = None if halo is None else mixer.state_at(states, rows, start)
                got = mixer.forward_from(x[rows, lo:], start - lo, state)
                diff = _max_diff(got, full[rows, start:])
                _require(diff < 1e-10, f"layers.{i}.mixer resumed at {start} differs by {diff:.2e}")
                worst = max(worst, diff)
                if getattr(mixer, "has_recurrent_state", False):
                    after = mixer.state_at(states, rows, start + 1)
                    got = mixer.forward_from(x[rows, lo:], start - lo, after, replace=True)
                    diff = _max_diff(got, full[rows, start:])
                    _require(
                        diff < 1e-10,
                        f"layers.{i}.mixer: its own state after {start} put back differs by "
                        f"{diff:.2e}",
                    )
    return f"{', '.join(sorted(kinds))}: within {worst:.1e} of the full forward (float64)"


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


def _close(a: Any, b: Any) -> Any:
    """|a - b| <= ENGINE_RTOL * max(|a|, |b|), elementwise (floats, arrays or Series)."""
    return abs(a - b) <= ENGINE_RTOL * np.maximum(abs(a), abs(b))


def check_interchange(arch: str, options: Mapping[str, Any] | None = None) -> str:

    task = ARConfig(kind="ar", n_keys=8, n_values=8, n_pairs=3, n_train=0, n_dev=N_DOCS, n_test=0)
    assert task.vocab_size() <= VOCAB
    # Large init and float64, so that every patch matters: at init_std 0.02 restoring the key
    # moves the mean p(answer) by 4e-9..4e-6 on 5 of the 7 built-in architectures, and an
    # engine that restores nothing agrees with the naive loop to within any usable tolerance.
    model = make_model(arch, options, init_std=SIGNAL_INIT_STD).double()
    docs = build_datasets(task)["dev"].batch(torch.arange(N_DOCS))
    # Three more tokens after the query and a role "after" at the first of them: a causal
    # model's p(answer) cannot depend on what is restored there.
    tail = random_tokens(N_DOCS, 3, seed=5) % task.vocab_size()
    original = Batch(
        torch.cat([docs.tokens, tail], 1),
        docs.answer,
        {**docs.roles, "after": docs.query + 1},
        docs.lengths,
    )
    corrupted = corrupt(original, task, seed=3)
    roles = [*ROLES, "after"]
    # Layer 0's sites cover every way the engine restarts (block boundary, inside a block,
    # inside the mixer); the naive loop is too slow to run on every site of every layer.
    sites = [n for n in site_names(model) if n.startswith("layers.0.")] + ["final_norm.input"]
    with torch.no_grad():
        p_orig = likelihood(model(original.tokens, at=original.query), docs.answer)
        p_corr = likelihood(model(corrupted.tokens, at=corrupted.query), docs.answer)
    p_orig, p_corr = p_orig.numpy(), p_corr.numpy()
    moved = float((abs(p_orig - p_corr) / np.maximum(p_orig, p_corr)).max())
    _require(
        moved > SIGNAL_MARGIN * ENGINE_RTOL,
        f"corrupting the key moves p(answer) by {moved:.1e} at most (relative): too little "
        "to tell an engine that restores from one that does nothing",
    )

    fast = engine.interchange(model, original, corrupted, sites=sites, roles=roles)
    rows = fast.per_example
    doc = rows["doc"].to_numpy()
    # What each restore must give, whatever the model: at layer 0's input only the key differs
    # between the two runs, so restoring it is the original run and restoring any other role
    # is the corrupted one; and a patch after the query is the corrupted run.
    at_input = rows["site"] == "layers.0.input"
    key = rows["role"] == "key"
    for label, where, want in [
        ("restoring the key at layers.0.input", at_input & key, p_orig),
        ("restoring after the query", rows["role"] == "after", p_corr),
        ("restoring an unchanged token at layers.0.input", at_input & ~key, p_corr),
    ]:
        bad = where & ~_close(rows["restored"], want[doc])
        if bad.any():
            row = rows[bad].iloc[0]
            d = int(row["doc"])
            raise CheckFailed(
                f"{label} ({row['site']}, {row['role']}, document {d}) gave p(answer) "
                f"{row['restored']:.6g}, expected {want[d]:.6g} (original {p_orig[d]:.6g}, "
                f"corrupted {p_corr[d]:.6g})"
            )

    slow = engine.naive_interchange(model, original, corrupted, sites=sites, roles=roles)
    for what, a, b, keys in [
        ("per document", fast.per_example, slow.per_example, ["doc", "site", "role"]),
        ("in the table", fast.table, slow.table, ["condition", "site", "role", "metric"]),
    ]:
        merged = a.merge(b, on=keys, suffixes=("_fast", "_slow"), how="outer")
        _require(len(merged) == len(a) == len(b), f"the two engines report different rows {what}")
        for column in [c for c in a.columns if c not in keys]:
            bad = ~_close(merged[f"{column}_fast"], merged[f"{column}_slow"])
            if bad.any():
                row = merged[bad].iloc[0]
                raise CheckFailed(
                    f"batched and naive interchange differ {what} at "
                    + "/".join(str(row[k]) for k in keys)
                    + f": {column} {row[f'{column}_fast']:.8g} vs {row[f'{column}_slow']:.8g}"
                )
    return (
        f"batched engine = naive loop over {len(rows)} restores (relative {ENGINE_RTOL:.0e}); "
        f"restoring the key undoes a corruption that moves p(answer) by up to {moved:.0%}"
    )


CHECKS: dict[str, Callable[[str, Mapping[str, Any] | None], str]] = {
    "shapes": check_shapes,
    "causality": check_causality,
    "batch-independence": check_batch_independence,
    "query-logits": check_query_logits,
    "gradients": check_gradients,
    "sites": check_sites,
    "site-patching": check_site_patching,
    "resume": check_resume,
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
