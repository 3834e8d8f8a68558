"""GLA, RetNet and Hawk: the fast forms against their step-by-step recurrences, the recurrences
against closed forms written out here (double sums with explicit products of the gates), each
layer against its reference's wiring written out here from the reference code (fla's
``GatedLinearAttention`` and ``MultiScaleRetention``, recurrentgemma's ``RecurrentBlock``),
causality, init statistics, parameter counts and bad options."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mecheval.errors import ConfigError
from mecheval.models import ModelConfig, build_model, site_names
from mecheval.models.backbone import count_parameters
from mecheval.models.mixers.gla import GLA, GLAOptions
from mecheval.models.mixers.hawk import Hawk, HawkOptions
from mecheval.models.mixers.retnet import RetNet, RetNetOptions, rotary
from mecheval.models.ops.gla import gla_chunked, gla_recurrent
from mecheval.models.ops.retention import retention_decays, retention_parallel, retention_recurrent
from mecheval.models.ops.rglru import (
    rglru_scan,
    rglru_scan_chunked,
    rglru_scan_recurrent,
    sqrt_bound_derivative,
)

DTYPE = torch.float64
VOCAB = 20


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed: int, dtype=DTYPE) -> torch.Tensor:
    return torch.randn(*shape, generator=gen(seed), dtype=dtype)


def assert_same_function(fast_fn, ref_fn, inputs, seed: int, tol: float = 1e-10) -> None:
    """fast_fn(*inputs) == ref_fn(*inputs), and so are the gradients of a random projection."""
    inputs = [x.clone().requires_grad_() for x in inputs]
    fast, ref = fast_fn(*inputs), ref_fn(*inputs)
    assert fast.shape == ref.shape
    torch.testing.assert_close(fast, ref, rtol=tol, atol=tol)
    w = randn(*ref.shape, seed=seed + 1000, dtype=ref.dtype)
    g_fast = torch.autograd.grad((fast * w).sum(), inputs, materialize_grads=True)
    g_ref = torch.autograd.grad((ref * w).sum(), inputs, materialize_grads=True)
    for a, b in zip(g_fast, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


LENGTHS = [
    (1, 16, 0),
    (11, 16, 7),
    (37, 16, 1),
    (53, 16, 2),
    (70, 16, 3),
    (70, 32, 4),
    (45, 7, 5),
    (9, 1, 6),
]


# ------------------------------------------------------------------------------------- GLA


def gla_inputs(seed: int, length: int, heads: int = 2, d_k: int = 4, d_v: int = 3, scale=1.0):
    q = randn(2, heads, length, d_k, seed=seed)
    k = randn(2, heads, length, d_k, seed=seed + 1)
    v = randn(2, heads, length, d_v, seed=seed + 2)
    # log-gates over orders of magnitude (some channels keep, some forget almost at once)
    g = F.logsigmoid(3 * randn(2, heads, length, d_k, seed=seed + 3)) * scale
    return q, k, v, g


@pytest.mark.parametrize(("length", "chunk", "seed"), LENGTHS)
def test_gla_chunked_equals_recurrent(length: int, chunk: int, seed: int) -> None:
    assert_same_function(
        lambda *a: gla_chunked(*a, chunk_size=chunk), gla_recurrent, gla_inputs(seed, length), seed
    )


@pytest.mark.parametrize(
    ("length", "chunk", "sub", "seed"),
    [(37, 16, 1, 11), (37, 16, 5, 12), (53, 64, 7, 13), (70, 64, 64, 14), (9, 4, 2, 15)],
)
def test_gla_sub_chunks_equal_recurrent(length: int, chunk: int, sub: int, seed: int) -> None:
    # sub-chunks of one step (every key split at the query), of several, of the whole chunk
    assert_same_function(
        lambda *a: gla_chunked(*a, chunk_size=chunk, sub_chunk_size=sub),
        gla_recurrent,
        gla_inputs(seed, length),
        seed,
    )


def gla_closed_form(q, k, v, g):
    """o_t = Σ_{s<=t} Σ_j q_tj (Π_{s<r<=t} exp(g_rj)) k_sj v_s, the products written out."""
    b, h, length, d_k = q.shape
    out = torch.zeros(b, h, length, v.shape[-1], dtype=q.dtype)
    for t in range(length):
        for s in range(t + 1):
            prod = torch.ones(b, h, d_k, dtype=q.dtype)
            for r in range(s + 1, t + 1):
                prod = prod * torch.exp(g[:, :, r])
            out[:, :, t] += (q[:, :, t] * prod * k[:, :, s]).sum(-1, keepdim=True) * v[:, :, s]
    return out


def test_gla_recurrence_equals_closed_form() -> None:
    args = gla_inputs(7, 11)
    expected = gla_closed_form(*args)
    torch.testing.assert_close(gla_recurrent(*args), expected, rtol=1e-12, atol=1e-12)
    # able to fail: a decay applied once too often (from s instead of s + 1) differs
    q, k, v, g = args
    wrong = gla_closed_form(q, k * torch.exp(g), v, g)
    assert not torch.allclose(gla_recurrent(*args), wrong, rtol=1e-6, atol=1e-6)


def test_gla_chunked_survives_strong_gates_in_float32() -> None:
    # log-gates down to -60 per step: any exp(+cumulative) would overflow float32 within a chunk
    q, k, v, g = (x.float() for x in gla_inputs(8, 40, scale=20.0))
    fast = gla_chunked(q, k, v, g, chunk_size=16)
    assert torch.isfinite(fast).all()
    torch.testing.assert_close(fast, gla_recurrent(q, k, v, g), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------- RetNet


def retention_inputs(seed: int, length: int, heads: int = 3, d_k: int = 4, d_v: int = 5):
    q = randn(2, heads, length, d_k, seed=seed)
    k = randn(2, heads, length, d_k, seed=seed + 1)
    v = randn(2, heads, length, d_v, seed=seed + 2)
    return q, k, v


@pytest.mark.parametrize(("length", "seed"), [(1, 0), (37, 1), (53, 2), (70, 3)])
def test_retention_parallel_equals_recurrent(length: int, seed: int) -> None:
    gamma = retention_decays(3)
    assert_same_function(
        lambda *a: retention_parallel(*a, gamma),
        lambda *a: retention_recurrent(*a, gamma),
        retention_inputs(seed, length),
        seed,
    )


def test_retention_recurrence_equals_closed_form() -> None:
    q, k, v = retention_inputs(4, 10)
    gamma = retention_decays(3)
    expected = torch.zeros(2, 3, 10, 5, dtype=DTYPE)
    for h in range(3):
        for t in range(10):
            for s in range(t + 1):
                decay = 1.0
                for _ in range(t - s):
                    decay = decay * gamma[h].item()
                score = (q[:, h, t] * k[:, h, s]).sum(-1, keepdim=True)
                expected[:, h, t] += decay * score * v[:, h, s]
    torch.testing.assert_close(retention_recurrent(q, k, v, gamma), expected)
    torch.testing.assert_close(retention_parallel(q, k, v, gamma), expected)
    # able to fail: the heads' decays swapped
    swapped = retention_recurrent(q, k, v, gamma.flip(0))
    assert not torch.allclose(swapped, expected, rtol=1e-6, atol=1e-6)


def test_retention_decays_are_exactly_fla_s() -> None:
    gamma = retention_decays(8)
    assert gamma.tolist() == [1 - 2 ** (-5 - h) for h in range(8)]
    mixer = RetNet(16, RetNetOptions())
    assert mixer.decays().tolist() == [1 - 2 ** (-5 - h) for h in range(8)]
    assert RetNet(64, RetNetOptions(num_heads=4)).decays().tolist() == gamma[:4].tolist()


def rotary_reference(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE as a complex rotation: the pair (x_i, x_{i+D/2}) is the number x_i + i x_{i+D/2},
    multiplied by exp(i t θ_i), θ_i = base^(-2i/D) (fla's non-interleaved layout)."""
    b, t, h, d = x.shape
    z = torch.complex(x[..., : d // 2], x[..., d // 2 :])
    theta = base ** (-2 * torch.arange(d // 2, dtype=DTYPE) / d)
    angle = torch.arange(t, dtype=DTYPE)[:, None] * theta  # [T, D/2]
    z = z * torch.polar(torch.ones_like(angle), angle)[:, None, :]
    return torch.cat([z.real, z.imag], dim=-1)


def retnet_reference(m: RetNet, x: torch.Tensor) -> torch.Tensor:
    """fla's MultiScaleRetention written out: q, k, v, g projections; RoPE on q and k per head;
    o_t = Σ_s γ^(t-s) (q_t·k_s / sqrt(d_k/H)) v_s; RMSNorm per head (shared weight) times
    swish(g); o_proj."""
    b, t, _ = x.shape
    h, dk, dv = m.num_heads, m.head_k_dim, m.head_v_dim
    q = rotary_reference((x @ m.q_proj.weight.T).view(b, t, h, dk))
    k = rotary_reference((x @ m.k_proj.weight.T).view(b, t, h, dk))
    v = (x @ m.v_proj.weight.T).view(b, t, h, dv)
    o = torch.zeros(b, t, h, dv, dtype=x.dtype)
    for head in range(h):
        gamma = 1 - 2 ** (-5 - head)
        for i in range(t):
            for s in range(i + 1):
                score = (q[:, i, head] * k[:, s, head]).sum(-1, keepdim=True) / math.sqrt(dk)
                o[:, i, head] += gamma ** (i - s) * score * v[:, s, head]
    eps = m.g_norm_swish_gate.eps
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * m.g_norm_swish_gate.weight
    g = (x @ m.g_proj.weight.T).view(b, t, h, dv)
    return (o * g * torch.sigmoid(g)).reshape(b, t, h * dv) @ m.o_proj.weight.T


@pytest.mark.parametrize("num_heads", [8, 2])
def test_retnet_layer_equals_fla_wiring(num_heads: int) -> None:
    torch.manual_seed(0)
    m = RetNet(16, RetNetOptions(num_heads=num_heads)).double()
    with torch.no_grad():
        m.g_norm_swish_gate.weight.copy_(1 + 0.3 * randn(m.head_v_dim, seed=1))
        x = randn(2, 13, 16, seed=2)
        expected = retnet_reference(m, x)
        torch.testing.assert_close(m.mix(x), expected, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(m.mix_recurrent(x), expected, rtol=1e-10, atol=1e-12)


def test_rotary_scores_depend_on_relative_position_only() -> None:
    m = RetNet(16, RetNetOptions(num_heads=2)).double()
    q0, k0 = randn(1, 1, 1, 8, seed=3), randn(1, 1, 1, 8, seed=4)
    # the same q and k at every position: q_t·k_s after RoPE depends on t - s only
    x = torch.cat([q0.expand(1, 20, 1, 8), k0.expand(1, 20, 1, 8)], dim=2)
    r = rotary(x, m.options.rotary_base)
    scores = r[0, :, 0] @ r[0, :, 1].T
    torch.testing.assert_close(scores[5, 2], scores[15, 12])
    torch.testing.assert_close(scores[7, 7], (q0 * k0).sum())
    assert not torch.allclose(scores[5, 2], scores[5, 3])


# ------------------------------------------------------------------------------------ Hawk


def scan_inputs(seed: int, length: int, width: int = 6, dtype=DTYPE):
    log_a = -F.softplus(3 * randn(2, length, width, seed=seed, dtype=dtype))
    return log_a, randn(2, length, width, seed=seed + 1, dtype=dtype)


@pytest.mark.parametrize(("length", "chunk", "seed"), LENGTHS)
def test_rglru_scan_chunked_equals_recurrent(length: int, chunk: int, seed: int) -> None:
    assert_same_function(
        lambda *a: rglru_scan_chunked(*a, chunk_size=chunk),
        rglru_scan_recurrent,
        scan_inputs(seed, length),
        seed,
    )


@pytest.mark.parametrize(("length", "seed"), [(1, 0), (2, 1), (11, 7), (37, 1), (70, 3)])
def test_rglru_scan_equals_recurrent(length: int, seed: int) -> None:
    # the forward pass's scan (hand-written adjoint): forward and gradients
    assert_same_function(rglru_scan, rglru_scan_recurrent, scan_inputs(seed, length), seed)


def test_rglru_scan_equals_closed_form() -> None:
    log_a, x = scan_inputs(9, 12)
    a = torch.exp(log_a)
    expected = torch.zeros_like(x)
    for t in range(12):
        for s in range(t + 1):
            prod = torch.ones_like(x[:, 0])
            for r in range(s + 1, t + 1):
                prod = prod * a[:, r]
            expected[:, t] += prod * x[:, s]
    torch.testing.assert_close(rglru_scan_recurrent(log_a, x), expected)
    torch.testing.assert_close(rglru_scan_chunked(log_a, x, 5), expected)
    torch.testing.assert_close(rglru_scan(log_a, x), expected)


def test_rglru_scan_survives_strong_decays_in_float32() -> None:
    log_a, x = scan_inputs(10, 50, dtype=torch.float32)
    log_a = log_a * 40  # down to ~ -500 per step
    for fast in (rglru_scan_chunked(log_a, x, 16), rglru_scan(log_a, x)):
        assert torch.isfinite(fast).all()
        torch.testing.assert_close(fast, rglru_scan_recurrent(log_a, x), rtol=1e-5, atol=1e-6)


def test_sqrt_gradient_is_clipped_as_the_reference() -> None:
    x = torch.tensor([1e-12, 0.25, 1.0], dtype=DTYPE, requires_grad=True)
    (grad,) = torch.autograd.grad(sqrt_bound_derivative(x).sum(), x)
    torch.testing.assert_close(sqrt_bound_derivative(x).detach(), x.detach().sqrt())
    torch.testing.assert_close(grad, torch.tensor([1000.0, 1.0, 0.5], dtype=DTYPE))


def hawk_reference(m: Hawk, x: torch.Tensor) -> torch.Tensor:
    """recurrentgemma's RecurrentBlock written out, one document from position 0: y branch
    GeLU(tanh); x branch Linear, Conv1D (w[k-1-shift] on x[t-shift], bias), RG-LRU with
    per-block gates, a_t = exp(-8 r_t softplus(Λ)), the reset at t = 0 (a multiplied by 0,
    multiplier 1), h_t = a_t h_{t-1} + sqrt(1 - a_t²) i_t x_t; linear_out(x * y)."""
    b, t, _ = x.shape
    y = F.gelu(x @ m.linear_y.weight.T + m.linear_y.bias, approximate="tanh")
    u = x @ m.linear_x.weight.T + m.linear_x.bias
    k = m.conv.kernel_size
    w = m.conv.weight[:, 0].T  # [k, W]: the reference's Conv1D.w layout
    conv = torch.zeros_like(u) + m.conv.bias
    for shift in range(min(k, t)):
        window = torch.cat([torch.zeros_like(u[:, :shift]), u[:, : t - shift]], dim=1)
        conv = conv + window * w[k - shift - 1]
    lru = m.rg_lru
    nb, bw = lru.input_gate.num_blocks, lru.input_gate.block_width

    def block_diagonal(layer, z):
        out = []
        for i in range(nb):
            out.append(z[..., i * bw : (i + 1) * bw] @ layer.w[i] + layer.b[i])
        return torch.cat(out, dim=-1)

    gate_x = torch.sigmoid(block_diagonal(lru.input_gate, conv))
    gate_a = torch.sigmoid(block_diagonal(lru.a_gate, conv))
    a = torch.exp(-8.0 * gate_a * F.softplus(lru.a_param))
    reset = torch.zeros(t, dtype=torch.bool)
    reset[0] = True
    multiplier = torch.where(reset[:, None], 1.0, torch.sqrt(1 - a**2))
    normalized = conv * gate_x * multiplier
    a = a * ~reset[:, None]
    h = torch.zeros_like(normalized[:, 0])
    hs = []
    for i in range(t):
        h = a[:, i] * h + normalized[:, i]
        hs.append(h)
    return (torch.stack(hs, dim=1) * y) @ m.linear_out.weight.T + m.linear_out.bias


@pytest.mark.parametrize(
    "options", [{}, {"num_heads": 4}, {"lru_width": 24, "num_heads": 3, "conv_size": 2}]
)
def test_hawk_layer_equals_recurrentgemma_wiring(options: dict) -> None:
    torch.manual_seed(0)
    m = Hawk(16, HawkOptions(**options)).double()
    with torch.no_grad():
        for p in (m.linear_x.bias, m.linear_y.bias, m.linear_out.bias, m.conv.bias):
            p.copy_(0.1 * randn(*p.shape, seed=p.numel()))
        for layer in (m.rg_lru.input_gate, m.rg_lru.a_gate):
            layer.b.copy_(0.5 * randn(*layer.b.shape, seed=5))
        x = randn(2, 23, 16, seed=6)
        expected = hawk_reference(m, x)
        torch.testing.assert_close(m.mix(x), expected, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(m.mix_recurrent(x), expected, rtol=1e-10, atol=1e-12)
        # able to fail: without the reset the first step is scaled by sqrt(1 - a_0²)
        lru = m.rg_lru
        u = m.conv(m.linear_x(x))
        a0 = torch.exp(-8 * torch.sigmoid(lru.a_gate(u[:, :1])) * F.softplus(lru.a_param))
        assert (torch.sqrt(1 - a0**2) < 0.99).any()


# ------------------------------------------------------------------------- GLA layer wiring


def gla_reference(m: GLA, x: torch.Tensor) -> torch.Tensor:
    """fla's GatedLinearAttention written out (use_short_conv as configured): projections,
    optional SiLU(conv) of q, k, v, gk = logsigmoid(gk_proj x) / 16, per head the naive
    recurrence with q * d_k^-0.5 (fla's naive_recurrent_gla), RMSNorm(o) * swish(g), o_proj."""
    b, t, _ = x.shape
    h, dk, dv = m.num_heads, m.head_k_dim, m.head_v_dim
    q, k, v = x @ m.q_proj.weight.T, x @ m.k_proj.weight.T, x @ m.v_proj.weight.T
    if m.has_conv:

        def conv(layer, z):
            kernel = layer.weight  # [C, 1, k]
            out = F.conv1d(F.pad(z.transpose(1, 2), (kernel.shape[-1] - 1, 0)), kernel,
                           layer.bias, groups=z.shape[-1])  # fmt: skip
            return F.silu(out.transpose(1, 2))

        q, k, v = conv(m.q_conv, q), conv(m.k_conv, k), conv(m.v_conv, v)
    down, up = m.gk_proj[0], m.gk_proj[1]
    gk = F.logsigmoid((x @ down.weight.T) @ up.weight.T + up.bias) / 16
    q, k, gk = (z.view(b, t, h, dk) for z in (q, k, gk))
    v = v.view(b, t, h, dv)
    state = torch.zeros(b, h, dk, dv, dtype=x.dtype)
    o = torch.zeros(b, t, h, dv, dtype=x.dtype)
    for i in range(t):
        state = state * gk[:, i].exp()[..., None] + k[:, i, :, :, None] * v[:, i, :, None, :]
        o[:, i] = ((q[:, i] * dk**-0.5)[..., None] * state).sum(-2)
    eps = m.g_norm_swish_gate.eps
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * m.g_norm_swish_gate.weight
    g = (x @ m.g_proj.weight.T).view(b, t, h, dv)
    return (o * F.silu(g)).reshape(b, t, h * dv) @ m.o_proj.weight.T


@pytest.mark.parametrize(
    "options",
    [{}, {"num_heads": 2, "conv_size": 4}, {"num_heads": 1, "expand_k": 1.0, "chunk_size": 5}],
)
def test_gla_layer_equals_fla_wiring(options: dict) -> None:
    torch.manual_seed(0)
    m = GLA(16, GLAOptions(**options)).double()
    with torch.no_grad():
        m.gk_proj[1].bias.copy_(randn(m.key_dim, seed=1))
        m.g_norm_swish_gate.weight.copy_(1 + 0.3 * randn(m.head_v_dim, seed=2))
        x = randn(2, 21, 16, seed=3)
        expected = gla_reference(m, x)
        torch.testing.assert_close(m.mix(x), expected, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(m.mix_recurrent(x), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("options", "length"), [({}, 35), ({"num_heads": 1, "expand_k": 1.0}, 9)])
def test_gla_training_step_equals_the_recurrence(
    options: dict, length: int, kernel_path: str, native_calls: list
) -> None:
    """What a training step runs (the C recurrence where built, else the chunked form) against
    the step-by-step layer in float64: outputs and every gradient (input, parameters)."""
    torch.manual_seed(0)
    m = GLA(16, GLAOptions(**options)).double()
    x = randn(2, length, 16, seed=4).requires_grad_()
    w = randn(2, length, 16, seed=5)
    fast = m.mix(x)
    fast_grads = torch.autograd.grad((fast * w).sum(), [x, *m.parameters()])
    with torch.no_grad():
        ref = m.mix_recurrent(x)
    torch.testing.assert_close(fast, ref, rtol=1e-10, atol=1e-12)
    with torch.enable_grad():
        ref_grads = torch.autograd.grad((m.mix_recurrent(x) * w).sum(), [x, *m.parameters()])
    for a, b in zip(fast_grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    assert native_calls == (["gla_forward", "gla_backward"] if kernel_path == "native" else [])


def test_gla_training_step_survives_strong_gates_in_float32(kernel_path: str) -> None:
    torch.manual_seed(0)
    m = GLA(16, GLAOptions(gate_logit_normalizer=0.05))  # log-gates -5 to -27 per step
    x = randn(2, 40, 16, seed=6, dtype=torch.float32).requires_grad_()
    out = m.mix(x)
    with torch.no_grad():
        torch.testing.assert_close(out, m.mix_recurrent(x), rtol=1e-4, atol=1e-5)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


# --------------------------------------------------------------- all three: layer properties

CASES = [
    ("gla", {}),
    ("gla", {"conv_size": 4, "chunk_size": 8}),
    ("retnet", {}),
    ("hawk", {}),
    ("hawk", {"num_heads": 4, "chunk_size": 8}),
]


def make_mixer(arch: str, options: dict, d: int = 16, seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(
        architecture=arch, d_model=d, n_layers=1, vocab_size=VOCAB, max_len=80, mixer=options
    )
    return build_model(cfg).double().layers[0].mixer


@pytest.mark.parametrize(("arch", "options"), CASES)
@pytest.mark.parametrize(("length", "seed"), [(1, 0), (37, 1), (53, 2), (70, 3)])
def test_mix_equals_mix_recurrent(arch: str, options: dict, length: int, seed: int) -> None:
    m = make_mixer(arch, options, seed=seed)
    x = randn(2, length, 16, seed=seed)
    assert_same_function(m.mix, m.mix_recurrent, [x], seed)


@pytest.mark.parametrize(("arch", "options"), CASES)
def test_layer_is_causal(arch: str, options: dict) -> None:
    m = make_mixer(arch, options)
    x = randn(2, 40, 16, seed=4)
    with torch.no_grad():
        ref = m(x)
        for p in (0, 15, 16, 17, 39):
            y = x.clone()
            y[:, p] += randn(16, seed=p)
            out = m(y)
            assert torch.equal(out[:, :p], ref[:, :p]), (arch, p)
            assert not torch.allclose(out[:, p], ref[:, p]), (arch, p)


def test_short_conv_sites() -> None:
    cfg = dict(d_model=16, n_layers=2, vocab_size=VOCAB, max_len=32)
    gla_conv = site_names(
        build_model(ModelConfig(architecture="gla", mixer={"conv_size": 4}, **cfg))
    )
    for name in ("q_conv", "k_conv", "v_conv"):
        assert f"layers.1.mixer.{name}.output" in gla_conv
    assert not any(
        "conv" in s for s in site_names(build_model(ModelConfig(architecture="gla", **cfg)))
    )
    assert "layers.0.mixer.conv.output" in site_names(
        build_model(ModelConfig(architecture="hawk", **cfg))
    )


# ---------------------------------------------------------------------------- init statistics


def test_rglru_init_as_the_reference() -> None:
    torch.manual_seed(0)
    m = make_mixer("hawk", {"lru_width": 4096, "num_heads": 16}, d=16)
    r = torch.exp(-F.softplus(m.rg_lru.a_param))
    assert r.min() >= 0.9 and r.max() <= 0.999 + 1e-12
    # r² uniform on [0.81, 0.998] (area of a ring): mean 0.904, sd 0.054, so sd of the mean 8.5e-4
    assert abs((r**2).mean().item() - (0.81 + 0.998) / 2) < 4e-3
    assert abs((r**2).std().item() - 0.188 / math.sqrt(12)) < 4e-3
    for gate in (m.rg_lru.input_gate, m.rg_lru.a_gate):
        assert gate.w.shape == (16, 256, 256)
        assert abs(gate.w.std().item() - math.sqrt(1 / 256)) < 2e-3
        assert not gate.b.any()
    assert abs(m.conv.weight.std().item() - math.sqrt(0.01 / 4)) < 2e-3
    assert not m.conv.bias.any()


def test_gla_and_retnet_init() -> None:
    for arch in ("gla", "retnet"):
        m = make_mixer(arch, {}, d=64)
        assert torch.equal(m.g_norm_swish_gate.weight, torch.ones_like(m.g_norm_swish_gate.weight))
        assert abs(m.q_proj.weight.std().item() - 0.02) < 2e-3
    assert not make_mixer("gla", {}).gk_proj[1].bias.any()


# --------------------------------------------------------------------------- parameter counts


def gla_count(d: int, h: int = 4, ek: float = 0.5, ev: float = 1.0, r: int = 16, conv=None):
    dk, dv = int(d * ek), int(d * ev)
    count = 2 * d * dk + 2 * d * dv  # q_proj, k_proj, v_proj, g_proj (no bias)
    count += d * r + r * dk + dk  # gk_proj: Linear(d, r, bias=False), Linear(r, d_k)
    count += dv * d + dv // h  # o_proj; FusedRMSNormGated(head_v_dim)
    if conv:
        count += (2 * dk + dv) * conv  # ShortConvolution(bias=False) on q, k, v
    return count


def retnet_count(d: int, h: int = 8, ek: int = 1, ev: int = 2) -> int:
    dk, dv = d * ek, d * ev
    return 2 * d * dk + 2 * d * dv + dv * d + dv // h  # q, k, v, g, o_proj; g_norm


def hawk_count(d: int, w: int | None = None, h: int = 1, k: int = 4) -> int:
    w = w or d
    linears = 2 * (d * w + w) + (w * d + d)  # linear_y, linear_x, linear_out (with bias)
    conv = k * w + w  # Conv1D w [k, W], b [W]
    gates = 2 * (h * (w // h) ** 2 + w)  # input_gate, a_gate: w [H, bw, bw], b [H, bw]
    return linears + conv + gates + w  # a_param [W]


@pytest.mark.parametrize(
    ("arch", "d", "options", "expected"),
    [
        ("gla", 64, {}, gla_count(64)),
        ("gla", 16, {}, gla_count(16)),
        ("gla", 64, {"num_heads": 2, "conv_size": 4}, gla_count(64, h=2, conv=4)),
        ("gla", 32, {"expand_k": 1.0, "gate_low_rank_dim": 8}, gla_count(32, ek=1.0, r=8)),
        ("retnet", 64, {}, retnet_count(64)),
        ("retnet", 16, {"num_heads": 4, "expand_v": 1}, retnet_count(16, h=4, ev=1)),
        ("hawk", 64, {}, hawk_count(64)),
        ("hawk", 64, {"num_heads": 4}, hawk_count(64, h=4)),
        ("hawk", 16, {"lru_width": 24, "num_heads": 3, "conv_size": 2}, hawk_count(16, 24, 3, 2)),
    ],
)
def test_parameter_counts(arch: str, d: int, options: dict, expected: int) -> None:
    assert count_parameters(make_mixer(arch, options, d=d)) == expected


def test_whole_model_counts_at_d64() -> None:
    # embedding (tied head) + 2 x (mixer + 2 LayerNorms + GELU MLP x4) + final LayerNorm
    block = 2 * 128 + (64 * 256 + 256) + (256 * 64 + 64)
    for arch, mixer in [("gla", gla_count(64)), ("retnet", retnet_count(64)),
                        ("hawk", hawk_count(64))]:  # fmt: skip
        cfg = ModelConfig(architecture=arch, d_model=64, n_layers=2, vocab_size=8192)
        assert count_parameters(build_model(cfg)) == 8192 * 64 + 2 * (mixer + block) + 128


# ------------------------------------------------------------------------------- bad options


@pytest.mark.parametrize(
    ("arch", "d", "options", "needle"),
    [
        ("gla", 16, {"num_heads": 3}, "model.mixer.num_heads"),
        ("gla", 16, {"expand_k": 0}, "model.mixer.expand_k"),
        ("gla", 16, {"expand_k": 0.01}, "model.mixer.expand_k"),
        ("gla", 16, {"conv_size": 0}, "model.mixer.conv_size"),
        ("gla", 16, {"chunk_size": 0}, "model.mixer.chunk_size"),
        ("gla", 16, {"gate_logit_normalizer": -1}, "model.mixer.gate_logit_normalizer"),
        ("gla", 16, {"heads": 2}, "model.mixer.heads"),
        ("retnet", 16, {"num_heads": 3}, "model.mixer.num_heads"),
        ("retnet", 16, {"num_heads": 16}, "model.mixer.num_heads"),  # odd rotary width
        ("retnet", 16, {"expand_v": 0}, "model.mixer.expand_v"),
        ("retnet", 16, {"rotary_base": 1}, "model.mixer.rotary_base"),
        ("hawk", 16, {"num_heads": 3}, "model.mixer.num_heads"),
        ("hawk", 16, {"lru_width": 0}, "model.mixer.lru_width"),
        ("hawk", 16, {"min_rad": 0.99, "max_rad": 0.9}, "model.mixer.min_rad"),
        ("hawk", 16, {"max_rad": 1.0}, "model.mixer.max_rad"),
        ("hawk", 16, {"c": 0}, "model.mixer.c"),
    ],
)
def test_bad_options_give_one_line_errors(arch: str, d: int, options: dict, needle: str) -> None:
    cfg = ModelConfig(architecture=arch, d_model=d, n_layers=1, vocab_size=VOCAB, mixer=options)
    with pytest.raises(ConfigError) as err:
        build_model(cfg)
    message = str(err.value)
    assert needle in message and "\n" not in message, message


@pytest.mark.parametrize("arch", ["gla", "retnet", "hawk"])
def test_defaults_build_at_d16_and_d64(arch: str) -> None:
    for d in (16, 64):
        m = make_mixer(arch, {}, d=d)
        assert m(randn(1, 5, d, seed=0)).shape == (1, 5, d)
