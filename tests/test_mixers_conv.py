"""The convolution-family mixers (BaseConv, Based, H3, Hyena) compute what their papers and
zoology define: each fast form is checked against an independent slow one."""

from __future__ import annotations

import math

import pytest
import torch

from mecheval.errors import ConfigError
from mecheval.models import ModelConfig, build_model, site_names
from mecheval.models.mixers.base import is_inert
from mecheval.models.mixers.baseconv import BaseConv
from mecheval.models.mixers.based import BasedLinearAttention
from mecheval.models.mixers.h3 import DiagSSMKernel, H3Options, ShiftSSM
from mecheval.models.mixers.long_conv import ImplicitFilter, ImplicitLongConv
from mecheval.models.mixers.modules import ShortConv
from mecheval.models.ops.h3 import shift_kernel_direct, vandermonde
from mecheval.models.ops.linear_attention import (
    linear_attention_quadratic,
    linear_attention_recurrent,
    taylor_exp,
)
from mecheval.models.ops.long_conv import (
    causal_long_conv,
    direct_causal_conv,
    fft_causal_conv,
    positional_features,
    toeplitz_causal_conv,
)
from mecheval.models.registry import get_architecture, parse_options

ARCHS = ["baseconv", "based", "h3", "hyena"]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def naive_causal_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """y[b, t, c] = sum_{s <= t} k[c, t - s] u[b, s, c], by an explicit Toeplitz matrix."""
    t = u.shape[1]
    lag = torch.arange(t)[:, None] - torch.arange(t)[None, :]  # t - s
    taps = torch.zeros(k.shape[0], t, dtype=k.dtype)
    n = min(t, k.shape[1])
    taps[:, :n] = k[:, :n]
    toeplitz = torch.where(lag >= 0, taps[:, lag.clamp(min=0)], torch.zeros((), dtype=k.dtype))
    return torch.einsum("cts,bsc->btc", toeplitz, u)


def build(arch: str, d: int = 16, n_layers: int = 2, **mixer) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(
        architecture=arch, d_model=d, n_layers=n_layers, vocab_size=20, max_len=40, mixer=mixer
    )
    return build_model(cfg)


# --- long convolution -------------------------------------------------------------------


@pytest.mark.parametrize("t, klen, seed", [(37, 37, 11), (70, 90, 12), (70, 20, 13), (1, 5, 14)])
def test_fft_conv_equals_direct_and_naive_causal_conv(t: int, klen: int, seed: int) -> None:
    g = gen(seed)
    u = torch.randn(3, t, 5, generator=g, dtype=torch.float64)
    k = torch.randn(5, klen, generator=g, dtype=torch.float64)
    ref = naive_causal_conv(u, k)
    torch.testing.assert_close(fft_causal_conv(u, k), ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(direct_causal_conv(u, k), ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(toeplitz_causal_conv(u, k), ref, rtol=1e-10, atol=1e-10)
    # float32, the dtype the models run in
    torch.testing.assert_close(
        fft_causal_conv(u.float(), k.float()), ref.float(), rtol=1e-4, atol=1e-4
    )


def test_fft_conv_takes_bfloat16_inputs_and_transforms_them_in_float32() -> None:
    """Under bf16 autocast on a GPU the convolution's input arrives in bfloat16 (the FFTs
    have no kernel for it on any device, this CPU's included); the kernel stays float32."""
    g = gen(15)
    u = torch.randn(2, 19, 4, generator=g).bfloat16()
    k = torch.randn(4, 19, generator=g)
    out = fft_causal_conv(u, k)
    assert out.dtype == torch.bfloat16
    # The exact convolution of the bf16-rounded input, rounded once to bf16.
    ref = naive_causal_conv(u.double(), k.double())
    torch.testing.assert_close(out, ref.bfloat16(), rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("upstream", ["dense", "expanded"])
def test_toeplitz_conv_gradients_match_direct(upstream: str) -> None:
    """Also when the gradient arriving at the conv is an expanded, permuted tensor, as H3's
    per-head sum (``(y.view(b, t, h, p, p) * q).sum(3)``) hands it back."""
    g = gen(15)
    u = torch.randn(3, 9, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(8, 12, generator=g, dtype=torch.float64, requires_grad=True)
    q = torch.randn(3, 9, 2, 2, 1, generator=g, dtype=torch.float64)
    w = torch.randn(3, 9, 2, 2, generator=g, dtype=torch.float64)
    w_dense = torch.randn(3, 9, 8, generator=g, dtype=torch.float64)

    def loss(y: torch.Tensor) -> torch.Tensor:
        if upstream == "dense":
            return (y * w_dense).sum()
        return ((y.view(3, 9, 2, 2, 2) * q).sum(3) * w).sum()

    ref = torch.autograd.grad(loss(direct_causal_conv(u, k)), (u, k))
    new = torch.autograd.grad(loss(toeplitz_causal_conv(u, k)), (u, k))
    for a, b in zip(new, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("t", "klen"), [(1, 5), (9, 9), (13, 4), (35, 1024)])
def test_training_long_conv_equals_the_naive_sum(
    t: int, klen: int, kernel_path: str, native_calls: list
) -> None:
    """What a training step runs (the C kernel where built, else the Toeplitz product) against
    the explicit Toeplitz matrix in float64: outputs, and both gradients by finite differences
    (kernels longer and shorter than the sequence, as H3's d_state-long shift kernel)."""
    g = gen(17)
    u = torch.randn(2, t, 5, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(5, klen, generator=g, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(causal_long_conv(u, k), naive_causal_conv(u, k))
    assert torch.autograd.gradcheck(causal_long_conv, (u, k))
    assert ("long_conv_backward" in native_calls) == (kernel_path == "native")


@pytest.mark.parametrize(
    ("kernel_size", "bias", "length"), [(1, True, 7), (3, True, 7), (4, False, 7), (4, True, 2)]
)
def test_short_conv_equals_depthwise_conv1d(
    kernel_size: int, bias: bool, length: int, kernel_path: str, native_calls: list
) -> None:
    """Both forms (shifted copies; in a training step where built, the C kernel) against
    conv1d in float64, outputs and gradients, also for a sequence shorter than the kernel."""
    torch.manual_seed(0)
    tap = ShortConv(6, kernel_size, bias=bias).double()
    weight = tap.weight.detach().clone().requires_grad_()
    params = [weight] + ([tap.bias.detach().clone().requires_grad_()] if bias else [])
    x = torch.randn(2, length, 6, generator=gen(16), dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, length, 6, generator=gen(17), dtype=torch.float64)
    padded = torch.nn.functional.pad(x.transpose(1, 2), (kernel_size - 1, 0))
    y_ref = torch.nn.functional.conv1d(
        padded, weight, params[1] if bias else None, groups=6
    ).transpose(1, 2)
    y_tap = tap(x)
    torch.testing.assert_close(y_tap, y_ref, rtol=1e-12, atol=1e-12)
    g_ref = torch.autograd.grad((y_ref * w).sum(), [x, *params])
    g_tap = torch.autograd.grad((y_tap * w).sum(), [x, *tap.parameters()])
    for a, b in zip(g_tap, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert native_calls == (
        ["long_conv_forward", "long_conv_backward"] if kernel_path == "native" else []
    )


def test_implicit_filter_does_not_depend_on_sequence_length() -> None:
    torch.manual_seed(0)
    f = ImplicitFilter(channels=4, l_max=64, order=8)
    for p in f.parameters():  # the backbone's N(0, 0.02) leaves the filter near zero
        torch.nn.init.normal_(p)
    long, short = f(64), f(23)
    assert long.shape == (4, 64) and short.shape == (4, 23)
    torch.testing.assert_close(short, long[:, :23])
    # exponential-decay window: the slowest channel decays to 1e-2 at t = 1.5, the fastest at
    # t = 0.3, so the end of the fastest channel's kernel is damped by e^{-ln(100)/0.3}
    assert long[-1, -1].abs() < 1e-4 * long[-1].abs().max()
    with pytest.raises(ValueError, match="l_max"):
        f(65)


def test_positional_features_match_hyena() -> None:
    z, t = positional_features(l_max=4, emb_dim=5)
    assert z.shape == (1, 4, 5)
    n = torch.arange(4.0)
    torch.testing.assert_close(t[0, :, 0], n / 3)
    torch.testing.assert_close(z[0, :, 0], n / 3)
    for j, f in enumerate([1e-4, 1.0]):  # bands = 2: f = linspace(1e-4, 1, 2)
        torch.testing.assert_close(z[0, :, 1 + j], torch.cos(f * 2 * math.pi * n / 4))
        torch.testing.assert_close(z[0, :, 3 + j], -torch.sin(f * 2 * math.pi * n / 4))


def test_implicit_long_conv_adds_skip() -> None:
    torch.manual_seed(0)
    u = torch.randn(2, 9, 4)
    skips = {"identity": lambda c: u, "learned": lambda c: u * c.D, "zeroed": lambda c: 0 * u}
    for skip, term in skips.items():
        conv = ImplicitLongConv(ImplicitFilter(4, l_max=16, order=8), skip=skip)
        k = conv.kernel(9)
        torch.testing.assert_close(
            conv(u), naive_causal_conv(u, k) + term(conv), rtol=1e-5, atol=1e-6
        )
    # the zeroed skip's D exists (as in zoology) but gets no gradient
    conv = ImplicitLongConv(ImplicitFilter(4, l_max=16, order=8), skip="zeroed")
    conv(u).sum().backward()
    assert is_inert(conv.D) and not conv.D.grad.any()


# --- Based ------------------------------------------------------------------------------


def test_taylor_feature_map_is_second_order_exp_expansion() -> None:
    g = gen(5)
    q, k = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    dot = (q * k).sum(-1) / math.sqrt(8)
    torch.testing.assert_close(
        (taylor_exp(q) * taylor_exp(k)).sum(-1), 1 + dot + dot**2 / 2, rtol=1e-5, atol=1e-5
    )
    assert taylor_exp(q).shape == (6, 1 + 8 + 64)


@pytest.mark.parametrize("seed", [21, 22])
def test_based_quadratic_equals_recurrent(seed: int) -> None:
    torch.manual_seed(seed)
    mixer = BasedLinearAttention(16, feature_dim=8, num_heads=2)
    for p in mixer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(3, 29, 16)
    q, k, v = mixer.featurise(x)
    quad = linear_attention_quadratic(q, k, v)
    torch.testing.assert_close(quad, linear_attention_recurrent(q, k, v), rtol=1e-4, atol=1e-5)
    # and against softmax-free attention written out from its definition
    scores = torch.einsum("bhtf,bhsf->bhts", q, k).tril()
    explicit = torch.einsum("bhts,bhse->bhte", scores, v) / scores.sum(-1, keepdim=True)
    torch.testing.assert_close(quad, explicit, rtol=1e-4, atol=1e-5)


def test_based_alternates_and_long_conv_ablation() -> None:
    kinds = [type(layer.mixer) for layer in build("based", n_layers=3).layers]
    assert kinds == [BaseConv, BasedLinearAttention, BaseConv]
    conv = build("based").layers[0].mixer.conv
    assert isinstance(conv, ShortConv) and conv.kernel_size == 3
    assert build("based", conv_kernel_size=2).layers[0].mixer.conv.kernel_size == 2
    model = build("based", long_conv=True)
    assert isinstance(model.layers[0].mixer.conv, ImplicitLongConv)
    assert isinstance(model.layers[1].mixer, BasedLinearAttention)
    assert "layers.0.mixer.conv.output" in site_names(model)


# --- BaseConv ---------------------------------------------------------------------------


def test_baseconv_kernel_size_cycles_per_layer() -> None:
    convs = [layer.mixer.conv for layer in build("baseconv", n_layers=3).layers]
    assert isinstance(convs[0], ShortConv) and convs[0].kernel_size == 3
    assert isinstance(convs[1], ImplicitLongConv)
    assert isinstance(convs[2], ShortConv) and convs[2].kernel_size == 3
    convs = [layer.mixer.conv for layer in build("baseconv", kernel_size=[2]).layers]
    assert all(isinstance(c, ShortConv) and c.kernel_size == 2 for c in convs)
    with pytest.raises(ConfigError, match=r"model\.mixer\.kernel_size"):
        build("baseconv", kernel_size=[3, 0])


@pytest.mark.parametrize("use_act", [False, True])
def test_baseconv_equation(use_act: bool) -> None:
    torch.manual_seed(0)
    mixer = BaseConv(8, kernel_size=3, use_act=use_act)
    u = torch.randn(2, 11, 8)
    c, p = mixer.conv(u), mixer.projection(u)
    act = torch.nn.functional.silu if use_act else (lambda z: z)
    torch.testing.assert_close(mixer(u), act(c) * act(p) + u)


# --- H3 ---------------------------------------------------------------------------------


def test_shift_ssm_equals_its_recurrence() -> None:
    torch.manual_seed(0)
    ssm = ShiftSSM(channels=3, d_state=6, l_max=64)
    with torch.no_grad():  # B = e_1 at init would make the kernel just C; test the general case
        ssm.B.normal_()
    u = torch.randn(2, 15, 3)
    x = torch.zeros(2, 3, 6)
    ys = []
    for t in range(15):
        x = torch.cat([torch.zeros(2, 3, 1), x[..., :-1]], dim=-1) + ssm.B * u[:, t, :, None]
        ys.append((ssm.C * x).sum(-1) + ssm.D * u[:, t])
    torch.testing.assert_close(ssm(u), torch.stack(ys, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("disc", ["bilinear", "zoh"])
def test_diag_ssm_kernel_equals_its_recurrence(disc: str) -> None:
    torch.manual_seed(1)
    kernel = DiagSSMKernel(channels=3, d_state=8, discretization=disc)
    with torch.no_grad():
        kernel.log_dt.fill_(math.log(0.3))  # large steps so that dt actually matters
    u = torch.randn(2, 13, 3)
    da, db, c = kernel.discretize()
    x = torch.zeros(2, 3, 4, dtype=torch.cfloat)
    ys = []
    for t in range(13):
        x = da * x + db * u[:, t, :, None]
        ys.append(2 * (c * x).sum(-1).real)
    torch.testing.assert_close(
        naive_causal_conv(u, kernel(13)), torch.stack(ys, 1), rtol=1e-4, atol=1e-5
    )
    a = torch.complex(-torch.exp(kernel.inv_A_real), kernel.A_imag)
    dta = a * 0.3
    b = torch.view_as_complex(kernel.B)
    if disc == "zoh":
        expected_da, expected_db = torch.exp(dta), b * (torch.exp(dta) - 1) / a
    else:
        expected_da, expected_db = (1 + dta / 2) / (1 - dta / 2), b * 0.3 / (1 - dta / 2)
    torch.testing.assert_close(da, expected_da)
    torch.testing.assert_close(db, expected_db)


def diag_kernel_by_autograd(kernel: DiagSSMKernel, length: int) -> torch.Tensor:
    """K[h, l] = 2 Re sum_n C_n dB_n dA_n^l with complex autograd ops (the oracle for the
    baby-step giant-step product of DiagSSMKernel.forward)."""
    da, db, c = kernel.discretize()
    powers = torch.arange(length, dtype=torch.float64)
    return 2 * torch.einsum("hn,hnl->hl", c * db, da.unsqueeze(-1) ** powers).real


@pytest.mark.parametrize("disc", ["bilinear", "zoh"])
# Lengths around the baby-step/giant-step split: 1 and 2 (one giant), squares and their
# neighbours (the last giant row full, cut after one entry, or one short).
@pytest.mark.parametrize("length", [1, 2, 9, 10, 35, 36, 64])
def test_diag_ssm_kernel_gradients_match_complex_autograd(disc: str, length: int) -> None:
    torch.manual_seed(2)
    kernel = DiagSSMKernel(channels=3, d_state=10, discretization=disc).double()
    with torch.no_grad():
        kernel.log_dt.fill_(math.log(0.3))
    w = torch.randn(3, length, generator=gen(18), dtype=torch.float64)
    params = list(kernel.parameters())
    got = kernel(length)
    ref = diag_kernel_by_autograd(kernel, length)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    g_got = torch.autograd.grad((got * w).sum(), params)
    g_ref = torch.autograd.grad((ref * w).sum(), params)
    for a, b in zip(g_got, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_diag_ssm_kernel_under_vmap() -> None:
    torch.manual_seed(3)
    kernel = DiagSSMKernel(channels=2, d_state=6).double()
    stacked = {
        name: torch.stack([p.detach(), p.detach() + 0.01]) for name, p in kernel.named_parameters()
    }

    def loss(params: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.func.functional_call(kernel, params, (7,)).pow(2).sum()

    grads = torch.func.vmap(torch.func.grad(loss))(stacked)
    for i in range(2):
        one = {name: p[i] for name, p in stacked.items()}
        expected = torch.func.grad(loss)(one)
        for name in one:
            torch.testing.assert_close(grads[name][i], expected[name])


def test_h3_defaults_and_gating() -> None:
    opts = H3Options()
    # the paper's code passes head_dim 2 (tinylang/model/zoology.py), d_state = l_max = 1024
    assert (opts.d_state, opts.l_max, opts.head_dim) == (1024, 1024, 2)
    model = build("h3", d_state=16, head_dim=1)
    mixer = model.layers[0].mixer
    torch.testing.assert_close(  # S4D-Lin init: A = -1/2 + i pi n
        mixer.ssm.A_imag[0, :3], torch.tensor([0.0, math.pi, 2 * math.pi])
    )
    u = torch.randn(2, 10, 16)
    q, k, v = mixer.q_proj(u), mixer.k_proj(u), mixer.v_proj(u)
    kv = mixer.conv(k) * v
    y = naive_causal_conv(kv, mixer.ssm(10)) + kv * mixer.D
    torch.testing.assert_close(mixer(u), mixer.output_linear(q * y), rtol=1e-4, atol=1e-5)


def test_h3_multi_head_outer_product() -> None:
    torch.manual_seed(0)
    mixer = build("h3", d=8, d_state=8, head_dim=4).layers[0].mixer
    assert mixer.ssm.log_dt.shape == (2,)
    u = torch.randn(2, 10, 8)
    q, k, v = mixer.q_proj(u), mixer.k_proj(u), mixer.v_proj(u)
    k = mixer.conv(k)
    kernel = mixer.ssm(10)
    y = torch.zeros(2, 10, 8)
    for h in range(2):
        for j in range(4):
            acc = torch.zeros(2, 10)
            for i in range(4):
                kv = (k[..., 4 * h + i] * v[..., 4 * h + j])[..., None]
                ssm = naive_causal_conv(kv, kernel[h : h + 1]) + kv * mixer.D[h]
                acc = acc + q[..., 4 * h + i] * ssm[..., 0]
            y[..., j * 2 + h] = acc  # zoology lays the output out as (j, head)
    torch.testing.assert_close(mixer(u), mixer.output_linear(y), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("lags", [1, 5, 12])
def test_shift_kernel_direct_equals_its_sum_and_gradients(
    lags: int, kernel_path: str, native_calls: list
) -> None:
    """Both forms (the conv1d one with its hand-written gradients; the C kernel) against the
    definition, K[j] = sum_m B[m] C[m + j] (C zero beyond N), written as one product-sum per
    lag; gradients by finite differences."""
    g = torch.Generator().manual_seed(4)
    b = torch.randn(3, 12, generator=g, dtype=torch.float64, requires_grad=True)
    c = torch.randn(3, 12, generator=g, dtype=torch.float64, requires_grad=True)
    expected = torch.stack([(b[:, : 12 - j] * c[:, j:]).sum(-1) for j in range(lags)], 1)
    torch.testing.assert_close(shift_kernel_direct(b, c, lags), expected)
    assert torch.autograd.gradcheck(lambda b, c: shift_kernel_direct(b, c, lags), (b, c))
    assert ("shift_kernel_backward" in native_calls) == (kernel_path == "native")


@pytest.mark.parametrize("length", [1, 2, 7, 16, 35])
def test_vandermonde_equals_its_sum_and_gradients(
    length: int, kernel_path: str, native_calls: list
) -> None:
    """Both forms (baby step, giant step with its written-out gradient; the C kernel's
    running powers) against the definition, K[l] = 2 Re sum_n cb_n exp(l w_n), in float64
    (lengths on and off the m x m grid), gradients by finite differences."""
    g = torch.Generator().manual_seed(5)
    cb_re, cb_im, w_im = (torch.randn(3, 6, generator=g, dtype=torch.float64) for _ in "abc")
    w_re = -torch.rand(3, 6, generator=g, dtype=torch.float64)
    powers = torch.exp(torch.complex(w_re, w_im).unsqueeze(-1) * torch.arange(length))
    expected = 2 * (torch.complex(cb_re, cb_im).unsqueeze(-1) * powers).sum(-2).real
    inputs = tuple(x.requires_grad_() for x in (cb_re, cb_im, w_re, w_im))
    torch.testing.assert_close(vandermonde(*inputs, length), expected)
    assert torch.autograd.gradcheck(lambda *x: vandermonde(*x, length), inputs)
    assert ("vandermonde_backward" in native_calls) == (kernel_path == "native")


def test_vandermonde_batched_leading_dims() -> None:
    """[..., N] inputs (the PyTorch form's batching) against the 2-D call per row."""
    g = torch.Generator().manual_seed(6)
    cb_re, cb_im, w_im = (torch.randn(2, 3, 6, generator=g, dtype=torch.float64) for _ in "abc")
    w_re = -torch.rand(2, 3, 6, generator=g, dtype=torch.float64)
    both = vandermonde(cb_re, cb_im, w_re, w_im, 9)
    for i in range(2):
        torch.testing.assert_close(both[i], vandermonde(cb_re[i], cb_im[i], w_re[i], w_im[i], 9))


@pytest.mark.parametrize("d_state", [64, 1024])
def test_vandermonde_float32_at_the_paper_angles(d_state: int) -> None:
    """At d_state 1024 the angles l Im w reach thousands of radians: the training kernel
    (C's float64 powers where built, else baby step, giant step in float32) stays within
    float32 rounding of the float64 definition on a freshly initialised H3 kernel."""
    torch.manual_seed(0)
    ssm = DiagSSMKernel(4, d_state)
    with torch.enable_grad():
        got = ssm(35)
    with torch.no_grad():
        ssm64 = DiagSSMKernel(4, d_state).double()
        ssm64.load_state_dict({k: v.double() for k, v in ssm.state_dict().items()})
        expected = ssm64(35)
    scale = float(expected.abs().max())
    torch.testing.assert_close(got.detach().double(), expected, rtol=0, atol=2e-4 * scale)


def test_shift_ssm_init_is_a_conv_with_kernel_c() -> None:
    torch.manual_seed(0)
    ssm = ShiftSSM(channels=3, d_state=16, l_max=64)
    assert torch.equal(ssm.B, torch.eye(16)[:1].expand(3, 16))
    assert ssm.C.abs().max() <= 1 / 4
    torch.testing.assert_close(ssm.kernel(64), ssm.C.detach(), rtol=0, atol=1e-6)
    assert ssm.kernel(5).shape == (3, 5)


def test_h3_errors() -> None:
    with pytest.raises(ConfigError, match="d_model"):
        build("h3", d=18, head_dim=4)
    with pytest.raises(ConfigError, match=r"model\.mixer\.d_state"):
        build("h3", d_state=7)


# --- Hyena ------------------------------------------------------------------------------


def test_hyena_gating_order() -> None:
    torch.manual_seed(0)
    mixer = build("hyena").layers[0].mixer
    with torch.no_grad():  # at init the filter is ~0 and would hide a swapped gate
        for p in mixer.long_conv.filter.mlp.parameters():
            p.normal_()
    u = torch.randn(2, 12, 16)
    x1, x2, v = mixer.conv(mixer.in_proj(u)).split(16, dim=-1)
    h = x1 * v
    # the paper's runs (bias: false): no skip, exactly the gated long convolution
    y = naive_causal_conv(h, mixer.long_conv.kernel(12))
    torch.testing.assert_close(mixer(u), mixer.out_proj(x2 * y), rtol=1e-4, atol=1e-5)
    skip = build("hyena", long_conv_skip=True).layers[0].mixer
    skip.load_state_dict(mixer.state_dict())
    y = y + h * mixer.long_conv.D
    torch.testing.assert_close(skip(u), mixer.out_proj(x2 * y), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="l_max"):
        build("hyena", l_max=8).layers[0].mixer(torch.randn(1, 9, 16))
    with pytest.raises(ConfigError, match=r"model\.mixer\.emb_dim"):
        build("hyena", emb_dim=4)


# --- every mixer ------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("layer", [0, 1])
def test_mixer_is_causal(arch: str, layer: int) -> None:
    torch.manual_seed(0)
    options = parse_options(arch, {"d_state": 64} if arch == "h3" else {})
    mixer = get_architecture(arch).build(layer, 16, options).eval()
    x = torch.randn(2, 33, 16)
    for t in (0, 17, 31):
        y = x.clone()
        y[:, t + 1 :] += torch.randn(2, 32 - t, 16)
        with torch.no_grad():
            a, b = mixer(x), mixer(y)
        # bitwise: interventions compare positions before a patch exactly
        torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=0)
        assert (a[:, t + 1 :] - b[:, t + 1 :]).abs().amax(-1).min() > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_builds_trains_and_exposes_conv_sites(arch: str) -> None:
    model = build(arch).train()
    x = torch.randint(0, 20, (3, 37), generator=gen(2))
    logits = model(x)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.roll(-1, 1).flatten()).backward()
    missing = [
        n
        for n, p in model.named_parameters()
        if not is_inert(p) and (p.grad is None or p.grad.abs().sum() == 0)
    ]
    assert not missing, missing
    names = set(site_names(model))
    for i, layer in enumerate(model.layers):
        has_conv = hasattr(layer.mixer, "conv")
        assert has_conv == (arch != "based" or i % 2 == 0)
        assert (f"layers.{i}.mixer.conv.output" in names) == has_conv
