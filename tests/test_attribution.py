"""Attribution patching (interventions/attribution.py) against independent forms of the same
numbers: a finite difference of the patched forward (through ``patch`` at module sites, the
exact engine's resumed block at state sites), exactness on a model that is linear in every
activation, integrated gradients' completeness at the embeddings, and a mixer without
gradients refused in one line."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from mecheval.interventions import interchange
from mecheval.interventions.attribution import (
    METHODS,
    NoGradientError,
    answer_probability,
    attribution_patching,
    estimate_cells,
    likelihood_of_log,
    log_answer_probability,
    path_points,
)
from mecheval.interventions.patch import patch, record
from mecheval.interventions.prefix import prefix_cache, run_from
from mecheval.interventions.result import prepare
from mecheval.models import ModelConfig, build_model, registry
from mecheval.models.mixers.base import Mixer
from mecheval.models.registry import BUILTIN_ARCHITECTURES, architecture
from mecheval.models.sites import layer_site, site_names, state_site_names
from mecheval.tasks import ARConfig, build_datasets, corrupt

TASK = ARConfig(kind="ar", n_keys=8, n_values=8, n_pairs=3, n_train=0, n_dev=6, n_test=0)
ROLES = ["key", "value", "query"]
#: The built-in architectures with a recurrent-state site.
WITH_STATES = [
    "based",
    "deltanet",
    "gated_deltanet",
    "gla",
    "hawk",
    "mamba",
    "mamba2",
    "mamba3",
]


def model_for(arch: str, n_layers: int = 2):
    torch.manual_seed(0)
    cfg = ModelConfig(
        architecture=arch, d_model=16, n_layers=n_layers, vocab_size=TASK.vocab_size(), max_len=16
    )
    return build_model(cfg).double().eval()


def pair(model):
    original = build_datasets(TASK)["dev"].batch(torch.arange(6))
    corrupted = corrupt(original, TASK, seed=3)
    _, _, original, corrupted = prepare(model, original, corrupted, None, ROLES)
    return original, corrupted


def patched_readout(model, corrupted, site, dst, value, readout, answer=None):
    """The readout of ``answer`` (the corrupted documents' own where None) with ``site``
    patched at ``dst``."""
    answer = corrupted.answer if answer is None else answer
    with torch.no_grad(), patch(model, site, dst, value):
        return readout(model(corrupted.tokens, at=corrupted.query), answer)


def restore_slopes(model, original, corrupted, site, readout, eps=1e-5):
    """Per role, the central finite difference of ``readout`` (of the original's answer) as
    ``site`` at the role's position moves from the corrupted run's activation towards the
    original's: the derivative a first-order estimate takes."""
    with torch.no_grad(), record(model, [site]) as runs:
        model(original.tokens, at=original.query)
        a_orig = runs[site]
        model(corrupted.tokens, at=corrupted.query)
        a_corr = runs[site]
    docs, slopes = torch.arange(len(original)), {}
    for role in ROLES:
        dst = corrupted.roles[role]
        diff = a_orig[docs, original.roles[role]] - a_corr[docs, dst]
        ends = [
            patched_readout(
                model, corrupted, site, dst, a_corr[docs, dst] + e * diff, readout,
                original.answer,
            )
            for e in (eps, -eps)
        ]  # fmt: skip
        slopes[role] = (ends[0] - ends[1]) / (2 * eps)
    return slopes


def state_readout(model, layer, original, corrupted, role, mix, readout):
    """The readout with block ``layer``'s state after each document's ``role`` position set
    to the corrupted one's + ``mix`` x (original's - corrupted's): the exact engine's route
    (the block resumed with ``replace``, the blocks after it from the prefix)."""
    n = len(original)
    docs = torch.arange(n)
    with torch.no_grad(), record(model, [layer_site(j, "input") for j in range(2)]) as runs:
        model(original.tokens, at=original.query)
        h_orig = model.layers[layer].mixer.prefix(
            model.layers[layer].mixer_norm(runs[layer_site(layer, "input")])
        )
        model(corrupted.tokens, at=corrupted.query)
        prefix = prefix_cache(model, [runs[layer_site(j, "input")] for j in range(2)])
    block = model.layers[layer]
    h_corr = block.mixer.prefix(block.mixer_norm(prefix.inputs[layer]))
    src, dst = original.roles[role], corrupted.roles[role]
    out = torch.empty(n, dtype=torch.float64)
    with torch.no_grad():
        for b in range(n):
            start = int(dst[b])
            one = docs[b : b + 1]
            o, c = h_orig.after(one, src[b]), h_corr.after(one, start)
            if isinstance(o, tuple):
                state = tuple(ci + mix * (oi - ci) for oi, ci in zip(o, c, strict=True))
            else:
                state = c + mix * (o - c)
            if start > int(corrupted.query[b]):
                logits = model(corrupted.tokens[one], at=corrupted.query[one])
            else:
                x = block.forward_from(prefix.inputs[layer][one], start, state, replace=True)
                logits = run_from(model, prefix, layer + 1, one, start, x, corrupted.query[one])
            out[b] = readout(logits, corrupted.answer[one])[0]
    return out


@pytest.mark.parametrize("arch", BUILTIN_ARCHITECTURES)
def test_the_estimate_is_the_derivative_of_the_patched_forward_at_every_module_site(arch):
    model = model_for(arch)
    original, corrupted = pair(model)
    sites = site_names(model)
    estimates = estimate_cells(model, original, corrupted, sites, ROLES, [0.0])
    eps = 1e-5
    checked = 0
    for site in sites:
        with torch.no_grad(), record(model, [site]) as runs:
            model(original.tokens, at=original.query)
            a_orig = runs[site]
            model(corrupted.tokens, at=corrupted.query)
            a_corr = runs[site]
        docs = torch.arange(len(original))
        for role in ROLES:
            src, dst = original.roles[role], corrupted.roles[role]
            diff = a_orig[docs, src] - a_corr[docs, dst]
            up = patched_readout(
                model, corrupted, site, dst, a_corr[docs, dst] + eps * diff, answer_probability
            )
            down = patched_readout(
                model, corrupted, site, dst, a_corr[docs, dst] - eps * diff, answer_probability
            )
            slope = (up - down) / (2 * eps)
            change = estimates.cells[(site, role)] - estimates.base
            torch.testing.assert_close(change, slope, rtol=1e-5, atol=1e-9)
            checked += int((slope.abs() > 1e-9).sum())
    assert checked > 20  # the check saw real slopes, not zeros alone


def test_the_estimate_differentiates_the_original_answer_where_the_corruption_changes_it():
    """A counterfactual whose answer differs: the estimate's base is the corrupted run's
    likelihood of the original's answer, as the exact engine scores it, and each cell moves
    from there as that likelihood does (not the corrupted answer's)."""
    model = model_for("attention")
    original, corrupted = pair(model)
    moved = dataclasses.replace(corrupted, answer=original.answer.roll(1))
    assert not torch.equal(moved.answer, original.answer)
    site = layer_site(1, "input")
    estimates = estimate_cells(model, original, moved, [site], ROLES, [0.0])
    with torch.no_grad():
        logits = model(moved.tokens, at=moved.query)
    torch.testing.assert_close(estimates.base, answer_probability(logits, original.answer))
    slopes = restore_slopes(model, original, moved, site, answer_probability)
    for role, slope in slopes.items():
        change = estimates.cells[(site, role)] - estimates.base
        torch.testing.assert_close(change, slope, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("arch", WITH_STATES)
def test_the_estimate_at_a_state_site_is_the_derivative_of_the_state_restore(arch):
    model = model_for(arch)
    original, corrupted = pair(model)
    site = state_site_names(model)[0]
    layer = int(site.split(".")[1])
    estimates = estimate_cells(model, original, corrupted, [site], ROLES, [0.0])
    eps = 1e-5
    slopes = []
    for role in ROLES:
        up = state_readout(model, layer, original, corrupted, role, eps, answer_probability)
        down = state_readout(model, layer, original, corrupted, role, -eps, answer_probability)
        slope = (up - down) / (2 * eps)
        change = estimates.cells[(site, role)] - estimates.base
        torch.testing.assert_close(change, slope, rtol=1e-5, atol=1e-9)
        slopes.append(slope)
    assert torch.cat(slopes).abs().max() > 1e-6


@pytest.mark.parametrize("arch", ["attention", "mamba", "deltanet"])
def test_attribution_log_is_the_derivative_of_the_log_likelihood_mapped_back(arch):
    """``attribution-log``: each cell moves log p(answer) by its derivative along the patch
    (a central finite difference of the patched forward), and the table reports
    exp(min(log p(corrupted) + that step, 0)) per document, averaged."""
    model = model_for(arch)
    original, corrupted = pair(model)
    site = layer_site(1, "input")
    with torch.no_grad():
        base = log_answer_probability(model(corrupted.tokens, at=corrupted.query), original.answer)
    table = attribution_patching(model, original, corrupted, [site], ROLES, "attribution-log")
    restored = table.table[(table.table.condition == "restored")].set_index("role")["value"]
    slopes = restore_slopes(model, original, corrupted, site, log_answer_probability)
    for role, slope in slopes.items():
        want = torch.exp(torch.clamp(base + slope, max=0.0)).mean().item()
        assert restored[role] == pytest.approx(want, rel=1e-6, abs=1e-9)


def _dropped_steps(model, original, corrupted, layer, role):
    """Per dropped layer, each document's first-order step of log p(answer) as block
    ``layer``'s input at the role's position moves from the corrupted run's to the
    original's, the gradient taken through a forward written out here with that layer's
    mixer and MLP outputs detached (the skip path kept)."""
    docs, steps = torch.arange(len(original)), []
    site = layer_site(layer, "input")
    with torch.no_grad(), record(model, [site]) as runs:
        model(original.tokens, at=original.query)
        a_orig = runs[site]
    for drop in range(len(model.layers)):
        x = model.embed(corrupted.tokens)
        for j, block in enumerate(model.layers):
            if j == layer:
                x = leaf = x.detach().requires_grad_()
            mixed = block.mixer(block.mixer_norm(x))
            x = x + (mixed.detach() if j == drop else mixed)
            if block.mlp is not None:
                fed = block.mlp(block.mlp_norm(x))
                x = x + (fed.detach() if j == drop else fed)
        logits = model.head(x, corrupted.query)
        total = log_answer_probability(logits, original.answer).sum()
        (g,) = torch.autograd.grad(total, leaf)
        src, dst = original.roles[role], corrupted.roles[role]
        diff = a_orig[docs, src] - leaf.detach()[docs, dst]
        steps.append((diff * g[docs, dst]).sum(-1))
    return steps


@pytest.mark.parametrize("arch", ["attention", "mamba", "deltanet"])
@pytest.mark.parametrize("layer", [0, 1])
def test_grad_drop_is_the_mean_magnitude_of_the_steps_with_each_layer_dropped(arch, layer):
    """``attribution-gd`` at a block's input: per document, log p(corrupted) + sum over the
    layers of |the step with that layer's contributions' gradient dropped| / (L - 1), mapped
    back as ``attribution-log``'s (a forward written out in the test drops them)."""
    model = model_for(arch)
    original, corrupted = pair(model)
    with torch.no_grad():
        base = log_answer_probability(model(corrupted.tokens, at=corrupted.query), original.answer)
    site = layer_site(layer, "input")
    table = attribution_patching(model, original, corrupted, [site], ROLES, "attribution-gd")
    restored = table.table[(table.table.condition == "restored")].set_index("role")["value"]
    differs = []
    for role in ROLES:
        steps = _dropped_steps(model, original, corrupted, layer, role)
        if layer == 1:  # layer 0 lies before the site: dropping it changes nothing
            slope = restore_slopes(model, original, corrupted, site, log_answer_probability)
            torch.testing.assert_close(steps[0], slope[role], rtol=1e-5, atol=1e-8)
        differs.append(not torch.allclose(steps[0], steps[1]))
        step = sum(s.abs() for s in steps) / (len(steps) - 1)
        want = torch.exp(torch.clamp(base + step, max=0.0)).mean().item()
        assert restored[role] == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert any(differs)  # (at the embeddings only the corrupted token's position moves)


@pytest.mark.parametrize("site", ["layers.0.input", "layers.0.mixer.state"])
def test_grad_drop_with_one_layer_is_the_magnitude_of_the_step(site):
    """With one layer nothing else can be dropped: ``attribution-gd`` is log p(corrupted)
    + |attribution-log's step|, mapped back; at a state site too."""
    model = model_for("mamba", n_layers=1)
    original, corrupted = pair(model)
    log = attribution_patching(model, original, corrupted, [site], ROLES, "attribution-log")
    gd = attribution_patching(model, original, corrupted, [site], ROLES, "attribution-gd")
    base = estimate_cells(model, original, corrupted, [site], ROLES, [0.0], log_answer_probability)
    for role in ROLES:
        step = base.cells[(site, role)] - base.base
        want = likelihood_of_log(base.base + step.abs()).mean().item()
        got = gd.table[(gd.table.condition == "restored") & (gd.table.role == role)]
        assert got.value.item() == pytest.approx(want, rel=1e-12)
        if (step < 0).any():  # where a step lowers the likelihood, the magnitude raises it
            plain = log.table[(log.table.condition == "restored") & (log.table.role == role)]
            assert got.value.item() > plain.value.item()


def test_a_state_site_has_no_step_with_its_own_layer_dropped():
    """A recurrent state reaches the readout only through its own layer's mixer: with that
    layer's gradient dropped its step is 0, so in a two-layer model ``attribution-gd`` at
    layer 0's state is |the step with layer 1 dropped| / 1."""
    from mecheval.interventions.attribution import _gradient_dropped

    model = model_for("mamba")
    original, corrupted = pair(model)
    site = "layers.0.mixer.state"
    steps = []
    for layer in (0, 1):
        with _gradient_dropped(model.layers[layer]):
            cells = estimate_cells(
                model, original, corrupted, [site], ROLES, [0.0], log_answer_probability
            )
        steps.append({role: cells.cells[(site, role)] - cells.base for role in ROLES})
    gd = attribution_patching(model, original, corrupted, [site], ROLES, "attribution-gd")
    for role in ROLES:
        assert torch.count_nonzero(steps[0][role]) == 0
        assert torch.count_nonzero(steps[1][role]) > 0
        want = likelihood_of_log(cells.base + steps[1][role].abs()).mean().item()
        got = gd.table[(gd.table.condition == "restored") & (gd.table.role == role)]
        assert got.value.item() == pytest.approx(want, rel=1e-12)


def test_an_explicit_attention_pattern_gives_the_fused_attentions_output():
    """``probabilities`` + ``attend`` (the pattern as a tensor of its own) against the mixer's
    own forward (PyTorch's fused scaled-dot-product attention), two heads."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        architecture="attention", d_model=16, n_layers=1, vocab_size=20, max_len=8,
        mixer={"num_heads": 2},
    )  # fmt: skip
    mixer = build_model(cfg).double().layers[0].mixer
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    with torch.no_grad():
        pattern = mixer.probabilities(x)
        explicit, fused = mixer.attend(x, pattern), mixer.mix(x)
    assert pattern.shape == (3, 2, 7, 7)
    assert torch.allclose(pattern.sum(-1), torch.ones(3, 2, 7, dtype=torch.float64))
    assert float(pattern.triu(1).abs().max()) == 0.0  # causal
    assert torch.allclose(explicit, fused, rtol=1e-10, atol=1e-12)


def _held_pattern_readout(model, corrupted, site, layer, dst, value, pattern, answer):
    """The readout with ``site`` patched to ``value`` at ``dst`` while attention layer
    ``layer`` mixes with ``pattern`` whatever its input."""
    mixer = model.layers[layer].mixer
    mixer.mix = lambda x: mixer.attend(x, pattern)
    try:
        with torch.no_grad(), patch(model, site, dst, value):
            return log_answer_probability(model(corrupted.tokens, at=corrupted.query), answer)
    finally:
        del mixer.mix


@pytest.mark.parametrize("layer", [0, 1])
def test_attribution_qk_takes_the_pattern_exactly_and_the_rest_to_first_order(layer):
    """``attribution-qk`` at an attention layer's input: per document, the log-likelihood of
    the corrupted run plus the derivative (a central finite difference) along the path on
    which the site moves from the corrupted activation to the original's with the layer's
    pattern held, while the pattern moves from the corrupted one to the one recomputed with
    the site restored, mapped back as ``attribution-log``'s; at a site that feeds no
    attention layer first, ``attribution-log``'s estimate."""
    model = model_for("attention")
    original, corrupted = pair(model)
    site, block = layer_site(layer, "input"), model.layers[layer]
    table = attribution_patching(
        model, original, corrupted, [site, "final_norm.input"], ROLES, "attribution-qk"
    )
    restored = table.table[table.table.condition == "restored"].set_index(["site", "role"])
    with torch.no_grad(), record(model, [site]) as runs:
        model(original.tokens, at=original.query)
        a_orig = runs[site]
        model(corrupted.tokens, at=corrupted.query)
        a_corr = runs[site]
        logits = model(corrupted.tokens, at=corrupted.query)
        base = log_answer_probability(logits, original.answer)
        pattern = block.mixer.probabilities(block.mixer_norm(a_corr))
    docs, eps = torch.arange(len(original)), 1e-5
    for role in ROLES:
        dst = corrupted.roles[role]
        diff = a_orig[docs, original.roles[role]] - a_corr[docs, dst]
        restored_input = a_corr.clone()
        restored_input[docs, dst] = a_orig[docs, original.roles[role]]
        with torch.no_grad():
            moved = block.mixer.probabilities(block.mixer_norm(restored_input)) - pattern
        ends = [
            _held_pattern_readout(
                model, corrupted, site, layer, dst, a_corr[docs, dst] + e * diff,
                pattern + e * moved, original.answer,
            )
            for e in (eps, -eps)
        ]  # fmt: skip
        want = likelihood_of_log(base + (ends[0] - ends[1]) / (2 * eps)).mean().item()
        assert restored.loc[(site, role), "value"] == pytest.approx(want, rel=1e-6, abs=1e-9)
    sites = ["final_norm.input"]
    plain = attribution_patching(model, original, corrupted, sites, ROLES, "attribution-log")
    plain_rows = plain.table[plain.table.condition == "restored"].set_index("role")["value"]
    for role in ROLES:
        assert restored.loc[("final_norm.input", role), "value"] == plain_rows[role]


def test_likelihood_of_log_maps_back_and_caps_at_one():
    estimate = torch.tensor([-math.inf, math.log(0.25), 0.0, 2.0], dtype=torch.float64)
    assert likelihood_of_log(estimate).tolist() == [0.0, 0.25, 1.0, 1.0]


# ------------------------------------------------------------------- a model linear in everything
class LinearOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LinearRecurrence(Mixer):
    """h_t = lam * h_{t-1} + W x_t, y_t = U h_t: linear, with a recurrent state site."""

    carries = "state"

    def __init__(self, d_model: int, options: LinearOptions) -> None:
        super().__init__()
        self.w = nn.Linear(d_model, d_model, bias=False)
        self.u = nn.Linear(d_model, d_model, bias=False)
        self.lam = nn.Parameter(torch.linspace(0.3, 0.9, d_model))

    def halo(self) -> int | None:
        return 0

    def final_states(self, x: torch.Tensor) -> torch.Tensor:
        drive, h, out = self.w(x), torch.zeros_like(x[:, 0]), []
        for t in range(x.shape[1]):
            h = self.lam * h + drive[:, t]
            out.append(h)
        return torch.stack(out, 1)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.u(self.final_states(x))

    def mix_from(self, x, offset, state, replace=False):
        if state is None:
            return self.mix(x)[:, offset:]
        drive, h, out = self.w(x[:, offset:]), state, []
        for t in range(drive.shape[1]):
            h = h if replace and t == 0 else self.lam * h + drive[:, t]
            out.append(h)
        return self.u(torch.stack(out, 1))


@pytest.fixture
def linear_model():
    """A registered plugin mixer in a model whose norms are identities and without MLPs:
    every logit is linear in every site's activation."""
    before = set(registry.ARCHITECTURES)
    architecture("test-linear", options=LinearOptions, mlp=False)(LinearRecurrence)
    torch.manual_seed(0)
    cfg = ModelConfig(
        architecture="test-linear", d_model=8, n_layers=2, vocab_size=TASK.vocab_size()
    )
    model = build_model(cfg).double().eval()
    for block in model.layers:
        block.mixer_norm = nn.Identity()
    model.final_norm.norm = nn.Identity()
    yield model
    for name in set(registry.ARCHITECTURES) - before:
        del registry.ARCHITECTURES[name]


def answer_logit(logits: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    return logits.gather(-1, answer[:, None])[:, 0]


@pytest.mark.parametrize("method", ["attribution", "integrated-gradients"])
def test_on_a_linear_model_the_estimate_is_exact(linear_model, method):
    model = linear_model
    original, corrupted = pair(model)
    sites = site_names(model) + state_site_names(model)
    assert len(state_site_names(model)) == 2
    estimates = estimate_cells(
        model, original, corrupted, sites, ROLES, path_points(method, 3), readout=answer_logit
    )
    docs = torch.arange(len(original))
    moved = 0
    for site in sites:
        for role in ROLES:
            if site in state_site_names(model):
                layer = int(site.split(".")[1])
                exact = state_readout(model, layer, original, corrupted, role, 1.0, answer_logit)
            else:
                with torch.no_grad(), record(model, [site]) as runs:
                    model(original.tokens, at=original.query)
                value = runs[site][docs, original.roles[role]]
                exact = patched_readout(
                    model, corrupted, site, corrupted.roles[role], value, answer_logit
                )
            torch.testing.assert_close(estimates.cells[(site, role)], exact, rtol=1e-9, atol=1e-9)
            moved += int(((exact - estimates.base).abs() > 1e-6).sum())
    assert moved > 10


def test_integrated_gradients_at_the_embeddings_sum_to_the_whole_change() -> None:
    """Completeness: the corruption changes the key token alone, so restoring layer 0's input
    at the key is the original document; integrated gradients' estimate there tends to the
    original likelihood as its steps grow, where one gradient at the corrupted run misses."""
    model = model_for("mamba")
    original, corrupted = pair(model)
    changed = (original.tokens != corrupted.tokens).nonzero()
    assert torch.equal(changed[:, 1], corrupted.roles["key"])
    site = layer_site(0, "input")
    with torch.no_grad():
        target = answer_probability(model(original.tokens, at=original.query), original.answer)

    def error(method: str, steps: int) -> float:
        points = path_points(method, steps)
        estimates = estimate_cells(model, original, corrupted, [site], ["key"], points)
        return float((estimates.cells[(site, "key")] - target).abs().max())

    assert error("integrated-gradients", 64) < 1e-4
    assert error("integrated-gradients", 64) < error("integrated-gradients", 2)
    assert error("attribution", 1) > 10 * error("integrated-gradients", 64)


def test_the_table_reads_like_the_exact_engines() -> None:
    model = model_for("mamba")
    original, corrupted = pair(model)
    exact = interchange(model, original, corrupted, roles=ROLES)
    estimated = attribution_patching(model, original, corrupted, roles=ROLES)
    base = exact.table[exact.table.condition != "restored"].reset_index(drop=True)
    same = estimated.table[estimated.table.condition != "restored"].reset_index(drop=True)
    assert base.equals(same)
    restored = estimated.table[estimated.table.condition == "restored"]
    assert set(restored.metric) == {"likelihood"}
    table = exact.table
    cells = table[(table.condition == "restored") & (table.metric == "likelihood")]
    assert list(zip(restored.site, restored.role, strict=True)) == list(
        zip(cells.site, cells.role, strict=True)
    )
    assert len(estimated.per_example) == len(original) * len(restored)


class Frozen(Mixer):
    """Computes its mix without autograd: nothing to take a gradient through."""

    def __init__(self, d_model: int, options: LinearOptions) -> None:
        super().__init__()
        self.w = nn.Linear(d_model, d_model)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.w(x).cumsum(1)


def test_a_mixer_without_gradients_is_refused_in_one_line() -> None:
    before = set(registry.ARCHITECTURES)
    try:
        architecture("test-frozen", options=LinearOptions, mlp=False)(Frozen)
        torch.manual_seed(0)
        cfg = ModelConfig(
            architecture="test-frozen", d_model=8, n_layers=1, vocab_size=TASK.vocab_size()
        )
        model = build_model(cfg).eval()
        original, corrupted = pair(model)
        with pytest.raises(NoGradientError) as err:
            attribution_patching(model, original, corrupted, sites=["layers.0.mixer.input"])
        assert "\n" not in str(err.value)
    finally:
        for name in set(registry.ARCHITECTURES) - before:
            del registry.ARCHITECTURES[name]


def test_path_points_and_bad_names() -> None:
    assert path_points("attribution") == [0.0]
    assert path_points("attribution-log") == [0.0]
    assert path_points("integrated-gradients", 4) == [0.125, 0.375, 0.625, 0.875]
    with pytest.raises(ValueError, match="method"):
        path_points("gradients")
    with pytest.raises(ValueError, match="steps"):
        path_points("integrated-gradients", 0)


# ------------------------------------------------------------------------------- grading
def result_with(cells: dict[tuple[str, str], float], original=0.9, corrupted=0.1):
    import pandas as pd

    from mecheval.interventions.result import TABLE_COLUMNS, InterchangeResult

    rows = [
        ("original", "", "", "likelihood", original),
        ("corrupted", "", "", "likelihood", corrupted),
    ]
    rows += [("restored", s, r, "likelihood", v) for (s, r), v in cells.items()]
    return InterchangeResult(pd.DataFrame(rows, columns=TABLE_COLUMNS), pd.DataFrame())


def test_a_grade_reads_correlation_recall_error_and_labels() -> None:
    from mecheval.interventions import grade

    exact = {("a", "key"): 0.1, ("a", "value"): 0.8, ("b", "key"): 0.6, ("b", "query"): 0.2}
    truth = result_with(exact)
    same = grade("attribution", truth, result_with(exact), "induction", "induction")
    assert (same.pearson, same.spearman, same.recall, same.error) == (1.0, 1.0, 1.0, 0.0)
    assert same.k == 2 and same.cells == 4 and same.agrees is True  # 0.8 and 0.6 recover >= 1/2
    # An estimate that ranks the cells backwards: every cell that matters missed.
    backwards = {cell: 1.0 - value for cell, value in exact.items()}
    wrong = grade("attribution", truth, result_with(backwards), "induction", "unclear")
    assert wrong.spearman == pytest.approx(-1.0) and wrong.recall == 0.0
    assert wrong.error == pytest.approx(sum(abs(1 - 2 * v) for v in exact.values()) / 4)
    assert wrong.agrees is False
    # Half the cells that matter found.
    half = dict(exact) | {("b", "key"): 0.05, ("b", "query"): 0.85}
    assert grade("x", truth, result_with(half)).recall == 0.5
    # No range (the corruption moved nothing): no cell matters, no recall to read.
    flat = grade("x", result_with(exact, 0.5, 0.5), result_with(exact))
    assert flat.k == 0 and math.isnan(flat.recall) and flat.agrees is None
    with pytest.raises(ValueError, match="cells"):
        grade("x", truth, result_with({("a", "key"): 0.1}))


def test_a_grades_spearman_is_scipys_and_needs_no_scipy(monkeypatch) -> None:
    """Spearman's rho with tied cells equals scipy's, and grading runs where scipy cannot be
    imported (it is a dev extra only: a plain install has none)."""
    import sys

    from mecheval.interventions import grade

    gen = torch.Generator().manual_seed(0)
    exact = {(f"s{i}", "key"): round(float(torch.rand(1, generator=gen)), 1) for i in range(12)}
    guess = {cell: round(float(torch.rand(1, generator=gen)), 1) for cell in exact}
    assert len(set(exact.values())) < len(exact)  # ties, which rho averages
    stats = pytest.importorskip("scipy.stats")
    expected = stats.spearmanr(list(exact.values()), list(guess.values())).statistic
    for name in [m for m in sys.modules if m == "scipy" or m.startswith("scipy.")]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it now raises ImportError
    with pytest.raises(ImportError):
        from scipy.stats import spearmanr  # noqa: F401
    graded = grade("x", result_with(exact), result_with(guess))
    assert graded.spearman == pytest.approx(expected, abs=1e-12)


def test_intervene_with_a_method_writes_its_table_and_grade(tmp_path, monkeypatch, capsys) -> None:
    import json

    import pandas as pd
    from small_runs import run_cli
    from test_mechanism_labels import hand_built_induction
    from test_mechanisms import run_with_weights

    run_dir = run_with_weights(tmp_path, lambda _: hand_built_induction())
    args = ("intervene", str(run_dir), "--split", "dev", "--method", "integrated-gradients")
    code, out, err = run_cli(monkeypatch, capsys, *args, "--steps", "3")
    assert (code, err) == (0, "")
    assert "estimated by integrated-gradients" in out
    assert "mechanism (exact): induction" in out
    (record,) = json.loads((run_dir / "attribution.json").read_text())
    assert record["method"] == "integrated-gradients" and record["steps"] == 3
    assert record["exact_label"] == "induction" and record["cells"] == 13 * 5
    assert -1 <= record["pearson"] <= 1 and record["seconds"] > 0
    estimates = pd.read_csv(run_dir / "attribution.csv", keep_default_na=False)
    restored = estimates[estimates.condition == "restored"]
    assert set(estimates.source) == {"integrated-gradients"}
    assert len(restored) == record["cells"] and set(restored.metric) == {"likelihood"}
    # The exact table beside it, as a plain `intervene` writes it.
    exact = pd.read_csv(run_dir / "interventions.csv", keep_default_na=False)
    assert set(exact.metric) > {"likelihood"}


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("--method", "gradient"), "--method"),
        (("--method", "attribution", "--metric", "accuracy"), "--metric"),
        (("--method", "integrated-gradients", "--steps", "0"), "--steps"),
    ],
)
def test_bad_method_options_are_one_line_errors(tmp_path, monkeypatch, capsys, args, field):
    from small_runs import run_cli

    code, out, err = run_cli(monkeypatch, capsys, "intervene", str(tmp_path), *args)
    assert code == 2 and out == ""
    assert err.startswith(f"error: {field}") and err.count("\n") == 1


def test_reproduce_attribution_grades_every_run_and_prints_the_table(
    tmp_path, monkeypatch, capsys
) -> None:
    import json

    from small_runs import run_cli

    from mecheval.experiments.store import grading_records

    args = ("reproduce", "attribution", "--preset", "tiny", "--archs", "mamba,attention")
    code, out, err = run_cli(monkeypatch, capsys, *args, "--out", str(tmp_path), "-q")
    assert code == 0, err
    folder = tmp_path / "attribution-tiny"
    records = grading_records(folder)
    assert sorted(zip(records.run, records.method, strict=True)) == [
        (run, method) for run in ("attention", "mamba") for method in sorted(METHODS)
    ]
    for run in ("mamba", "attention"):
        label = json.loads((folder / run / "mechanism.json").read_text())["label"]
        assert set(records[records.run == run].exact_label) == {label}
    table = out[out.index("## attribution-grading: ") : out.index("Per run")]
    runs = [line.split("|")[1:3] for line in table.splitlines() if line.startswith("| ")][1:]
    # The registry's order of architectures, then METHODS' order.
    assert [(run.strip(), method.strip()) for run, method in runs] == [
        (run, method) for run in ("mamba", "attention") for method in METHODS
    ]
    assert METHODS == (
        "attribution",
        "integrated-gradients",
        "attribution-log",
        "attribution-qk",
        "attribution-gd",
    )
    assert (folder / "report" / "attribution-grading.png").exists()
    # The estimates in the results table, beside the exact restores, named by their source.
    from mecheval.experiments.store import load_results
    from mecheval.training import read_status

    results = load_results(folder)
    restored = results[(results.condition == "restored") & (results.metric == "likelihood")]
    by_source = restored.groupby("source").size()
    assert set(by_source.index) == {"mechanistic", *METHODS}
    assert by_source["attribution"] == by_source["integrated-gradients"] > 0
    assert by_source["attribution-log"] == by_source["attribution"]
    # And each grade, as rows of condition "graded", at the step of its estimates.
    graded = results[results.condition == "graded"]
    assert set(graded.source) == set(METHODS)
    for grade in records.itertuples():
        mine = graded[(graded.run == grade.run) & (graded.source == grade.method)]
        values = dict(zip(mine.metric, mine.value, strict=True))
        assert values["pearson"] == grade.pearson and values["recall"] == grade.recall
        assert values["seconds"] == grade.seconds
        assert values["agrees"] == float(grade.agrees)
        steps = results[(results.run == grade.run) & (results.source == grade.method)].step
        assert set(steps) == {int(read_status(folder / grade.run)["step"])}


def test_the_summary_counts_agreement_where_a_restore_decides_the_label() -> None:
    import pandas as pd

    from mecheval.report.grading import summary_lines

    records = pd.DataFrame(
        [
            ("a", "attribution", "induction", "induction", True, 0.9),
            ("a", "integrated-gradients", "induction", "unclear", False, 0.8),
            ("b", "attribution", "unclear", "induction", False, 0.5),
            ("b", "integrated-gradients", "unclear", "unclear", True, 0.7),
            # Read from the original rows, which an estimate keeps exact: not counted.
            ("c", "attribution", "not learned", "not learned", True, 0.1),
            ("c", "integrated-gradients", "not learned", "not learned", True, 0.2),
        ],
        columns=["run", "method", "exact_label", "label", "agrees", "pearson"],
    )
    lines = summary_lines(records)
    assert lines[-1].endswith("attribution 1 of 2; integrated-gradients 1 of 2.")
    assert "| a | induction | induction (same), r 0.90 | unclear (differs), r 0.80 |" in lines


def _with_documents(original: list[float], corrupted: list[float]):
    """A one-cell exact result whose per-document original and corrupted likelihoods are
    the ones given."""
    import pandas as pd

    from mecheval.interventions.result import InterchangeResult

    truth = result_with(
        {("a", "key"): 0.5}, sum(original) / len(original), sum(corrupted) / len(corrupted)
    )
    rows = pd.DataFrame(
        {
            "doc": range(len(original)),
            "site": "a",
            "role": "key",
            "restored": 0.5,
            "original": original,
            "corrupted": corrupted,
        }
    )
    return InterchangeResult(truth.table, rows)


def test_a_corruption_inside_its_noise_leaves_nothing_to_grade() -> None:
    """Where the mean original - corrupted likelihood has a 95 % interval over the documents
    that holds 0, the grade says so (and the summary does not count it); a clear effect is
    graded."""
    import pandas as pd

    from mecheval.cli.intervene import grade_text
    from mecheval.interventions import grade
    from mecheval.report.grading import grading_markdown, summary_lines

    noise = [0.02 * ((-1) ** i) * (1 + i % 3) for i in range(40)]
    flat = _with_documents([0.5 + n for n in noise], [0.5 - n for n in noise])
    clear = _with_documents([0.9 + n for n in noise], [0.1 - n for n in noise])
    estimate = result_with({("a", "key"): 0.4})
    still = grade("attribution", flat, estimate, "unclear", "unclear")
    moved = grade("attribution", clear, estimate, "induction", "unclear")
    assert still.effect_low <= 0.0 <= still.effect_high and not still.gradable
    assert 0.7 < moved.effect_low <= moved.effect <= moved.effect_high < 0.9 and moved.gradable
    record = {**dataclasses.asdict(still), "agrees": still.agrees, "gradable": still.gradable,
              "seconds": 1.0, "exact_seconds": 2.0}  # fmt: skip
    assert "nothing to grade: the corruption moves the answer's likelihood by" in grade_text(record)
    assert "Pearson" not in grade_text(record)
    moved_record = {**record, **dataclasses.asdict(moved), "gradable": True, "agrees": False}
    assert "Pearson r" in grade_text(moved_record)
    records = pd.DataFrame([{**record, "run": "a"}, {**moved_record, "run": "b"}])
    table = grading_markdown(records)
    assert "| a | attribution | unclear | unclear | nothing to grade | - |" in table
    assert summary_lines(records)[-1].endswith("attribution 0 of 1 (1 with nothing to grade).")
