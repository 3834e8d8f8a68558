"""Backbone and site invariants, parametrised over the whole registry: a new architecture
gets every one of these tests for free."""

from __future__ import annotations

import pytest
import torch

from mecheval.contract import CHECKS, make_model, run_checks
from mecheval.errors import ConfigError
from mecheval.models import ARCHITECTURES, ModelConfig, build_model

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


# The interchange check is covered, on every site, by test_interventions.py.
CONTRACT = [name for name in CHECKS if name != "interchange"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("check", CONTRACT)
def test_architecture_contract(arch: str, check: str) -> None:
    CHECKS[check](arch, None)


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


# A mixer that breaks each check: tests/test_contract_breakers.py.


def test_a_good_mixer_passes_every_check_including_the_engine() -> None:
    assert all(r.passed for r in run_checks("based")), run_checks("based")


@pytest.mark.parametrize("hybrid", ["mamba+attention~hyena", "attention~mamba+gated_deltanet"])
def test_a_hybrid_by_name_passes_every_check(hybrid: str) -> None:
    """``check-mixer mamba+attention~hyena``: the contract on a model of those layers (a
    parallel layer's branches joined by ~), each with its default options."""
    results = run_checks(hybrid)
    assert [r.name for r in results] == list(CHECKS)
    assert all(r.passed for r in results), [r for r in results if not r.passed]
    model = make_model(hybrid)
    assert [layer.mixer.__class__.__name__ for layer in model.layers] == (
        ["Mamba", "ParallelMixer"]
        if hybrid.startswith("mamba")
        else ["ParallelMixer", "GatedDeltaNet"]
    )


def test_device_is_the_parameters_device() -> None:
    """pyvene (docs/interop.md) reads ``model.device``, as transformers' models have it."""
    cfg = ModelConfig(architecture="attention", d_model=16, n_layers=1, vocab_size=11, max_len=8)
    model = build_model(cfg)
    assert model.device == torch.device("cpu")
    assert model.to(torch.float64).device == torch.device("cpu")
    with torch.device("meta"):
        assert build_model(cfg).device == torch.device("meta")
