"""Resuming from a prefix (interventions/prefix.py, ``Mixer.prefix``): a mixer resumed
at position p from its own prefix states gives the outputs its full forward gives at p..,
and the engine's block-by-block resumption gives the full model's logits, in float64."""

from __future__ import annotations

import pytest
import torch

from mecheval.interventions.patch import record
from mecheval.interventions.prefix import prefix_cache, run_from
from mecheval.models import ARCHITECTURES, ModelConfig, build_model
from mecheval.models.sites import layer_site

#: (architecture, mixer options, short-conv switch): every built-in at its defaults, and
#: the variants that change what a resumed mixer must read before the cut.
CASES = [(arch, {}, None) for arch in sorted(ARCHITECTURES)] + [
    ("mamba", {"d_conv": None}, None),
    ("mamba", {"d_conv": 2}, None),
    ("deltanet", {"conv_size": None}, None),
    ("deltanet", {"num_heads": 2}, None),
    ("based", {"long_conv": True}, None),
    ("gla", {"conv_size": 4}, None),
    ("gated_deltanet", {"conv_size": None}, None),
    ("mamba2", {"d_conv": None}, None),
    ("hawk", {"conv_size": None}, None),  # halo 0: a resumed window starts at the cut
    ("mamba3", {"d_conv": 3}, None),  # no conv by default: with one, a halo of 2
    ("based", {"num_heads": 2, "num_key_value_heads": 2, "conv_kernel_size": 4}, None),
    ("attention", {"num_heads": 2}, 3),
    ("attention", {}, 2),
]
LENGTH = 13


def model_for(arch: str, mixer: dict, short_conv: int | None, n_layers: int = 2):
    torch.manual_seed(0)
    cfg = ModelConfig(
        architecture=arch,
        d_model=16,
        n_layers=n_layers,
        vocab_size=11,
        max_len=LENGTH,
        mixer=mixer,
        short_conv=short_conv,
    )
    return build_model(cfg).double().eval()


def case_id(case) -> str:
    arch, mixer, switch = case
    extra = [f"{k}={v}" for k, v in mixer.items()] + ([f"conv={switch}"] if switch else [])
    return "-".join([arch, *extra])


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_a_resumed_mixer_equals_its_full_forward(case) -> None:
    model = model_for(*case)
    x = torch.randn(3, LENGTH, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    rows = torch.tensor([2, 0])  # a subset, out of order: states are gathered per row
    with torch.no_grad():
        for mixer in (layer.mixer for layer in model.layers):
            full = mixer(x)
            prefix = mixer.prefix(x)
            for start in (0, 1, 2, 4, 7, LENGTH - 1):
                lo = 0 if prefix is None else max(0, start - prefix.halo)
                state = None if prefix is None else prefix.initial_state(rows, start)
                got = mixer.forward_from(x[rows, lo:], start - lo, state)
                torch.testing.assert_close(got, full[rows, start:], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("resume", [True, False], ids=["resumed", "window"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_running_from_any_block_and_position_gives_the_full_logits(case, resume: bool) -> None:
    """Both ways a block can run from a cut: resumed from its prefix states, and (what
    ``Mixer.resume_from_prefix = False`` asks for) its window recomputed from the start."""
    model = model_for(*case, n_layers=3)
    for layer in model.layers:
        layer.mixer.resume_from_prefix = resume
    n_layers = len(model.layers)
    tokens = torch.randint(0, 11, (4, LENGTH), generator=torch.Generator().manual_seed(2))
    at = torch.tensor([LENGTH - 1, 6, 9, LENGTH - 1])
    inputs = [layer_site(j, "input") for j in range(n_layers)]
    with torch.no_grad(), record(model, [*inputs, "final_norm.input"]) as acts:
        expected = model(tokens, at=at)
    cache = prefix_cache(model, [acts[site] for site in inputs])
    if not resume:
        assert cache.prefixes == [None] * n_layers
    docs = torch.arange(4)
    with torch.no_grad():
        for first in range(n_layers + 1):
            entering = acts[inputs[first] if first < n_layers else "final_norm.input"]
            for start in (0, 3, 6):
                got = run_from(model, cache, first, docs, start, entering[:, start:], at)
                torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def ar_case(arch: str):
    """A float32 model of ``arch`` and 12 AR documents with their key-corrupted twins."""
    from mecheval.tasks import ARConfig, build_datasets, corrupt

    task = ARConfig(kind="ar", n_keys=8, n_values=8, n_pairs=3, n_train=0, n_dev=12, n_test=0)
    original = build_datasets(task)["dev"].batch(torch.arange(12))
    corrupted = corrupt(original, task, seed=3)
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(architecture=arch, d_model=16, vocab_size=task.vocab_size(), max_len=16)
    ).eval()
    return model, original, corrupted


@pytest.mark.parametrize("arch", ["attention", "mamba", "deltanet", "hyena", "h3", "baseconv"])
def test_the_engine_gives_the_same_numbers_with_and_without_resuming(arch: str) -> None:
    """Resuming changes which positions are computed, not the numbers: against the engine
    that recomputes whole sequences, to the issue's 1e-6 (float32 models)."""
    from mecheval.interventions import interchange

    model, original, corrupted = ar_case(arch)
    resumed = interchange(model, original, corrupted)
    whole = interchange(model, original, corrupted, resume=False)
    assert len(resumed.per_example) == len(whole.per_example) > 0
    torch.testing.assert_close(
        torch.tensor(resumed.per_example.restored.to_numpy()),
        torch.tensor(whole.per_example.restored.to_numpy()),
        rtol=0.0,
        atol=1e-6,
    )


@pytest.mark.parametrize("arch", ["attention", "mamba", "deltanet"])
def test_over_the_state_budget_a_block_recomputes_its_window(arch: str, monkeypatch) -> None:
    """A block whose prefix states would exceed the budget is not resumed (its mixer
    recomputes the whole window, not its resumed form from no state): same numbers."""
    from mecheval.interventions import interchange, prefix

    model, original, corrupted = ar_case(arch)
    whole = interchange(model, original, corrupted, resume=False)
    monkeypatch.setattr(prefix, "STATE_BUDGET_BYTES", 0)
    cache = prefix.prefix_cache(model, [torch.zeros(12, 9, 16)] * 2)
    assert cache.prefixes == [None, None]
    capped = interchange(model, original, corrupted)
    torch.testing.assert_close(
        torch.tensor(capped.per_example.restored.to_numpy()),
        torch.tensor(whole.per_example.restored.to_numpy()),
        rtol=0.0,
        atol=1e-6,
    )


def test_a_state_site_on_a_mixer_without_a_halo_is_one_line() -> None:
    """A mixer that carries a state but says no halo cannot be resumed at its state site:
    one line naming the layer and the contract, not an error deep in the engine."""
    from mecheval.interventions.prefix import PrefixCache

    model = model_for("mamba", {}, None)
    mixer = model.layers[1].mixer
    mixer.halo = lambda: None  # as a plugin that sets carries but not halo
    cache = PrefixCache([torch.zeros(2, LENGTH, 16)] * 2, [None, None])
    with pytest.raises(ValueError, match=r"^layers\.1\.mixer carries a state but its halo\(\)"):
        cache.block_prefix(model, 1)
    assert cache.block_prefix(model, 0).carries == "state"  # the other layer as built


@pytest.mark.parametrize("arch", ["attention", "mamba"])
def test_restores_from_kept_clean_runs_equal_a_fresh_interchange(arch: str) -> None:
    """The null's restores start from the clean runs the roles' restores made (engine's
    ``runs``): the same bits as running the pair again, for the roles, the null's roles at a
    subset of the sites and a recurrent state site; runs made for other sites are refused."""
    from mecheval.interventions import clean_runs, interchange
    from mecheval.interventions.null import measure_null

    model, original, corrupted = ar_case(arch)
    sites = ["layers.0.input", "layers.1.input", "layers.1.mixer.output"]
    if arch == "mamba":
        sites.append("layers.0.mixer.state")
    runs = clean_runs(model, original, corrupted, sites)
    kept = interchange(model, original, corrupted, sites=sites, runs=runs)
    fresh = interchange(model, original, corrupted, sites=sites)
    assert len(kept.per_example) == len(fresh.per_example) > 0
    assert kept.table.equals(fresh.table) and kept.per_example.equals(fresh.per_example)
    null_kept = measure_null(model, original, corrupted, sites[1:2], runs=runs)
    null_fresh = measure_null(model, original, corrupted, sites[1:2])
    assert null_kept is not None and null_fresh is not None
    assert null_kept.per_example.equals(null_fresh.per_example)
    with pytest.raises(ValueError, match="runs: made for sites"):
        interchange(model, original, corrupted, sites=["final_norm.input"], runs=runs)
