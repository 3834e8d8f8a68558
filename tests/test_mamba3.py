"""Mamba-3 (``mamba3``): the chunked form against the step-by-step recurrence, both against a
complex-valued recurrence written here from the paper's equations, the whole layer against
mamba_ssm's ``Mamba3`` wiring written out here, stepping and resuming against the full
forward, the trapezoid's term, the optional short conv, state size, init and options.

The references below share nothing with ``src/`` but the weights; each is shown able to fail
by a deliberately wrong variant that must NOT match at the same tolerance.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from reference_math import gen

from mecheval.errors import ConfigError
from mecheval.models import ModelConfig, build_model, site_names, state_size
from mecheval.models.backbone import RMSNorm, count_parameters
from mecheval.models.mixers.mamba3 import heavy_tail
from mecheval.models.ops.mamba3 import Mamba3Inputs, mamba3_chunked, mamba3_recurrent
from mecheval.models.registry import (
    BUILTIN_ARCHITECTURES,
    PAPER_ARCHITECTURES,
    get_architecture,
    parse_options,
)
from mecheval.models.sites import state_site_names

DTYPE = torch.float64
# float64 round-off at these sizes is ~1e-13; every wrong variant misses by far more.
TOL = {"rtol": 1e-10, "atol": 1e-10}


def matches(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, **TOL)


def operands(seed: int, length: int, heads: int = 2, p: int = 3, n: int = 6, r: int = 2):
    """Random operands of the recurrence (x, Δ A, Δ, λ, Δ θ, B, C), Δ over orders of
    magnitude and angle steps up to ±π Δ, as the layer makes them."""
    g = gen(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=DTYPE)

    x = rand(2, length, heads, p)
    dt = F.softplus(2 * rand(2, length, heads))
    log_decay = -F.softplus(rand(2, length, heads)) * dt
    lam = torch.sigmoid(2 * rand(2, length, heads))
    angle_steps = math.pi * torch.tanh(rand(2, length, heads, r)) * dt[..., None]
    B, C = rand(2, length, heads, n), rand(2, length, heads, n)
    return Mamba3Inputs(x, log_decay, dt, lam, angle_steps, B, C)


def paper_recurrence(x, log_decay, dt, lam, angle_steps, B, C, D, *, euler=False, sign=1.0):
    """The paper's complex SSM with the exponential-trapezoidal rule, per batch row and head:
    N/2 complex state entries per channel, B = b_2j - i b_2j+1, C = c_2j + i c_2j+1,

        h_t = e^{Δ_t (A_t + i θ_t)} h_{t-1} + (1 - λ_t) Δ_t e^{Δ_t (A_t + i θ_t)} B_{t-1} x_{t-1}
              + λ_t Δ_t B_t x_t,        y_t = Re(C_tᵀ h_t) + D x_t,

    θ zero on the entries RoPE leaves alone. ``euler`` (the previous input's term dropped: Mamba-2's
    rule) and ``sign=-1`` (the rotation the other way) are the wrong variants."""
    batch, length, heads, p = x.shape
    half, r = B.shape[-1] // 2, angle_steps.shape[-1]
    b_complex = torch.complex(B[..., 0::2], -B[..., 1::2])
    c_complex = torch.complex(C[..., 0::2], C[..., 1::2])
    y = torch.zeros_like(x)
    for i in range(batch):
        for head in range(heads):
            h = torch.zeros(p, half, dtype=torch.complex128)
            previous = torch.zeros(p, half, dtype=torch.complex128)
            for t in range(length):
                theta = torch.zeros(half, dtype=DTYPE)
                theta[:r] = sign * angle_steps[i, t, head]
                turn = torch.exp(torch.complex(log_decay[i, t, head].expand(half), theta))
                drive = x[i, t, head, :, None] * b_complex[i, t, head]
                trapezoid = 0.0 if euler else (1 - lam[i, t, head]) * dt[i, t, head]
                h = (
                    turn * h
                    + trapezoid * turn * previous
                    + lam[i, t, head] * dt[i, t, head] * drive
                )
                previous = drive
                read = (h * c_complex[i, t, head]).real.sum(-1)
                y[i, t, head] = read + D[head] * x[i, t, head]
    return y


# ============================================================================================
# The recurrence: chunked = step by step = the paper's complex form


@pytest.mark.parametrize(("length", "chunk"), [(37, 5), (37, 8), (37, 64), (16, 4), (1, 3)])
def test_chunked_equals_recurrent_forward_and_backward(length: int, chunk: int) -> None:
    args = Mamba3Inputs(*(a.requires_grad_() for a in operands(0, length)))
    D = torch.randn(2, dtype=DTYPE, generator=gen(1), requires_grad=True)
    fast = mamba3_chunked(args, D, chunk)
    ref = mamba3_recurrent(args, D)
    torch.testing.assert_close(fast, ref, **TOL)
    w = torch.randn(fast.shape, dtype=DTYPE, generator=gen(2))
    for a, b in zip(
        torch.autograd.grad((fast * w).sum(), [*args, D]),
        torch.autograd.grad((ref * w).sum(), [*args, D]),
        strict=True,
    ):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("r", [1, 3])  # part of the state turned, and all of it
def test_recurrence_equals_the_papers_complex_ssm(r: int) -> None:
    args = operands(3, 9, r=r)
    D = torch.randn(2, dtype=DTYPE, generator=gen(4))
    ours = mamba3_recurrent(args, D)
    torch.testing.assert_close(ours, paper_recurrence(*args, D), **TOL)
    torch.testing.assert_close(mamba3_chunked(args, D, 4), ours, **TOL)
    assert not matches(ours, paper_recurrence(*args, D, euler=True))
    assert not matches(ours, paper_recurrence(*args, D, sign=-1.0))


def test_stepping_one_token_at_a_time_equals_the_full_form() -> None:
    """The inference path: one step per call, the state (h, previous B and x, angles) handed
    on, equals the chunked form over the whole sequence; so does starting over from the
    state after each step as the state site does (``replace_first``)."""
    args = operands(5, 11)
    D = torch.randn(2, dtype=DTYPE, generator=gen(6))
    full = mamba3_chunked(args, D, 4)
    state, outs = None, []
    for t in range(11):
        step = Mamba3Inputs(*(a[:, t : t + 1] for a in args))
        y, kept = mamba3_recurrent(step, D, initial=state, keep=True)
        state = tuple(part[:, -1] for part in kept)
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **TOL)
    _, kept = mamba3_recurrent(args, D, keep=True)
    for cut in (0, 4, 10):
        after = tuple(part[:, cut] for part in kept)
        y = mamba3_recurrent(args.after(cut), D, initial=after, replace_first=True)
        torch.testing.assert_close(y, full[:, cut:], **TOL)


@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_the_trapezoid_carries_the_previous_input_into_the_state(form: str) -> None:
    """With λ_{t-1} = 0 the input x_{t-1} writes nothing at its own step (γ = 0): y_{t-1}
    reads it through D alone. It still reaches y_t, through the trapezoid's β_t alone:
    ∂y_t/∂x_{t-1} = (1 - λ_t) Δ_t α_t (q_t · k_{t-1}) per channel, q and k turned by their
    running angles. Without the β term (an Euler step) that derivative would be 0."""
    x, log_decay, dt, lam, angle_steps, B, C = operands(7, 8)
    D = torch.randn(2, dtype=DTYPE, generator=gen(8))
    t = 5
    lam = lam.clone()
    lam[:, t - 1] = 0.0
    x = x.requires_grad_()

    def run(x):
        inputs = Mamba3Inputs(x, log_decay, dt, lam, angle_steps, B, C)
        if form == "chunked":
            return mamba3_chunked(inputs, D, 3)
        return mamba3_recurrent(inputs, D)

    y = run(x)
    (grad_now,) = torch.autograd.grad(y[:, t].sum(), x)
    (grad_before,) = torch.autograd.grad(run(x)[:, t - 1].sum(), x)
    torch.testing.assert_close(grad_before[:, t - 1], D[None, :, None].expand(2, 2, 3), **TOL)
    # q_t · k_{t-1} from complex numbers: Re(conj(c e^{iΦ_t}) b e^{iΦ_{t-1}}).
    phi = angle_steps.cumsum(1)
    turn = torch.exp(1j * F.pad(phi, (0, 3 - phi.shape[-1])))
    q = torch.complex(C[..., 0::2], C[..., 1::2])[:, t] * turn[:, t]
    k = torch.complex(B[..., 0::2], B[..., 1::2])[:, t - 1] * turn[:, t - 1]
    dot = (q.conj() * k).real.sum(-1)  # [2, H]
    beta = (1 - lam[:, t]) * dt[:, t] * torch.exp(log_decay[:, t])
    expected = (beta * dot)[..., None].expand(2, 2, 3)
    torch.testing.assert_close(grad_now[:, t - 1], expected, **TOL)
    assert expected.abs().min() > 1e-3


# ============================================================================================
# The layer against mamba_ssm's Mamba3 wiring


def build_mixer(d_model: int, options: dict, seed: int, std: float = 0.4):
    """The registry's mixer in float64 with every parameter redrawn from N(0, std²)."""
    torch.manual_seed(seed)
    mixer = get_architecture("mamba3").build(0, d_model, parse_options("mamba3", options))
    mixer = mixer.to(DTYPE)
    with torch.no_grad():
        for parameter in mixer.parameters():
            parameter.normal_(0.0, std)
    return mixer.eval()


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def mamba3_reference(m, u: torch.Tensor, *, wrong: str = "") -> torch.Tensor:
    """mamba_ssm's ``Mamba3`` forward (SISO) from the mixer's weights: in_proj split
    [z, x, B, C, dd_dt, dd_A, trap, angles]; B, C RMS-normed per group, expanded to the heads
    and biased per head; Δ = softplus(dd_dt + dt_bias), A = -softplus(dd_A) (≤ -A_floor),
    or from mamba_ssm c69aaab on A = -(1 + dd_A) where dd_A >= 0 and -1 / (1 - dd_A) below;
    λ = sigmoid(trap), angle steps Δ π tanh(angles); the complex recurrence above; y ⊙ SiLU(z)
    (or its per-head gated RMSNorm), out_proj. With the option's conv: a causal depthwise
    conv over x, B, C first. ``wrong``: "bias" (B, C biases dropped), "tanh" (raw angles) or
    "activation" (the other of A's two activations)."""
    batch, length, _ = u.shape
    di, heads, p, groups, n = m.d_inner, m.nheads, m.headdim, m.ngroups, m.d_state
    r = int(n * m.options.rope_fraction) // 2
    proj = u @ m.in_proj.weight.T
    sizes = [di, di, groups * n, groups * n, heads, heads, heads, r]
    z, x, B, C, dd_dt, dd_a, trap, angles = proj.split(sizes, dim=-1)
    if m.options.d_conv is not None:
        xbc = torch.cat([x, B, C], dim=-1).transpose(1, 2)
        k = m.conv.weight.shape[-1]
        xbc = F.conv1d(F.pad(xbc, (k - 1, 0)), m.conv.weight, m.conv.bias, groups=xbc.shape[1])
        x, B, C = xbc.transpose(1, 2).split([di, groups * n, groups * n], dim=-1)
    head_group = torch.arange(heads) // (heads // groups)
    B = rms(B.reshape(batch, length, groups, n), m.B_norm.weight)[:, :, head_group]
    C = rms(C.reshape(batch, length, groups, n), m.C_norm.weight)[:, :, head_group]
    if wrong != "bias":
        B, C = B + m.B_bias, C + m.C_bias
    dt = F.softplus(dd_dt + m.dt_bias)
    heavy_tail = (m.options.A_activation == "heavy_tail") != (wrong == "activation")
    tail = torch.where(dd_a >= 0, 1 + dd_a, 1 / (1 - dd_a))
    positive = tail if heavy_tail else F.softplus(dd_a)
    A = torch.minimum(-positive, torch.tensor(-m.options.A_floor, dtype=DTYPE))
    theta = angles if wrong == "tanh" else math.pi * torch.tanh(angles)
    steps = theta[:, :, None, :] * dt[..., None]
    x = x.reshape(batch, length, heads, p)
    y = paper_recurrence(x, A * dt, dt, torch.sigmoid(trap), steps, B, C, m.D)
    y = y.reshape(batch, length, di)
    if m.options.outproj_norm:
        y = rms(y.reshape(batch, length, heads, p), 1.0).reshape(batch, length, di)
        y = y * m.norm.weight * F.silu(z)
    else:
        y = y * F.silu(z)
    return y @ m.out_proj.weight.T


LAYER_CASES = [
    {},
    {"ngroups": 2, "headdim": 8, "rope_fraction": 1.0, "chunk_size": 3},
    {"d_state": 6, "d_conv": 3, "outproj_norm": True, "chunk_size": 4},
    {"A_activation": "heavy_tail", "ngroups": 2, "headdim": 4, "chunk_size": 5},
]


@pytest.mark.parametrize("options", LAYER_CASES)
def test_layer_equals_mamba_ssm_wiring(options: dict) -> None:
    mixer = build_mixer(16, options, seed=3)
    x = torch.randn(2, 7, 16, dtype=DTYPE, generator=gen(4))
    with torch.no_grad():
        out = mixer(x)
        torch.testing.assert_close(out, mamba3_reference(mixer, x), **TOL)
        assert not matches(out, mamba3_reference(mixer, x, wrong="bias"))
        assert not matches(out, mamba3_reference(mixer, x, wrong="tanh"))
        assert not matches(out, mamba3_reference(mixer, x, wrong="activation"))


@pytest.mark.parametrize("options", LAYER_CASES)
def test_module_mix_equals_mix_recurrent(options: dict) -> None:
    mixer = build_mixer(16, options, seed=0)
    x = torch.randn(3, 19, 16, dtype=DTYPE, generator=gen(1), requires_grad=True)
    fast, ref = mixer.mix(x), mixer.mix_recurrent(x)
    torch.testing.assert_close(fast, ref, **TOL)
    w = torch.randn(fast.shape, dtype=DTYPE, generator=gen(2))
    params = [x, *mixer.parameters()]
    for a, b in zip(
        torch.autograd.grad((fast * w).sum(), params),
        torch.autograd.grad((ref * w).sum(), params),
        strict=True,
    ):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("options", [{}, {"d_conv": 3}])
def test_resuming_and_the_state_site_equal_the_full_forward(options: dict) -> None:
    """From any cut: resumed from the state carried into it, or (the state site) from the
    state after it, a window starting the conv's halo before the cut."""
    mixer = build_mixer(16, options, seed=5)
    x = torch.randn(3, 13, 16, dtype=DTYPE, generator=gen(6))
    rows = torch.tensor([2, 0])
    with torch.no_grad():
        full = mixer(x)
        prefix = mixer.prefix(x)
        states, halo = prefix.states, prefix.halo
        assert halo == (options.get("d_conv") or 1) - 1
        for start in (0, 1, 6, 12):
            lo = max(0, start - halo)
            into = prefix.initial_state(rows, start)
            got = mixer.forward_from(x[rows, lo:], start - lo, into)
            torch.testing.assert_close(got, full[rows, start:], **TOL)
            after = tuple(part[rows, start] for part in states)
            got = mixer.forward_from(x[rows, lo:], start - lo, after, replace=True)
            torch.testing.assert_close(got, full[rows, start:], **TOL)


# ============================================================================================
# Registration, the short conv, sites, state size, init, options


def model(d: int = 16, **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(architecture="mamba3", d_model=d, vocab_size=20, **kw))


def test_registered_beyond_the_paper_as_mamba2_is() -> None:
    arch = get_architecture("mamba3")
    assert "mamba3" not in PAPER_ARCHITECTURES and "mamba2" not in PAPER_ARCHITECTURES
    assert BUILTIN_ARCHITECTURES.index("mamba3") > BUILTIN_ARCHITECTURES.index("mamba2")
    assert (arch.display, arch.mlp, arch.norm, arch.init) == ("Mamba-3", False, "rms", "mamba")
    assert arch.short_conv == "d_conv" and not arch.no_conv_switch
    for layer in model().layers:
        assert layer.mlp is None and isinstance(layer.mixer_norm, RMSNorm)


def test_no_short_conv_by_default_and_one_as_an_option() -> None:
    plain = site_names(model())
    assert not [s for s in plain if "conv" in s]
    assert "layers.0.mixer.state" in state_site_names(model())
    for switched in (model(mixer={"d_conv": 2}), model(short_conv=2)):
        names = set(site_names(switched))
        assert {"layers.0.mixer.conv.output", "layers.1.mixer.conv.output"} <= names
        conv = switched.get_submodule("layers.0.mixer.conv")
        assert conv.weight.shape == (32 + 2 * 64, 1, 2)  # over x, B and C, as Mamba-2's
        assert "layers.0.mixer.short_conv.output" not in names  # the switch sets d_conv
    assert site_names(model(short_conv="none")) == plain


@pytest.mark.parametrize(
    ("options", "d_conv"), [({}, 0), ({"d_conv": 4}, 4), ({"rope_fraction": 1.0}, 0)]
)
def test_state_size_is_the_state_it_keeps(options: dict, d_conv: int) -> None:
    """h [P, N], the previous step's B [N] and x [P], the running angles [R] per head (d = 32:
    d_inner 64, one head of 64, N = 64), plus the conv's buffer over x, B and C."""
    lm = model(d=32, max_len=13, mixer=options)
    mixer = lm.layers[0].mixer
    angles = 32 if options.get("rope_fraction") == 1.0 else 16
    own = 64 * 64 + 64 + 64 + angles
    assert mixer.state_size(13) == own + max(0, d_conv - 1) * (64 + 2 * 64)
    assert state_size(lm, 13) == 2 * mixer.state_size(13)
    with torch.no_grad():
        states = mixer.prefix(torch.randn(2, 13, 32)).states
    assert sum(part[0, -1].numel() for part in states) == own == mixer.recurrent_state_size(13)


def test_defaults_mirror_mamba2_and_the_init_is_the_references() -> None:
    lm = model(d=64)
    m = lm.layers[0].mixer
    assert (m.nheads, m.headdim, m.d_state, m.n_angles) == (2, 64, 64, 16)
    dt = F.softplus(m.dt_bias.detach())
    assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 1e-1 * (1 + 1e-5)
    for ones in (m.B_bias, m.C_bias, m.D, m.B_norm.weight, m.C_norm.weight):
        torch.testing.assert_close(ones.detach(), torch.ones_like(ones))
    bound = 64**-0.5  # PyTorch's Linear init, kept by mamba_ssm's LM init
    assert 0.9 * bound < m.in_proj.weight.abs().max() <= bound
    # Parameters from mamba_ssm's shapes: in_proj [z, x, B, C, dt, A, trap, angles], B and C
    # biases [H, N], their norms [N], dt_bias and D [H], out_proj; no conv, no A_log.
    in_proj = 64 * (2 * 128 + 2 * 64 + 3 * 2 + 16)
    assert count_parameters(m) == in_proj + 2 * 2 * 64 + 2 * 64 + 2 * 2 + 128 * 64


def test_the_heavy_tail_is_one_plus_a_above_zero_and_a_reciprocal_below() -> None:
    a = torch.tensor([-20.0, -1.0, 0.0, 0.5, 3.0], dtype=DTYPE)
    expected = torch.tensor([1 / 21, 0.5, 1.0, 1.5, 4.0], dtype=DTYPE)
    torch.testing.assert_close(heavy_tail(a), expected, **TOL)
    # Continuous, with slope 1 on either side of 0; its tail far above softplus's e^a.
    step = torch.tensor(1e-7, dtype=DTYPE)
    zero = torch.zeros((), dtype=DTYPE)
    for side in (heavy_tail(step) - heavy_tail(zero), heavy_tail(zero) - heavy_tail(-step)):
        assert abs(side / step - 1) < 1e-6
    assert heavy_tail(a[:1]) > 1e7 * F.softplus(a[:1])
    # The default is softplus, the reference's form up to 7438488.
    assert model(d=16).layers[0].mixer.options.A_activation == "softplus"


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"headdim": 7}, "model.mixer.headdim"),
        ({"ngroups": 3, "headdim": 4}, "model.mixer.ngroups"),
        ({"d_conv": 0}, "model.mixer.d_conv"),
        ({"d_state": 1}, "model.mixer.d_state"),
        ({"d_state": 3}, "model.mixer.rope_fraction"),
        ({"rope_fraction": 0.25}, "model.mixer.rope_fraction"),
        ({"dt_min": 0.2, "dt_max": 0.1}, "model.mixer.dt_max"),
        ({"is_mimo": True}, "model.mixer.is_mimo"),
        ({"A_activation": "exp"}, "model.mixer.A_activation"),
    ],
)
def test_bad_options_give_one_line_naming_the_field(options: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        model(mixer=options)
    message = str(err.value)
    assert message.startswith(field) and "\n" not in message, message
