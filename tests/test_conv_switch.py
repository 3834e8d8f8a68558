"""The short-convolution switch (``model.short_conv``, issue #15): it sets the architecture's
own short convs where it has them (equal to setting the mixer option), removes them with
'none', adds a causal conv on the mixer's input where the architecture has none (its own
site, computed as mix(conv(x))), and refuses where "the" short conv would be ambiguous."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mecheval.errors import ConfigError
from mecheval.models import ModelConfig, build_model, site_names
from mecheval.models.mixers.modules import ShortConv

VOCAB = 21


def make(arch: str, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(architecture=arch, d_model=16, vocab_size=VOCAB, max_len=40, **kw)
    return build_model(cfg).double().eval()


def tokens(t: int = 13, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (3, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    ("arch", "option", "k"),
    [
        ("mamba", "d_conv", 2),
        ("deltanet", "conv_size", 3),
        ("hyena", "short_filter_order", 2),
        ("mamba2", "d_conv", 3),
        ("gated_deltanet", "conv_size", 2),
        ("gla", "conv_size", 4),
        ("hawk", "conv_size", 2),
        ("mamba3", "d_conv", 2),
    ],
)
def test_the_switch_is_the_architectures_own_option(arch: str, option: str, k: int) -> None:
    switched, direct = make(arch, short_conv=k), make(arch, mixer={option: k})
    assert site_names(switched) == site_names(direct)
    assert switched.state_dict().keys() == direct.state_dict().keys()
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(switched(x), direct(x), rtol=0, atol=0)
    default = make(arch, mixer={option: k})
    removed = make(arch, short_conv="none")  # 'none' removes the convs, sites and weights
    assert not [s for s in site_names(removed) if "conv.output" in s and "long" not in s]
    short = [n for n in removed.state_dict() if ("_conv" in n or ".conv." in n) and "long" not in n]
    assert not short
    assert sum(p.numel() for p in removed.parameters()) < sum(
        p.numel() for p in default.parameters()
    )


def test_deltanet_without_convs_is_fla_without_short_conv() -> None:
    """fla's DeltaNet with use_short_conv=False: q, k, v = SiLU(W x), nothing else changes."""
    model = make("deltanet", short_conv="none")
    mixer = model.layers[0].mixer
    x = torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    q, k, v, beta = mixer.qkv_beta(x)
    torch.testing.assert_close(v, mixer.heads(F.silu(mixer.v_proj(x))))
    raw_k = mixer.heads(F.silu(mixer.k_proj(x)))
    torch.testing.assert_close(k, raw_k * torch.rsqrt(raw_k.pow(2).sum(-1, keepdim=True) + 1e-6))


@pytest.mark.parametrize("arch", ["attention", "h3"])
def test_an_architecture_without_convs_gets_one_on_its_input(arch: str) -> None:
    model = make(arch, short_conv=2)
    mixer = model.layers[0].mixer
    assert isinstance(mixer.short_conv, ShortConv) and mixer.short_conv.kernel_size == 2
    assert "layers.0.mixer.short_conv.output" in site_names(model)
    assert "layers.1.mixer.short_conv.output" in site_names(model)
    # The mixer computes mix(conv(x)): its own computation on the conv's output.
    x = torch.randn(2, 11, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        w, b = mixer.short_conv.weight[:, 0], mixer.short_conv.bias
        padded = F.pad(x, (0, 0, 1, 0))
        conv = padded[:, :-1] * w[:, 0] + padded[:, 1:] * w[:, 1] + b  # taps t-1, t
        torch.testing.assert_close(mixer(x), mixer.mix(conv))
    # 'none' on an architecture without convs is its default.
    assert site_names(make(arch, short_conv="none")) == site_names(make(arch))


@pytest.mark.parametrize("arch", ["attention", "mamba", "deltanet"])
@pytest.mark.parametrize("switch", ["none", 1, 4])
def test_switched_models_stay_causal(arch: str, switch) -> None:
    model = make(arch, short_conv=switch)
    x = tokens(17, seed=3)
    y = x.clone()
    y[:, 9] = (y[:, 9] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :9], b[:, :9], rtol=0, atol=0)
    assert not torch.allclose(a[:, 9:], b[:, 9:])


@pytest.mark.parametrize(
    ("arch", "kw", "says"),
    [
        ("based", {"short_conv": 2}, "model.short_conv: based alternates"),
        ("baseconv", {"short_conv": "none"}, "model.short_conv: baseconv sizes its conv per layer"),
        (
            "mamba",
            {"short_conv": 2, "mixer": {"d_conv": 3}},
            "model.mixer.d_conv, which is set too",
        ),
    ],
)
def test_refused_or_contradictory_switch_is_a_one_line_error(arch: str, kw: dict, says: str):
    with pytest.raises(ConfigError) as err:
        make(arch, **kw)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("value", [0, -2, "some"])
def test_bad_kernel_names_the_field(value) -> None:
    from mecheval.errors import validate

    with pytest.raises(ConfigError) as err:
        validate(ModelConfig, {"short_conv": value}, prefix="model")
    assert str(err.value).startswith("model.short_conv") and "\n" not in str(err.value)
