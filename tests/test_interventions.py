"""The interchange engine: exactness against the unpatched and naive forms, causality,
site-internal patching, and agreement with a one-forward-per-intervention loop for every
architecture in the registry."""

from __future__ import annotations

import pytest
import torch

from mecheval.interventions import interchange, naive_interchange, patch, record
from mecheval.interventions.engine import answer_scores
from mecheval.models import ARCHITECTURES, ModelConfig, build_model, site_names
from mecheval.models.mixers.base import Mixer, ShortConv
from mecheval.models.sites import name_sites
from mecheval.tasks import ARConfig, ATRConfig, build_datasets, corrupt, vocab_size

AR = ARConfig(kind="ar", n_keys=8, n_values=8, n_pairs=3, n_train=0, n_dev=5, n_test=5)


def ar_pair(n: int = 5, cfg: ARConfig = AR):
    original = build_datasets(cfg)["dev"].batch(torch.arange(n))
    return original, corrupt(original, cfg, seed=3)


def tiny(arch: str, cfg=AR, max_len: int = 16, seed: int = 0):
    torch.manual_seed(seed)
    model_cfg = ModelConfig(
        architecture=arch, d_model=16, vocab_size=vocab_size(cfg), max_len=max_len
    )
    return build_model(model_cfg).eval()


def p_answer(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return answer_scores(model(batch.tokens, at=batch.query), batch.answer)[0]


def test_patching_every_position_of_layer0_input_gives_the_original() -> None:
    model = tiny("attention")
    original, corrupted = ar_pair()
    with torch.no_grad(), record(model, ["layers.0.input"]) as source:
        model(original.tokens)
    site = model.get_submodule("layers.0.input")

    def overwrite_all(module, inputs, output):
        return source["layers.0.input"].clone()

    handle = site.register_forward_hook(overwrite_all)
    try:
        restored = p_answer(model, corrupted)
    finally:
        handle.remove()
    assert torch.equal(restored, p_answer(model, original))
    assert not torch.allclose(p_answer(model, corrupted), p_answer(model, original))


def test_patching_nothing_gives_the_corrupted() -> None:
    model = tiny("mamba")
    original, corrupted = ar_pair()
    result = interchange(model, original, corrupted, sites=[], roles=[])
    assert result.value("corrupted") == pytest.approx(p_answer(model, corrupted).mean().item())
    assert result.value("original") == pytest.approx(p_answer(model, original).mean().item())


def test_restoring_the_key_at_the_embedding_undoes_the_corruption() -> None:
    # o and c differ only at the key: restoring layers.0.input there restores p(y|o) exactly.
    model = tiny("attention")
    original, corrupted = ar_pair()
    result = interchange(model, original, corrupted, sites=["layers.0.input"], roles=["key"])
    per_doc = result.per_example
    torch.testing.assert_close(
        torch.tensor(per_doc.restored.values), p_answer(model, original), rtol=1e-6, atol=1e-7
    )


@pytest.mark.parametrize("arch", ["attention", "mamba", "deltanet"])
def test_patching_after_the_query_changes_nothing(arch: str) -> None:
    model = tiny(arch)
    original, corrupted = ar_pair()
    pad = torch.randint(
        3, vocab_size(AR), (len(corrupted), 4), generator=torch.Generator().manual_seed(0)
    )
    longer = corrupted.with_tokens(torch.cat([corrupted.tokens, pad], dim=1))
    after = longer.query + 2
    reference = p_answer(model, corrupted)
    for site in site_names(model):
        with record(model, [site]) as acts, torch.no_grad():
            model(longer.tokens)
        values = torch.randn_like(acts[site][:, 0]) * 10
        with patch(model, site, after, values):
            assert torch.equal(p_answer(model, longer), reference), site


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_batched_equals_naive_loop(arch: str) -> None:
    model = tiny(arch)
    original, corrupted = ar_pair(n=3)
    fast = interchange(model, original, corrupted, max_batch=4)  # several chunks per site
    slow = naive_interchange(model, original, corrupted)
    assert list(fast.table.site) == list(slow.table.site)
    assert list(fast.table.role) == list(slow.table.role)
    torch.testing.assert_close(
        torch.tensor(fast.table.value.values),
        torch.tensor(slow.table.value.values),
        rtol=1e-5,
        atol=1e-6,
    )
    torch.testing.assert_close(
        torch.tensor(fast.per_example.restored.values, dtype=torch.float64),
        torch.tensor(slow.per_example.restored.values, dtype=torch.float64),
        rtol=1e-5,
        atol=1e-6,
    )


def test_batched_equals_naive_on_variable_length_atr() -> None:
    cfg = ATRConfig(kind="atr", n_train=0, n_dev=6, n_test=6)
    original = build_datasets(cfg)["dev"].batch(torch.arange(6))
    assert original.lengths.min() < original.lengths.max()  # real padding in the batch
    corrupted = corrupt(original, cfg, seed=1)
    model = tiny("based", cfg=cfg, max_len=original.tokens.shape[1])
    fast = interchange(model, original, corrupted, roles=["key", "value", "query"])
    slow = naive_interchange(model, original, corrupted, roles=["key", "value", "query"])
    torch.testing.assert_close(
        torch.tensor(fast.table.value.values),
        torch.tensor(slow.table.value.values),
        rtol=1e-5,
        atol=1e-6,
    )


class ConvMixer(Mixer):
    """A mixer whose only sequence mixing is a short causal convolution named `conv`."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.conv = ShortConv(d, kernel_size=2)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def test_site_inside_a_mixer_is_patched_at_the_right_position() -> None:
    model = tiny("attention")
    model.layers[0].mixer = ConvMixer(16)
    name_sites(model)
    original, corrupted = ar_pair()
    site = "layers.0.mixer.conv.output"
    assert site in site_names(model)
    with torch.no_grad(), record(model, [site, "layers.0.mixer.output"]) as plain:
        model(corrupted.tokens)
    base_conv, base_out = plain[site].clone(), plain["layers.0.mixer.output"].clone()
    pos = corrupted.roles["value"]
    values = torch.randn(len(corrupted), 16)
    with (
        torch.no_grad(),
        patch(model, site, pos, values),
        record(model, [site, "layers.0.mixer.output"]) as patched,
    ):
        model(corrupted.tokens)
    rows = torch.arange(len(corrupted))
    torch.testing.assert_close(patched[site][rows, pos], values)
    changed = (patched["layers.0.mixer.output"] != base_out).any(-1)
    expected = torch.zeros_like(changed)
    expected[rows, pos] = True
    assert torch.equal(changed, expected)
    untouched = torch.ones_like(changed)
    untouched[rows, pos] = False
    assert torch.equal(patched[site][untouched], base_conv[untouched])


def test_patch_removes_its_hook_even_when_the_forward_fails() -> None:
    model = tiny("attention")
    site = model.get_submodule("layers.0.input")
    with (
        pytest.raises(ValueError, match="positions"),
        patch(model, "layers.0.input", torch.zeros(2, dtype=torch.long), torch.zeros(2, 16)),
    ):
        model(torch.zeros(3, 5, dtype=torch.long))
    assert not site._forward_hooks


def test_attribution_names_the_best_role() -> None:
    model = tiny("attention")
    original, corrupted = ar_pair(n=5)
    result = interchange(model, original, corrupted, sites=["layers.0.input"])
    best = result.attribution.set_index("doc")
    examples = result.per_example
    # Restoring the key at the embedding gives p(y|o) exactly; every other role leaves the
    # corrupted key in place. So wherever o beats every other restore, the key is best.
    checked = 0
    for doc, rows in examples.groupby("doc"):
        others = rows[rows.role != "key"].restored.max()
        if rows.original.iloc[0] > others + 1e-6:
            assert best.loc[doc, "role"] == "key"
            assert best.loc[doc, "restored"] == pytest.approx(rows.original.iloc[0])
            checked += 1
    assert checked > 0 and len(best) == 5
