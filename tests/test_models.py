"""Backbone and site invariants, parametrised over the whole registry: a new architecture
gets every one of these tests for free."""

from __future__ import annotations

import pytest
import torch

from mecheval.errors import ConfigError
from mecheval.models import (
    ARCHITECTURES,
    ModelConfig,
    build_model,
    get_site,
    iter_sites,
    site_names,
)
from mecheval.models.registry import get_architecture

VOCAB = 23
MAX_LEN = 48


def make(arch: str, d: int = 16, n_layers: int = 2, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(
        architecture=arch, d_model=d, n_layers=n_layers, vocab_size=VOCAB, max_len=MAX_LEN, **kw
    )
    return build_model(cfg).eval()


ARCHS = sorted(ARCHITECTURES)


def tokens(b: int, t: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (b, t), generator=g)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("position_embedding", [True, False])
def test_causal(arch: str, position_embedding: bool) -> None:
    model = make(arch, position_embedding=position_embedding)
    x = tokens(2, 37)
    t = 20
    y = x.clone()
    y[:, t + 1 :] = (y[:, t + 1 :] + 5) % VOCAB
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(a[:, t + 1 :], b[:, t + 1 :])


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_at_query_equal_full_logits(arch: str) -> None:
    model = make(arch)
    x = tokens(3, 29)
    at = torch.tensor([28, 5, 17])
    with torch.no_grad():
        full = model(x)
        picked = model(x, at=at)
    torch.testing.assert_close(picked, full[torch.arange(3), at], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 45)])
def test_shapes(arch: str, shape: tuple[int, int]) -> None:
    model = make(arch)
    with torch.no_grad():
        out = model(tokens(*shape))
    assert out.shape == (*shape, VOCAB)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_every_parameter_gets_a_gradient(arch: str) -> None:
    model = make(arch).train()
    x = tokens(4, 33)
    logits = model(x)
    torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), tokens(4, 33, seed=2).flatten()
    ).backward()
    missing = [
        n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0
    ]
    assert not missing, f"parameters without gradient: {missing}"


def test_position_embedding_off_removes_it() -> None:
    model = make("attention", n_layers=1, position_embedding=False)
    assert model.position is None
    assert not any("position" in name for name, _ in model.named_parameters())
    # Without positions, one attention layer is permutation-invariant over the prefix: the
    # last position sees the same multiset of tokens and must produce the same output.
    x = tokens(1, 9)
    perm = torch.cat(
        [torch.randperm(8, generator=torch.Generator().manual_seed(3)), torch.tensor([8])]
    )
    with torch.no_grad():
        torch.testing.assert_close(model(x)[:, -1], model(x[:, perm])[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_sites_fire_once_with_token_axis(arch: str) -> None:
    model = make(arch)
    seen: dict[str, list[tuple[int, ...]]] = {}
    handles = [
        site.register_forward_hook(lambda m, i, o, n=name: seen.setdefault(n, []).append(o.shape))
        for name, site in iter_sites(model)
    ]
    x = tokens(3, 11)
    with torch.no_grad():
        model(x, at=torch.tensor([10, 10, 10]))
    for h in handles:
        h.remove()
    names = site_names(model)
    assert set(seen) == set(names)
    for name, shapes in seen.items():
        assert len(shapes) == 1, f"{name} fired {len(shapes)} times"
        assert shapes[0][:2] == (3, 11), f"{name}: {shapes[0]}"
        if name.endswith(("layers.0.input", "layers.1.output")) or name == "final_norm.input":
            assert shapes[0] == (3, 11, 16)


@pytest.mark.parametrize("arch", ARCHS)
def test_site_names_are_submodule_paths(arch: str) -> None:
    model = make(arch)
    names = site_names(model)
    expected = {"final_norm.input"}
    for i in range(2):
        expected |= {f"layers.{i}.{s}" for s in ("input", "output", "mixer.input", "mixer.output")}
        if get_architecture(arch).mlp:
            expected |= {f"layers.{i}.mlp.input", f"layers.{i}.mlp.output"}
    assert expected <= set(names)
    for name in names:
        assert get_site(model, name) is model.get_submodule(name)
        assert get_site(model, name).name == name


@pytest.mark.parametrize("arch", ARCHS)
def test_overwriting_a_site_with_itself_changes_nothing(arch: str) -> None:
    model = make(arch)
    x = tokens(2, 15)
    with torch.no_grad():
        ref = model(x)
        for name, site in iter_sites(model):
            handle = site.register_forward_hook(lambda m, i, o: o.clone())
            try:
                torch.testing.assert_close(model(x), ref, rtol=0, atol=0, msg=name)
            finally:
                handle.remove()


@pytest.mark.parametrize("arch", ARCHS)
def test_patching_layer0_input_at_one_position_changes_only_later_outputs(arch: str) -> None:
    model = make(arch)
    x = tokens(2, 19)
    p = 9

    # A random direction: a constant shift would vanish under the next LayerNorm.
    direction = torch.randn(16, generator=torch.Generator().manual_seed(4))

    def bump(module, inputs, output):
        output = output.clone()
        output[:, p] += direction
        return output

    with torch.no_grad():
        ref = model(x)
        handle = get_site(model, "layers.0.input").register_forward_hook(bump)
        try:
            out = model(x)
        finally:
            handle.remove()
    torch.testing.assert_close(out[:, :p], ref[:, :p], rtol=0, atol=0)
    assert (out[:, p] - ref[:, p]).abs().max() > 1e-4


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("architecture", "transformerxl", "model.architecture"),
        ("n_layers", 0, "n_layers"),
        ("d_model", 0, "d_model"),
    ],
)
def test_bad_model_config_names_the_field(field: str, value, needle: str) -> None:
    from mecheval.errors import validate

    data = {"vocab_size": VOCAB, "max_len": MAX_LEN, field: value}
    with pytest.raises(ConfigError) as err:
        build_model(validate(ModelConfig, data, prefix="model"))
    message = str(err.value)
    assert needle in message and "\n" not in message


def test_heads_must_divide_d_model() -> None:
    with pytest.raises(ConfigError, match="d_model"):
        make("attention", d=18, mixer={"num_heads": 4})


def test_unknown_mixer_option_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"model\.mixer\.bogus"):
        make("attention", mixer={"bogus": 1})
