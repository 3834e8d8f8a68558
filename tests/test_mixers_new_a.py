"""Mamba-2 and Gated DeltaNet: the chunked forms against their step-by-step recurrences,
the recurrences against closed forms written out here, whole layers against references
written here from mamba_ssm's / fla's definitions (float64), causality, init, parameter
counts, and option errors. Where transformers is installed, Mamba-2 against its
``Mamba2Mixer`` with the same weights.

The references below share nothing with ``src/`` but the weights; each is shown able to fail
by a deliberately wrong variant that must NOT match at the same tolerance.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from reference_math import assert_same_function, gen, sigmoid, silu, softplus

from mecheval.errors import ConfigError
from mecheval.models import ModelConfig, build_model, site_names
from mecheval.models.backbone import RMSNorm, count_parameters
from mecheval.models.mixers.gated_deltanet import GatedDeltaNet
from mecheval.models.mixers.mamba2 import Mamba2, Mamba2Options
from mecheval.models.mixers.modules import ShortConv
from mecheval.models.ops.decay import balanced_chunks
from mecheval.models.ops.delta_rule import unit_lower_inverse
from mecheval.models.ops.gated_delta_rule import (
    gated_delta_rule_chunked,
    gated_delta_rule_recurrent,
)
from mecheval.models.ops.ssd import ssd_chunked, ssd_recurrent
from mecheval.models.registry import PAPER_ARCHITECTURES, get_architecture, parse_options

DTYPE = torch.float64
VOCAB = 20
# float64 round-off at these sizes is ~1e-14; every wrong variant misses by far more.
TOL = {"rtol": 1e-10, "atol": 1e-10}


def matches(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, **TOL)


def causal_depthwise_conv(y: torch.Tensor, conv: ShortConv) -> torch.Tensor:
    """[B, T, C] -> [B, T, C] with conv1d and k - 1 zeros on the left (the reference's
    ``conv1d(padding=k-1)[..., :T]``)."""
    size = conv.weight.shape[-1]
    out = F.conv1d(
        F.pad(y.transpose(1, 2), (size - 1, 0)), conv.weight, conv.bias, groups=y.shape[-1]
    )
    return out.transpose(1, 2)


def build_mixer(name: str, d_model: int, options: dict, seed: int, std: float = 0.5):
    """The registry's mixer in float64 with every parameter redrawn from N(0, std²)."""
    torch.manual_seed(seed)
    mixer = get_architecture(name).build(0, d_model, parse_options(name, options)).to(DTYPE)
    with torch.no_grad():
        for parameter in mixer.parameters():
            parameter.normal_(0.0, std)
    return mixer.eval()


def build(arch: str, d: int = 16, **mixer) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(
        architecture=arch, d_model=d, n_layers=2, vocab_size=VOCAB, max_len=80, mixer=mixer
    )
    return build_model(cfg)


# ============================================================================================
# SSD (Mamba-2's scan)


def ssd_inputs(seed: int, length: int, heads: int = 4, groups: int = 2, p: int = 3, n: int = 5):
    g = gen(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=DTYPE)

    x = r(2, length, heads, p)
    # Δ over orders of magnitude, as after training: some heads forget at once.
    dt = F.softplus(3 * r(2, length, heads))
    A = -torch.exp(r(heads))
    return x, dt, A, r(2, length, groups, n), r(2, length, groups, n), r(heads)


@pytest.mark.parametrize(
    ("length", "chunk", "groups", "seed"),
    [
        (1, 16, 1, 0),
        (37, 16, 2, 1),
        (53, 16, 1, 2),
        (70, 16, 4, 3),
        (53, 7, 2, 4),
        (70, 64, 1, 5),
        (37, 1, 2, 6),
        (32, 16, 1, 7),
    ],
)
def test_ssd_chunked_equals_recurrent_forward_and_gradients(length, chunk, groups, seed) -> None:
    args = [a.requires_grad_() for a in ssd_inputs(seed, length, groups=groups)]
    fast = ssd_chunked(*args, chunk_size=chunk)
    ref = ssd_recurrent(*args)
    assert_same_function(fast, ref, args, ["x", "dt", "A", "B", "C", "D"], seed + 100, **TOL)


def ssd_closed_form(x, dt, A, B, C, D, *, decay_from: int = 1, skip: bool = True):
    """y_t = Σ_{s≤t} (C_t·B_s) exp(A Σ_{r=s+1..t} dt_r) dt_s x_s + D x_t, per head, as an
    O(T²) double sum. ``decay_from=0`` (decay over r = s..t) and ``skip=False`` are the
    wrong variants."""
    batch, length, heads, _ = x.shape
    per_group = heads // B.shape[2]
    y = torch.zeros_like(x)
    for h in range(heads):
        grp = h // per_group
        for t in range(length):
            for s in range(t + 1):
                span = dt[:, s + decay_from : t + 1, h].sum(1)
                weight = (C[:, t, grp] * B[:, s, grp]).sum(-1) * torch.exp(A[h] * span)
                y[:, t, h] += (weight * dt[:, s, h])[:, None] * x[:, s, h]
            if skip:
                y[:, t, h] += D[h] * x[:, t, h]
    return y


def test_ssd_recurrent_matches_closed_form() -> None:
    args = ssd_inputs(8, 9, heads=4, groups=2)
    expected = ssd_closed_form(*args)
    out = ssd_recurrent(*args)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(ssd_chunked(*args, chunk_size=4), expected, **TOL)
    assert not matches(out, ssd_closed_form(*args, decay_from=0))
    assert not matches(out, ssd_closed_form(*args, skip=False))


def test_ssd_chunked_does_not_overflow_with_large_decays() -> None:
    # Δ·|A| up to ~800 per step: exp(-cumsum) of a naive form overflows float32 at once.
    x, dt, A, B, C, D = (a.float() for a in ssd_inputs(9, 45))
    dt = dt * 50
    A = A * 16
    args = [a.requires_grad_() for a in (x, dt, A, B, C, D)]
    fast = ssd_chunked(*args, chunk_size=16)
    ref = ssd_recurrent(*args)
    assert torch.isfinite(fast).all()
    torch.testing.assert_close(fast, ref, rtol=1e-4, atol=1e-4)
    grads = torch.autograd.grad(fast.square().sum(), args)
    assert all(torch.isfinite(g).all() for g in grads)


# ============================================================================================
# The gated delta rule


def rule_inputs(seed: int, length: int, heads: int = 2, d_k: int = 5, d_v: int = 4):
    g = gen(seed)
    q = torch.randn(2, heads, length, d_k, generator=g, dtype=DTYPE)
    k = torch.randn(2, heads, length, d_k, generator=g, dtype=DTYPE)
    k = k / k.norm(dim=-1, keepdim=True)  # unit keys, as the layer feeds them
    v = torch.randn(2, heads, length, d_v, generator=g, dtype=DTYPE)
    beta = torch.rand(2, heads, length, generator=g, dtype=DTYPE)
    # log-decays from ~0 (keep) to ~-8 (forget at once)
    gate = -F.softplus(2 * torch.randn(2, heads, length, generator=g, dtype=DTYPE))
    return q, k, v, beta, gate


@pytest.mark.parametrize(
    ("length", "chunk", "seed"),
    [
        (1, 16, 0),
        (37, 16, 1),
        (53, 16, 2),
        (70, 16, 3),
        (53, 7, 4),
        (70, 32, 5),
        (9, 1, 6),
        (32, 16, 7),
    ],
)
def test_gated_delta_rule_chunked_equals_recurrent_forward_and_gradients(length, chunk, seed):
    args = [a.requires_grad_() for a in rule_inputs(seed, length)]
    fast = gated_delta_rule_chunked(*args, chunk_size=chunk)
    ref = gated_delta_rule_recurrent(*args)
    assert_same_function(fast, ref, args, ["q", "k", "v", "beta", "g"], seed + 100, **TOL)


def test_gated_delta_rule_chunked_does_not_overflow_with_large_decays() -> None:
    q, k, v, beta, g = (a.float() for a in rule_inputs(3, 45))
    args = [a.requires_grad_() for a in (q, k, v, beta, g * 100)]  # log-decays down to -500
    fast = gated_delta_rule_chunked(*args, chunk_size=16)
    torch.testing.assert_close(fast, gated_delta_rule_recurrent(*args), rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(fast.square().sum(), args)
    assert all(torch.isfinite(grad).all() for grad in grads)


def test_gated_delta_rule_by_hand() -> None:
    # d_k = 2, d_v = 1, one head; q_t = (1, 1) reads the sum of the two stored values.
    # t=1: α=1,   k=e1, v=1, β=1   -> S = [1, 0]                          o = 1
    # t=2: α=1/2, k=e2, v=2, β=1/2 -> S = [1/2, 0] + 1/2 (2 - 0) e2ᵀ = [1/2, 1]   o = 3/2
    # t=3: α=1/2, k=e1, v=3, β=1   -> decayed [1/4, 1/2]; error 3 - 1/4 = 11/4
    #                                 S = [3, 1/2]                         o = 7/2
    e1, e2 = [1.0, 0.0], [0.0, 1.0]
    k = torch.tensor([[[e1, e2, e1]]], dtype=DTYPE)
    v = torch.tensor([[[[1.0], [2.0], [3.0]]]], dtype=DTYPE)
    q = torch.ones(1, 1, 3, 2, dtype=DTYPE)
    beta = torch.tensor([[[1.0, 0.5, 1.0]]], dtype=DTYPE)
    g = torch.log(torch.tensor([[[1.0, 0.5, 0.5]]], dtype=DTYPE))
    expected = torch.tensor([1.0, 1.5, 3.5], dtype=DTYPE)
    torch.testing.assert_close(gated_delta_rule_recurrent(q, k, v, beta, g)[0, 0, :, 0], expected)
    for chunk in (1, 2, 3):
        out = gated_delta_rule_chunked(q, k, v, beta, g, chunk)
        torch.testing.assert_close(out[0, 0, :, 0], expected)


def gated_delta_product_form(q, k, v, beta, g, *, gate_prediction: bool = True):
    """S_t = α_t S_{t-1} (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ, o_t = S_t q_t (Yang et al. 2025,
    eq. 10), per batch element and head. ``gate_prediction=False`` (the error read from the
    undecayed state) is the wrong variant."""
    batch, heads, length, d_k = k.shape
    out = torch.zeros(batch, heads, length, v.shape[-1], dtype=v.dtype)
    eye = torch.eye(d_k, dtype=v.dtype)
    for b in range(batch):
        for h in range(heads):
            state = torch.zeros(v.shape[-1], d_k, dtype=v.dtype)
            for t in range(length):
                alpha, bt = math.exp(g[b, h, t]), beta[b, h, t]
                kt = k[b, h, t]
                erase = eye - bt * torch.outer(kt, kt)
                if gate_prediction:
                    state = alpha * state @ erase + bt * torch.outer(v[b, h, t], kt)
                else:
                    state = alpha * state + bt * torch.outer(v[b, h, t] - state @ kt, kt)
                out[b, h, t] = state @ q[b, h, t]
    return out


def test_gated_delta_rule_matches_product_form() -> None:
    args = rule_inputs(11, 10)
    expected = gated_delta_product_form(*args)
    torch.testing.assert_close(gated_delta_rule_recurrent(*args), expected, **TOL)
    torch.testing.assert_close(gated_delta_rule_chunked(*args, chunk_size=4), expected, **TOL)
    wrong = gated_delta_product_form(*args, gate_prediction=False)
    assert not matches(gated_delta_rule_recurrent(*args), wrong)


# ============================================================================================
# Whole layers against references written from mamba_ssm / fla


def mamba2_reference(m: Mamba2, u: torch.Tensor, *, gate_after_norm: bool = False):
    """mamba_ssm's Mamba2 forward (conv + SSD + RMSNormGated(norm_before_gate=False) +
    out_proj) from the mixer's weights, the SSD as the O(T²) closed form.
    ``gate_after_norm`` (fla's order) is the wrong variant."""
    batch, length, _ = u.shape
    di, heads, p, groups, n = m.d_inner, m.nheads, m.headdim, m.ngroups, m.d_state
    zxbcdt = u @ m.in_proj.weight.T
    z, xbc, dt = zxbcdt.split([di, di + 2 * groups * n, heads], dim=-1)
    xbc = silu(causal_depthwise_conv(xbc, m.conv))
    x, B, C = xbc.split([di, groups * n, groups * n], dim=-1)
    delta = softplus(dt + m.dt_bias)
    y = ssd_closed_form(
        x.reshape(batch, length, heads, p),
        delta,
        -torch.exp(m.A_log),
        B.reshape(batch, length, groups, n),
        C.reshape(batch, length, groups, n),
        m.D,
    ).reshape(batch, length, di)
    if not gate_after_norm:
        y = y * silu(z)
    y = y.reshape(batch, length, groups, di // groups)  # one norm per group of channels
    y = y * torch.rsqrt((y * y).mean(-1, keepdim=True) + m.norm.eps)
    y = y.reshape(batch, length, di) * m.norm.weight
    if gate_after_norm:
        y = y * silu(z)
    return y @ m.out_proj.weight.T


@pytest.mark.parametrize(
    "options", [{}, {"ngroups": 2, "headdim": 8}, {"d_state": 3, "chunk_size": 4, "d_conv": 2}]
)
def test_mamba2_layer_matches_reference(options: dict) -> None:
    mixer = build_mixer("mamba2", 16, options, seed=3, std=0.3)
    assert isinstance(mixer, Mamba2)
    x = torch.randn(2, 11, 16, dtype=DTYPE, generator=gen(4))
    with torch.no_grad():
        out = mixer.mix(x)
        assert_close = torch.testing.assert_close
        assert_close(out, mamba2_reference(mixer, x), **TOL)
        assert not matches(out, mamba2_reference(mixer, x, gate_after_norm=True))


def gated_deltanet_reference(
    m: GatedDeltaNet, x: torch.Tensor, *, scale_q: bool = True, norm_after_gate: bool = False
):
    """fla's GatedDeltaNet forward (use_gate=True) from the mixer's weights, the rule in its
    product form. ``scale_q=False`` and ``norm_after_gate`` are the wrong variants."""
    batch, length, _ = x.shape
    heads, d_k, d_v = m.num_heads, m.head_k_dim, m.head_v_dim

    def branch(proj, conv, size):
        y = silu(causal_depthwise_conv(x @ proj.weight.T, conv))
        return y.reshape(batch, length, heads, size).permute(0, 2, 1, 3)  # [B, H, T, size]

    def l2norm(y):
        return y * torch.rsqrt((y * y).sum(-1, keepdim=True) + 1e-6)

    q = l2norm(branch(m.q_proj, m.q_conv, d_k))
    k = l2norm(branch(m.k_proj, m.k_conv, d_k))
    v = branch(m.v_proj, m.v_conv, d_v)
    if scale_q:
        q = q * d_k**-0.5
    beta = sigmoid(x @ m.b_proj.weight.T).permute(0, 2, 1)
    g = (-torch.exp(m.A_log) * softplus(x @ m.a_proj.weight.T + m.dt_bias)).permute(0, 2, 1)
    o = gated_delta_product_form(q, k, v, beta, g).permute(0, 2, 1, 3)  # [B, T, H, d_v]
    gate = (x @ m.g_proj.weight.T).reshape(batch, length, heads, d_v)
    if norm_after_gate:
        o = o * silu(gate)
    o = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + m.o_norm.eps) * m.o_norm.weight
    if not norm_after_gate:
        o = o * silu(gate)
    return o.reshape(batch, length, heads * d_v) @ m.o_proj.weight.T


@pytest.mark.parametrize("options", [{}, {"num_heads": 2, "chunk_size": 4, "expand_v": 1.5}])
def test_gated_deltanet_layer_matches_reference(options: dict) -> None:
    mixer = build_mixer("gated_deltanet", 8, options, seed=5)
    assert isinstance(mixer, GatedDeltaNet)
    x = torch.randn(2, 10, 8, dtype=DTYPE, generator=gen(6))
    with torch.no_grad():
        out = mixer.mix(x)
        torch.testing.assert_close(out, gated_deltanet_reference(mixer, x), **TOL)
        assert not matches(out, gated_deltanet_reference(mixer, x, scale_q=False))
        assert not matches(out, gated_deltanet_reference(mixer, x, norm_after_gate=True))


def test_gated_deltanet_without_gate_is_a_plain_head_norm() -> None:
    mixer = build_mixer("gated_deltanet", 8, {"use_gate": False}, seed=7)
    assert not hasattr(mixer, "g_proj")
    x = torch.randn(1, 6, 8, dtype=DTYPE, generator=gen(8))
    with torch.no_grad():
        o = gated_delta_rule_recurrent(*mixer.rule_inputs(x)).transpose(1, 2)
        o = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + 1e-5) * mixer.o_norm.weight
        torch.testing.assert_close(mixer.mix(x), mixer.o_proj(o.flatten(2)), **TOL)


# ============================================================================================
# Modules: chunked = recurrent, causality


MODULE_CASES = [
    ("mamba2", {}),
    ("mamba2", {"chunk_size": 5, "headdim": 4, "ngroups": 2}),
    ("mamba2", {"d_conv": None, "chunk_size": 7}),
    ("gated_deltanet", {}),
    ("gated_deltanet", {"num_heads": 2, "chunk_size": 5}),
]


@pytest.mark.parametrize(("arch", "options"), MODULE_CASES)
def test_module_mix_equals_mix_recurrent(arch: str, options: dict) -> None:
    torch.manual_seed(0)
    mixer = get_architecture(arch).build(0, 16, parse_options(arch, options)).to(DTYPE)
    x = torch.randn(3, 37, 16, dtype=DTYPE, generator=gen(1), requires_grad=True)
    fast, ref = mixer.mix(x), mixer.mix_recurrent(x)
    torch.testing.assert_close(fast, ref, **TOL)
    w = torch.randn(fast.shape, dtype=DTYPE, generator=gen(2))
    params = [x, *mixer.parameters()]
    g_fast = torch.autograd.grad((fast * w).sum(), params)
    g_ref = torch.autograd.grad((ref * w).sum(), params)
    for a, b in zip(g_fast, g_ref, strict=True):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize(("arch", "options"), MODULE_CASES)
def test_layer_is_causal(arch: str, options: dict) -> None:
    mixer = build_mixer(arch, 16, options, seed=2, std=0.3)
    x = torch.randn(2, 29, 16, dtype=DTYPE, generator=gen(5))
    with torch.no_grad():
        base = mixer(x)
        for p in (0, 5, 16, 28):
            y = x.clone()
            y[:, p] += torch.randn(2, 16, dtype=DTYPE, generator=gen(p))
            out = mixer(y)
            assert torch.equal(out[:, :p], base[:, :p]), p
            assert not torch.allclose(out[:, p], base[:, p])


# ============================================================================================
# Structure, sites, init, parameter counts


def test_registered_beyond_the_paper() -> None:
    assert "mamba2" not in PAPER_ARCHITECTURES and "gated_deltanet" not in PAPER_ARCHITECTURES
    m2, gdn = get_architecture("mamba2"), get_architecture("gated_deltanet")
    assert (m2.display, m2.mlp, m2.norm, m2.init) == ("Mamba-2", False, "rms", "mamba")
    assert (gdn.display, gdn.mlp, gdn.norm, gdn.init) == (
        "Gated DeltaNet",
        True,
        "layer",
        "zoology",
    )
    model = build("mamba2")
    for layer in model.layers:
        assert layer.mlp is None and isinstance(layer.mixer_norm, RMSNorm)


def test_sites_of_the_short_convs() -> None:
    names = set(site_names(build("mamba2")))
    assert {"layers.0.mixer.conv.output", "layers.1.mixer.conv.output"} <= names
    conv = build("mamba2").get_submodule("layers.0.mixer.conv")
    assert conv.weight.shape == (32 + 2 * 64, 1, 4)  # x, B and C in one conv, as the reference
    assert not any(".conv." in n for n in site_names(build("mamba2", d_conv=None)))
    names = set(site_names(build("gated_deltanet")))
    for i in range(2):
        assert {f"layers.{i}.mixer.{c}_conv.output" for c in "qkv"} <= names


@pytest.mark.parametrize(("d_model", "headdim", "heads"), [(16, 32, 1), (64, 64, 2), (48, 32, 3)])
def test_mamba2_default_headdim(d_model: int, headdim: int, heads: int) -> None:
    m = Mamba2(d_model, Mamba2Options())
    assert (m.headdim, m.nheads) == (headdim, heads)


def test_mamba2_init_matches_mamba_ssm() -> None:
    # 256 heads (headdim 1) so that the init's ranges are sampled densely.
    m = build("mamba2", d=128, headdim=1).layers[0].mixer
    dt = F.softplus(m.dt_bias.detach())
    assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 1e-1 * (1 + 1e-5)
    # log-uniform: the log is spread over the whole range, its median near the middle
    log_dt = dt.log()
    assert log_dt.min() < math.log(2e-3) and log_dt.max() > math.log(5e-2)
    assert abs(log_dt.median() - math.log(1e-2)) < 0.5
    A = torch.exp(m.A_log.detach())
    assert A.min() >= 1.0 and A.max() <= 16.0 and A.min() < 2.0 and A.max() > 15.0
    assert abs(A.mean() - 8.5) < 1.0  # uniform on [1, 16]
    torch.testing.assert_close(m.D.detach(), torch.ones(256))
    torch.testing.assert_close(m.norm.weight.detach(), torch.ones(256))
    # mamba_ssm's LM init: PyTorch's default Linear init (bound 1/sqrt(fan_in)), out_proj
    # divided by sqrt(n_layers); the conv keeps Conv1d's default (bound 1/sqrt(k)).
    bound = 128**-0.5
    assert m.in_proj.weight.abs().max() <= bound and m.in_proj.weight.abs().max() > 0.9 * bound
    bound = 256**-0.5 / math.sqrt(2)
    assert m.out_proj.weight.abs().max() <= bound and m.out_proj.weight.abs().max() > 0.9 * bound
    assert m.conv.weight.abs().max() <= 0.5 and m.conv.bias.abs().max() > 0


@pytest.mark.parametrize("dt", [1e-3, 0.05, 0.5])
def test_mamba2_dt_bias_is_inverse_softplus(dt: float) -> None:
    m = Mamba2(16, Mamba2Options(dt_min=dt, dt_max=dt, headdim=1))
    torch.testing.assert_close(
        F.softplus(m.dt_bias.detach()), torch.full((32,), dt), rtol=1e-5, atol=0
    )


def test_gated_deltanet_init_matches_fla() -> None:
    model = build("gated_deltanet", d=64, num_heads=64, head_dim=1)
    m = model.layers[1].mixer
    dt = F.softplus(m.dt_bias.detach())
    assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 1e-1 * (1 + 1e-5)
    assert dt.min() < 3e-3 and dt.max() > 3e-2
    A = torch.exp(m.A_log.detach())
    assert A.min() >= 0.0 and A.max() <= 16.0 and A.min() < 2.0 and A.max() > 14.0
    torch.testing.assert_close(m.o_norm.weight.detach(), torch.ones(2))
    # zoology init: every Linear N(0, init_std), o_proj not rescaled (only out_proj/fc2 are)
    for proj in ("q_proj", "k_proj", "v_proj", "g_proj", "o_proj"):
        std = getattr(m, proj).weight.std().item()
        assert abs(std - 0.02) < 0.004, proj
    assert m.q_conv.bias is None and m.q_conv.weight.abs().max() <= 0.5


def mamba2_mixer_count(d: int, d_state=64, expand=2, headdim=None, ngroups=1, d_conv=4) -> int:
    """Parameters of mamba_ssm's Mamba2 from its shapes (bias=False, conv_bias=True)."""
    d_inner = expand * d
    heads = d_inner // (headdim or math.gcd(64, d_inner))
    conv_dim = d_inner + 2 * ngroups * d_state
    in_proj = d * (2 * d_inner + 2 * ngroups * d_state + heads)
    conv = conv_dim * d_conv + conv_dim
    return in_proj + conv + 3 * heads + d_inner + d_inner * d  # dt_bias, A_log, D; norm; out


def gdn_mixer_count(d: int, heads=1, head_dim=None, expand_v=2.0, conv=4, use_gate=True) -> int:
    """Parameters of fla's GatedDeltaNet from its shapes (no biases)."""
    key = heads * (head_dim or d // heads)
    value = int(key * expand_v)
    projections = 2 * d * key + d * value + 2 * d * heads + value * d  # q, k, v, a, b, o
    gate = d * value if use_gate else 0
    return projections + gate + 2 * heads + conv * (2 * key + value) + value // heads


def lm_count(d: int, vocab: int, mixer: int, mlp: bool, rms: bool, layers: int = 2) -> int:
    block_norm = d if rms else 2 * d
    mlp_params = (2 * d + d * 4 * d + 4 * d + 4 * d * d + d) if mlp else 0  # LN + fc1 + fc2
    return vocab * d + layers * (block_norm + mixer + mlp_params) + 2 * d  # tied head, final LN


@pytest.mark.parametrize(
    ("arch", "options", "mixer_count"),
    [
        ("mamba2", {}, mamba2_mixer_count(64)),
        (
            "mamba2",
            {"d_state": 128, "headdim": 16, "ngroups": 2},
            mamba2_mixer_count(64, d_state=128, headdim=16, ngroups=2),
        ),
        ("gated_deltanet", {}, gdn_mixer_count(64)),
        (
            "gated_deltanet",
            {"num_heads": 4, "use_gate": False},
            gdn_mixer_count(64, heads=4, use_gate=False),
        ),
    ],
)
def test_parameter_counts_equal_the_reference_shapes(arch, options, mixer_count) -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(architecture=arch, d_model=64, n_layers=2, vocab_size=8192, mixer=options)
    model = build_model(cfg)
    assert count_parameters(model.layers[0].mixer) == mixer_count
    a = get_architecture(arch)
    assert count_parameters(model) == lm_count(64, 8192, mixer_count, a.mlp, a.norm == "rms")


def test_parameter_counts_at_d64() -> None:
    # The numbers reported for the quick preset's width (vocab 8192, 2 layers, no positions).
    assert mamba2_mixer_count(64) == 34_310
    assert gdn_mixer_count(64) == 34_050
    assert lm_count(64, 8192, 34_310, mlp=False, rms=True) == 593_164
    assert lm_count(64, 8192, 34_050, mlp=True, rms=False) == 659_204


# ============================================================================================
# Options


@pytest.mark.parametrize(
    ("arch", "options", "field"),
    [
        ("mamba2", {"headdim": 7}, "model.mixer.headdim"),
        ("mamba2", {"headdim": 0}, "model.mixer.headdim"),
        ("mamba2", {"ngroups": 3}, "model.mixer.ngroups"),
        ("mamba2", {"d_conv": 0}, "model.mixer.d_conv"),
        ("mamba2", {"d_state": 0}, "model.mixer.d_state"),
        ("mamba2", {"chunk_size": 0}, "model.mixer.chunk_size"),
        ("mamba2", {"dt_min": 0.2, "dt_max": 0.1}, "model.mixer.dt_max"),
        ("mamba2", {"A_init_range": [0.0, 4.0]}, "model.mixer.A_init_range"),
        ("mamba2", {"A_init_range": [4.0, 1.0]}, "model.mixer.A_init_range"),
        ("mamba2", {"d_sate": 16}, "model.mixer.d_sate"),
        ("gated_deltanet", {"num_heads": 3}, "model.mixer.num_heads"),
        ("gated_deltanet", {"num_heads": 0}, "model.mixer.num_heads"),
        ("gated_deltanet", {"conv_size": 0}, "model.mixer.conv_size"),
        ("gated_deltanet", {"expand_v": 0.3}, "model.mixer.expand_v"),
        ("gated_deltanet", {"chunk_size": 0}, "model.mixer.chunk_size"),
        ("gated_deltanet", {"use_beta": True}, "model.mixer.use_beta"),
    ],
)
def test_bad_options_give_one_line_naming_the_field(arch, options, field) -> None:
    with pytest.raises(ConfigError) as err:
        build(arch, **options)
    message = str(err.value)
    assert message.startswith(field) and "\n" not in message, message


# ============================================================================================
# transformers' Mamba2Mixer (torch path), where installed


def test_mamba2_matches_transformers_mamba2mixer() -> None:
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed: no Mamba2Mixer to compare with"
    )
    from transformers.models.mamba2 import modeling_mamba2

    d = 16
    ours = build_mixer("mamba2", d, {"headdim": 8, "d_state": 4, "chunk_size": 4}, seed=1, std=0.3)
    ours = ours.float()
    config = transformers.Mamba2Config(
        hidden_size=d,
        num_heads=ours.nheads,
        head_dim=ours.headdim,
        state_size=ours.d_state,
        expand=2,
        n_groups=1,
        conv_kernel=4,
        chunk_size=4,
        use_bias=False,
        use_conv_bias=True,
        layer_norm_epsilon=1e-5,
        num_hidden_layers=1,
    )
    theirs = modeling_mamba2.Mamba2Mixer(config, layer_idx=0).float().eval()
    with torch.no_grad():
        theirs.in_proj.weight.copy_(ours.in_proj.weight)
        theirs.conv1d.weight.copy_(ours.conv.weight)
        theirs.conv1d.bias.copy_(ours.conv.bias)
        for name in ("dt_bias", "A_log", "D"):
            getattr(theirs, name).copy_(getattr(ours, name))
        theirs.norm.weight.copy_(ours.norm.weight)
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        x = torch.randn(2, 11, d, generator=gen(3))
        # transformers 4.x names its pure-torch path torch_forward; 5.x runs it in forward when
        # no CUDA kernel applies (eval mode, no cache).
        forward = getattr(theirs, "torch_forward", theirs)
        torch.testing.assert_close(ours.mix(x), forward(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("length", "chunk", "expected"),
    [
        (35, 64, (1, 35)),
        (70, 64, (2, 35)),
        (37, 16, (3, 13)),
        (32, 16, (2, 16)),
        (1, 16, (1, 1)),
        (9, 1, (9, 1)),
        (65, 64, (2, 33)),
    ],
)
def test_balanced_chunks(length: int, chunk: int, expected: tuple[int, int]) -> None:
    n, c = balanced_chunks(length, chunk)
    assert (n, c) == expected
    assert c <= chunk and n * c >= length > (n - 1) * c


def test_unit_lower_inverse_and_its_adjoint() -> None:
    # strictly lower part only; the entries on and above the diagonal are not read
    m = torch.randn(2, 3, 9, 9, generator=gen(3), dtype=DTYPE)
    inverse = unit_lower_inverse(m)
    eye = torch.eye(9, dtype=DTYPE)
    torch.testing.assert_close(inverse @ (eye + m.tril(-1)), eye.expand_as(m), **TOL)
    torch.testing.assert_close(unit_lower_inverse(m.tril(-1) + 5 * m.triu()), inverse, **TOL)
    assert torch.autograd.gradcheck(unit_lower_inverse, (m.tril(-1).requires_grad_(),))
