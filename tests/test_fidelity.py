"""Every architecture's defaults equal the code the paper ran (docs/architecture.md, "Fidelity").

The reference: aryamanarora/tinylang (``tinylang/model/zoology.py``: every released config
passes 2 layers, 1 head, ``bias: false``, 1024 positions) over zoology's mixers and, for Mamba,
mamba_ssm's block and init. Three kinds of proof:

* parameter counts of whole LMs at the paper's configs, equal to the reference models';
* init statistics against the init rules each reference applies;
* independent forms: zoology's ``ImplicitLongConvolution`` and H3's head_dim-2 state
  recurrence, written here from their definitions, against our layers (float64).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mecheval.errors import ConfigError
from mecheval.models import ModelConfig, build_model
from mecheval.models.backbone import count_parameters
from mecheval.models.mixers.long_conv import MLPFilter
from mecheval.models.mixers.modules import ShortConv
from mecheval.models.registry import ARCHITECTURES

PAPER_VOCAB = 8196
PAPER_POSITIONS = 1024

#: Parameter counts of the reference models (2 layers, vocabulary 8196, 1024 learned positions
#: as in tinylang's ar_32 / pcfg_easy templates, the paper's mixer settings), as listed in the
#: fidelity issue from the reference modules.
REFERENCE_COUNTS = {
    ("attention", 64): 689_792,
    ("attention", 256): 3_938_816,
    ("baseconv", 64): 666_624,
    ("baseconv", 256): 3_551_040,
    ("based", 64): 670_528,
    ("based", 256): 3_616_000,
    ("h3", 64): 1_149_184,
    ("h3", 256): 5_776_384,
    ("hyena", 64): 723_456,
    ("hyena", 256): 4_003_200,
    ("mamba", 64): 655_616,
    ("mamba", 256): 3_236_864,
}


def paper_model(arch: str, d: int, seed: int = 0, **mixer) -> nn.Module:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        architecture=arch,
        d_model=d,
        n_layers=2,
        vocab_size=PAPER_VOCAB,
        max_len=PAPER_POSITIONS,
        position_embedding=True,
        mixer=mixer,
    )
    return build_model(cfg)


@pytest.mark.parametrize(("arch", "d"), sorted(REFERENCE_COUNTS))
def test_parameter_count_equals_the_papers_model(arch: str, d: int) -> None:
    assert count_parameters(paper_model(arch, d)) == REFERENCE_COUNTS[arch, d]


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_position_embeddings_by_default_for_attention_only(arch: str) -> None:
    """The paper's figures take attention from runs with learned positions (tinylang ar_32,
    pcfg_easy) and every other mixer from runs without (ar_32_nope, pcfg_easy_nope; App. D.1):
    unset, ``model.position_embedding`` is that, and a resolved config states it."""
    from mecheval.training.config import config_from_data, resolve

    data = {"task": {"kind": "ar"}, "model": {"architecture": arch}}
    cfg = resolve(config_from_data(data))
    assert cfg.model.position_embedding is (arch == "attention")
    model = build_model(cfg.model)
    assert (model.position is not None) is (arch == "attention")
    forced = resolve(config_from_data(data, ["model.position_embedding=true"]))
    assert build_model(forced.model).position is not None


def test_options_that_differ_from_the_paper_change_the_count() -> None:
    # the documented non-default options are really different models
    assert count_parameters(paper_model("attention", 64, qkv_bias=True)) == 689_792 + 2 * 3 * 64
    assert count_parameters(paper_model("h3", 64, head_dim=1)) > REFERENCE_COUNTS["h3", 64]


# --- init statistics --------------------------------------------------------------------


def linear_weights(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor, dict[str, nn.Linear]]:
    """All Linear weights pooled: (residual-out projections, the others), and the modules."""
    modules = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    out = [
        m.weight.flatten()
        for n, m in modules.items()
        if n.rsplit(".", 1)[-1] in ("out_proj", "fc2")
    ]
    rest = [
        m.weight.flatten()
        for n, m in modules.items()
        if n.rsplit(".", 1)[-1] not in ("out_proj", "fc2")
    ]
    return torch.cat(out), torch.cat(rest), modules


@pytest.mark.parametrize("arch", ["attention", "baseconv", "based", "h3", "hyena", "deltanet"])
def test_zoology_init(arch: str) -> None:
    """zoology's ``_init_weights``: Linear ~ N(0, 0.02), biases 0, out_proj/fc2 weights
    ~ N(0, 0.02 / sqrt(2 n_layers)); embeddings N(0, 0.02)."""
    model = paper_model(arch, 128)
    out, rest, modules = linear_weights(model)
    assert rest.std().item() == pytest.approx(0.02, rel=0.03)
    assert rest.mean().abs().item() < 1e-3
    assert out.std().item() == pytest.approx(0.02 / math.sqrt(4), rel=0.03)
    assert all(m.bias is None or not m.bias.any() for m in modules.values())
    assert model.embedding.weight.std().item() == pytest.approx(0.02, rel=0.03)


def test_deltanet_output_projection_is_not_rescaled() -> None:
    # fla names it o_proj, which zoology's init does not rescale
    model = paper_model("deltanet", 256)
    for layer in model.layers:
        assert not hasattr(layer.mixer, "out_proj")
        assert layer.mixer.o_proj.weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert model.layers[0].mixer.num_heads == 1  # tinylang passes num_heads = n_head = 1


def test_short_convolutions_keep_pytorchs_default_init() -> None:
    # zoology's init touches Linear and Embedding only; Conv1d keeps U(+-1/sqrt(k)). So do the
    # short convs of Gated DeltaNet and GLA, where fla's own init draws them from N(0, 0.02).
    cases = [(arch, {}) for arch in ("baseconv", "hyena", "deltanet", "mamba", "gated_deltanet")]
    for arch, mixer in [*cases, ("gla", {"conv_size": 4})]:
        convs = [m for m in paper_model(arch, 256, **mixer).modules() if isinstance(m, ShortConv)]
        assert convs, arch
        for conv in convs:
            bound = 1 / math.sqrt(conv.kernel_size)
            assert conv.weight.abs().max().item() <= bound
            assert conv.weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)


def test_mamba_init_is_mamba_ssms() -> None:
    """mamba_ssm: Linear weights keep PyTorch's kaiming-uniform (std 1/sqrt(3 fan_in)),
    Linear biases 0, out_proj kaiming-uniform / sqrt(n_layers), embeddings N(0, 0.02), and
    the SSM's own dt / A / D init."""
    model = paper_model("mamba", 128)
    for layer in model.layers:
        m = layer.mixer
        d, d_inner = 128, m.d_inner
        assert m.in_proj.bias is None and m.out_proj.bias is None  # bias: false
        assert m.in_proj.weight.std().item() == pytest.approx(1 / math.sqrt(3 * d), rel=0.03)
        assert m.in_proj.weight.abs().max().item() <= 1 / math.sqrt(d)
        assert m.x_proj.weight.std().item() == pytest.approx(1 / math.sqrt(3 * d_inner), rel=0.05)
        expected_out = 1 / math.sqrt(3 * d_inner) / math.sqrt(2)  # n_layers = 2, no MLP
        assert m.out_proj.weight.std().item() == pytest.approx(expected_out, rel=0.03)
        assert m.out_proj.weight.abs().max().item() <= 1 / math.sqrt(d_inner) / math.sqrt(2)
        # dt_proj keeps its own init: weight U(+-dt_rank^-0.5), bias = softplus^-1(dt)
        assert m.dt_proj.weight.abs().max().item() <= m.dt_rank**-0.5
        dt = nn.functional.softplus(m.dt_proj.bias)
        assert dt.min().item() >= 1e-3 * 0.999 and dt.max().item() <= 0.1 * 1.001
        assert torch.equal(m.D, torch.ones_like(m.D))
    assert model.embedding.weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert model.position.weight.std().item() == pytest.approx(0.02, rel=0.03)


def test_attention_has_no_qkv_bias_but_an_output_bias() -> None:
    mixer = paper_model("attention", 64).layers[0].mixer
    assert mixer.qkv.bias is None
    assert mixer.out_proj.bias is not None


def test_baseconv_long_kernel_is_of_the_references_size_at_init() -> None:
    """Linear(3, 16) -> ReLU -> Linear(16, d) with N(0, s) weights and zero biases, on the
    features z = (t, ~1, ~0): E[k^2] = 16 s^2 * s^2 (1 + t^2) / 2, so over t in [0, 1] the
    kernel's RMS is s^2 sqrt(8 (1 + 1/3)). The Hyena-style filter used before was ~150x
    smaller."""
    s = 0.02
    expected = s**2 * math.sqrt(8 * (1 + 1 / 3))
    rms = []
    for seed in range(4):
        conv = paper_model("baseconv", 256, seed=seed).layers[1].mixer.conv
        assert isinstance(conv.filter, MLPFilter)
        rms.append(conv.kernel(1024).pow(2).mean().sqrt().item())
    assert sum(rms) / len(rms) == pytest.approx(expected, rel=0.25)


# --- independent forms ------------------------------------------------------------------


def zoology_implicit_long_conv(u: torch.Tensor, w1, b1, w2, b2, l_max: int) -> torch.Tensor:
    """zoology's ImplicitLongConvolution written from its definition: positional features
    [t, cos(f w), -sin(f w)] with f = 1e-4 (one band) and w = 2 pi n / l_max, an MLP
    Linear-ReLU-Linear, and an FFT convolution at n = 2L plus the input."""
    length = u.shape[1]
    n = torch.arange(l_max, dtype=torch.float64)
    t = n / (l_max - 1)
    angle = 1e-4 * 2 * math.pi * n / l_max
    z = torch.stack([t, torch.cos(angle), -torch.sin(angle)], dim=-1)[:length]
    k = (torch.relu(z @ w1.T + b1) @ w2.T + b2).T  # [C, L]
    fft = 2 * length
    y = torch.fft.irfft(torch.fft.rfft(u.transpose(1, 2), n=fft) * torch.fft.rfft(k, n=fft), n=fft)[
        ..., :length
    ]
    return y.transpose(1, 2) + u


def test_baseconv_long_conv_equals_zoologys_implicit_long_convolution() -> None:
    conv = paper_model("baseconv", 16).layers[1].mixer.conv.double()
    with torch.no_grad():  # weights of a useful size, so the comparison is not of ~zeros
        for p in conv.parameters():
            p.normal_(0, 0.5)
    lin1, lin2 = conv.filter.mlp[0], conv.filter.mlp[2]
    assert (lin1.in_features, lin1.out_features, lin2.out_features) == (3, 16, 16)
    u = torch.randn(3, 41, 16, dtype=torch.float64)
    expected = zoology_implicit_long_conv(
        u, lin1.weight, lin1.bias, lin2.weight, lin2.bias, PAPER_POSITIONS
    )
    # The fixed positional features are float32 in both codes (a buffer here), so they carry
    # float32 round-off into this float64 comparison.
    torch.testing.assert_close(conv(u), expected, rtol=1e-6, atol=1e-8)


def h3_by_recurrence(mixer, u: torch.Tensor) -> torch.Tensor:
    """H3 written as its two SSMs' state recurrences, one step at a time (float64).

    Shift SSM per channel: x_t = shift(x_{t-1}) + B u_t, y_t = C.x_t + D u_t. Diagonal SSM per
    head (S4D-Lin, bilinear): complex modes x_t = dA x_{t-1} + dB u_t, y_t = 2 Re(C.x_t) + D u_t,
    dA = (1 + dt A / 2) / (1 - dt A / 2), dB = dt B / (1 - dt A / 2). With head_dim p, head h
    runs its SSM on the p x p products k'_i v_j and y_j = sum_i q_i SSM(k' v)_ij; output
    channel j * H + h (zoology's layout)."""
    b, length, d = u.shape
    p = mixer.head_dim
    heads = d // p
    q, k, v = mixer.q_proj(u), mixer.k_proj(u), mixer.v_proj(u)

    shift = mixer.conv
    state = torch.zeros(b, d, shift.d_state, dtype=u.dtype)
    k_shifted = []
    for t in range(length):
        state = torch.roll(state, 1, dims=-1)
        state[..., 0] = 0
        state = state + shift.B * k[:, t, :, None]
        k_shifted.append((state * shift.C).sum(-1) + shift.D * k[:, t])
    k = torch.stack(k_shifted, 1)

    ssm = mixer.ssm
    dt = torch.exp(ssm.log_dt)[:, None]
    a = torch.complex(-torch.exp(ssm.inv_A_real), ssm.A_imag)
    b_c, c_c = torch.view_as_complex(ssm.B), torch.view_as_complex(ssm.C)
    da = (1 + dt * a / 2) / (1 - dt * a / 2)
    db = dt * b_c / (1 - dt * a / 2)
    kv = k.view(b, length, heads, p, 1) * v.view(b, length, heads, 1, p)  # [b, t, h, i, j]
    x = torch.zeros(b, heads, p, p, a.shape[-1], dtype=torch.complex128)
    ys = []
    for t in range(length):
        x = da[:, None, None] * x + db[:, None, None] * kv[:, t, ..., None]
        s = 2 * (x * c_c[:, None, None]).sum(-1).real + mixer.D[:, None, None] * kv[:, t]
        ys.append((s * q[:, t].view(b, heads, p, 1)).sum(2))  # [b, h, j]
    y = torch.stack(ys, 1).transpose(2, 3).reshape(b, length, d)
    return mixer.output_linear(y)


@pytest.mark.parametrize("head_dim", [2, 1])
def test_h3_equals_its_state_recurrence(head_dim: int) -> None:
    mixer = paper_model("h3", 8, d_state=16, head_dim=head_dim).layers[0].mixer.double()
    assert mixer.head_dim == head_dim
    with torch.no_grad():
        for lin in (mixer.q_proj, mixer.k_proj, mixer.v_proj, mixer.output_linear):
            lin.weight.normal_(0, 0.5)
            lin.bias.normal_(0, 0.5)
        mixer.conv.B.normal_()  # a general B, not only the e_1 of the init
    u = torch.randn(2, 23, 8, dtype=torch.float64)
    torch.testing.assert_close(mixer(u), h3_by_recurrence(mixer, u), rtol=1e-9, atol=1e-9)


# --- bad input --------------------------------------------------------------------------


def test_an_option_the_shape_cannot_take_is_a_config_error_before_anything_is_written(
    tmp_path,
) -> None:
    from typer.testing import CliRunner

    from mecheval.cli import _register, app
    from mecheval.experiments.grid import SweepSpec
    from mecheval.experiments.runners import run_sweep

    _register()
    args = ["train", "--preset", "tiny", "--arch", "h3", "--out", str(tmp_path / "runs")]
    result = CliRunner().invoke(app, [*args, "--set", "model.mixer.head_dim=3"])
    # (mecheval's main() turns a ConfigError into its one line and exit status 2)
    assert isinstance(result.exception, ConfigError)
    assert str(result.exception) == "model.mixer.head_dim: 3 does not divide model.d_model=16"
    assert not (tmp_path / "runs").exists()
    # in a sweep, one bad run stops the sweep before any folder is prepared
    spec = SweepSpec(
        name="bad",
        base={"preset": "tiny", "task": "ar"},
        grid={"model.architecture": ["attention", "h3"]},
        per_architecture={"h3": {"model.mixer.head_dim": 3}},
    )
    with pytest.raises(ConfigError, match=r"model\.mixer\.head_dim"):
        run_sweep(spec, tmp_path / "sweeps")
    assert not (tmp_path / "sweeps").exists()


def test_a_task_longer_than_a_mixer_can_take_is_a_config_error() -> None:
    from mecheval.training.config import config_from_data, resolve
    from mecheval.training.presets import preset

    # The default ATR documents fit the paper's 1024 positions, so every mixer takes them ...
    for arch in ("hyena", "baseconv"):
        resolve(config_from_data(preset("tiny", "atr", arch), []))
    # ... a longer yield does not fit Hyena's or BaseConv's implicit filter (l_max 1024).
    for arch in ("hyena", "baseconv"):
        cfg = config_from_data(preset("tiny", "atr", arch), ["task.max_yield=1024"])
        with pytest.raises(
            ConfigError, match=r"model\.mixer\.l_max: 1024 is shorter .*\(1027 tokens\)"
        ):
            resolve(cfg)
    # attention has no such limit
    resolve(config_from_data(preset("tiny", "atr", "attention"), ["task.max_yield=1024"]))
