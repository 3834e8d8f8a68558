"""The negative-eigenvalue option ``allow_neg_eigval`` (Grazzi et al., 2025, "Unlocking
State-Tracking in Linear RNNs Through Negative Eigenvalues") of Mamba, Mamba-2, DeltaNet and
Gated DeltaNet:

* Mamba / Mamba-2: the diagonal transition exp(Δ A) ∈ (0, 1) becomes 2 exp(Δ A) - 1 ∈ (-1, 1);
* DeltaNet / Gated DeltaNet: β = 2 sigmoid(·) ∈ (0, 2), so I - β k kᵀ has eigenvalue 1 - β ∈
  (-1, 1) along k (times the decay gate exp(g) for Gated DeltaNet).

Each layer against a step-by-step float64 recurrence written here (sharing only the weights
and the projections' wiring with ``src/``), every fast form against the reference form, the
effective transition read back from the states the module keeps (negative only with the
option), the option off equal bit for bit to a layer built without the field, and the option
through a run config's ``--set``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from reference_math import assert_same_function, gen, sigmoid, silu, softplus

from mecheval.errors import ConfigError
from mecheval.models import ModelConfig, build_model, kernels
from mecheval.models.mixers.base import Mixer
from mecheval.models.mixers.deltanet import DeltaNet, DeltaNetOptions
from mecheval.models.mixers.gated_deltanet import GatedDeltaNet, GatedDeltaNetOptions
from mecheval.models.mixers.mamba import Mamba, MambaOptions
from mecheval.models.mixers.mamba2 import Mamba2, Mamba2Options
from mecheval.models.ops.selective_scan import selective_scan, selective_scan_reference
from mecheval.models.ops.ssd import ssd_chunked, ssd_recurrent
from mecheval.training.config import config_from_data, resolve
from mecheval.training.presets import preset

DTYPE = torch.float64
TOL = {"rtol": 1e-10, "atol": 1e-10}
ARCHS = ["mamba", "mamba2", "deltanet", "gated_deltanet"]
CLASSES = {
    "mamba": (Mamba, MambaOptions),
    "mamba2": (Mamba2, Mamba2Options),
    "deltanet": (DeltaNet, DeltaNetOptions),
    "gated_deltanet": (GatedDeltaNet, GatedDeltaNetOptions),
}
D_MODEL, LENGTH = 8, 19


def transition(neg: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """Mamba's transition from e = exp(Δ A): e, or 2 e - 1 with negative eigenvalues."""
    return (lambda e: 2 * e - 1) if neg else (lambda e: e)


def build(arch: str, seed: int = 0, **options) -> Mixer:
    """A float64 layer whose transitions span their whole range at random inputs: Δ up to a
    few units (Mamba, Mamba-2), b_proj large enough for β near both ends, and Gated DeltaNet's
    decay gate mild enough for its eigenvalues to show."""
    cls, options_class = CLASSES[arch]
    if arch != "mamba":
        options.setdefault("chunk_size", 8)  # LENGTH spans several chunks
    torch.manual_seed(seed)
    mixer = cls(D_MODEL, options_class(**options)).to(DTYPE)
    g = gen(seed + 1)
    with torch.no_grad():
        if arch == "mamba":
            mixer.dt_proj.bias.copy_(torch.rand(mixer.d_inner, generator=g, dtype=DTYPE) * 3 - 1)
        elif arch == "mamba2":
            mixer.dt_bias.copy_(torch.rand(mixer.nheads, generator=g, dtype=DTYPE) * 3 - 1)
        else:
            mixer.b_proj.weight.normal_(0.0, 2.0, generator=g)
        if arch == "gated_deltanet":
            mixer.A_log.fill_(math.log(0.05))
    return mixer


def inputs(seed: int, batch: int = 2, length: int = LENGTH) -> torch.Tensor:
    return torch.randn(batch, length, D_MODEL, generator=gen(seed), dtype=DTYPE)


# ------------------------------------------------------ step-by-step recurrences, float64


def naive_mamba(m: Mamba, u: torch.Tensor, neg: bool) -> torch.Tensor:
    x, z = m.in_proj(u).chunk(2, dim=-1)
    x = silu(m.conv(x))
    dt, b, c = m.x_proj(x).split([m.dt_rank, m.d_state, m.d_state], dim=-1)
    delta = softplus(m.dt_proj(dt))
    A = -torch.exp(m.A_log)
    a_of = transition(neg)
    h = u.new_zeros(u.shape[0], m.d_inner, m.d_state)
    ys = []
    for t in range(u.shape[1]):
        a = a_of(torch.exp(delta[:, t, :, None] * A))
        h = a * h + delta[:, t, :, None] * b[:, t, None, :] * x[:, t, :, None]
        ys.append((h * c[:, t, None, :]).sum(-1) + m.D * x[:, t])
    return m.out_proj(torch.stack(ys, dim=1) * silu(z))


def naive_mamba2(m: Mamba2, u: torch.Tensor, neg: bool) -> torch.Tensor:
    batch, length, _ = u.shape
    heads, p, n = m.nheads, m.headdim, m.d_state
    z, xbc, dt = m.in_proj(u).split([m.d_inner, m.conv_dim, heads], dim=-1)
    xbc = silu(m.conv(xbc))
    x, b, c = xbc.split([m.d_inner, m.ngroups * n, m.ngroups * n], dim=-1)
    x = x.view(batch, length, heads, p)
    group = [h // (heads // m.ngroups) for h in range(heads)]
    b = b.view(batch, length, m.ngroups, n)[:, :, group]  # [batch, T, H, N]
    c = c.view(batch, length, m.ngroups, n)[:, :, group]
    delta = softplus(dt + m.dt_bias)
    A = -torch.exp(m.A_log)
    a_of = transition(neg)
    h = u.new_zeros(batch, heads, p, n)
    ys = []
    for t in range(length):
        a = a_of(torch.exp(delta[:, t] * A))[:, :, None, None]
        h = a * h + (delta[:, t, :, None] * x[:, t])[..., None] * b[:, t, :, None, :]
        ys.append((h * c[:, t, :, None, :]).sum(-1) + m.D[:, None] * x[:, t])
    y = torch.stack(ys, dim=1)
    return m.out_proj(m.norm(y.flatten(2), z))


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # fla's l2norm, eps inside


def naive_delta(
    m: DeltaNet | GatedDeltaNet, u: torch.Tensor, neg: bool, gated: bool
) -> torch.Tensor:
    batch, length, _ = u.shape
    heads = m.num_heads
    d_k = m.head_k_dim if gated else m.head_dim
    d_v = m.head_v_dim if gated else m.head_dim
    q = unit(silu(m.q_conv(m.q_proj(u))).view(batch, length, heads, d_k)) / math.sqrt(d_k)
    k = unit(silu(m.k_conv(m.k_proj(u))).view(batch, length, heads, d_k))
    v = silu(m.v_conv(m.v_proj(u))).view(batch, length, heads, d_v)
    beta = sigmoid(m.b_proj(u)) * (2.0 if neg else 1.0)  # [batch, T, H]
    if gated:
        alpha = torch.exp(-torch.exp(m.A_log) * softplus(m.a_proj(u) + m.dt_bias))
    S = u.new_zeros(batch, heads, d_v, d_k)
    outs = []
    for t in range(length):
        if gated:
            S = alpha[:, t, :, None, None] * S
        kt = k[:, t, :, :, None]  # [batch, H, d_k, 1]
        error = v[:, t, :, :, None] - S @ kt
        S = S + beta[:, t, :, None, None] * error @ kt.transpose(-1, -2)
        outs.append((S @ q[:, t, :, :, None])[..., 0])
    o = torch.stack(outs, dim=1)  # [batch, T, H, d_v]
    gate = m.g_proj(u).view(batch, length, heads, d_v) if gated else None
    o = m.o_norm(o, gate) if gated else m.o_norm(o)
    return m.o_proj(o.reshape(batch, length, -1))


NAIVE = {
    "mamba": naive_mamba,
    "mamba2": naive_mamba2,
    "deltanet": lambda m, u, neg: naive_delta(m, u, neg, gated=False),
    "gated_deltanet": lambda m, u, neg: naive_delta(m, u, neg, gated=True),
}


# --------------------------------------------------------------- (1) against the recurrence


@pytest.mark.parametrize("neg", [True, False])
@pytest.mark.parametrize("arch", ARCHS)
def test_forward_equals_a_step_by_step_recurrence(arch: str, neg: bool) -> None:
    m = build(arch, allow_neg_eigval=neg)
    u = inputs(1)
    with torch.no_grad():
        expected = NAIVE[arch](m, u, neg)
        torch.testing.assert_close(m(u), expected, **TOL)
        # The recurrence tells the two settings apart at these inputs.
        assert not torch.allclose(NAIVE[arch](m, u, not neg), expected, **TOL)


# ------------------------------------------------------- (2) fast forms = the reference form


def scan_inputs(seed: int, length: int, dtype=DTYPE, batch: int = 2, channels: int = 6, n=5):
    g = gen(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)

    delta = softplus(3 * r(batch, length, channels))
    return (
        r(batch, length, channels),
        delta,
        -torch.exp(r(channels, n)),
        *(r(batch, length, n) for _ in range(2)),
        r(channels),
    )


@pytest.mark.parametrize(("length", "seed"), [(1, 0), (2, 1), (23, 2)])
def test_selective_scan_fast_form_equals_reference(
    length: int, seed: int, kernel_path: str, native_calls: list
) -> None:
    args = [a.requires_grad_() for a in scan_inputs(seed, length)]
    fast = selective_scan(*args, neg_eigval=True)
    ref = selective_scan_reference(*args, neg_eigval=True)
    assert_same_function(fast, ref, args, ["x", "delta", "A", "B", "C", "D"], seed + 100, **TOL)
    # float32, the training dtype, where the C kernel would run: routed to the PyTorch form.
    args32 = [a.detach().float().requires_grad_() for a in args]
    y = selective_scan(*args32, neg_eigval=True)
    y.sum().backward()
    torch.testing.assert_close(y, ref.float(), rtol=1e-4, atol=1e-4)
    assert native_calls == []


def test_selective_scan_under_vmap_and_off_the_fused_kernel(monkeypatch) -> None:
    stacked = [
        torch.stack([a, b]) for a, b in zip(scan_inputs(3, 9), scan_inputs(4, 9), strict=True)
    ]
    got = torch.func.vmap(lambda *a: selective_scan(*a, neg_eigval=True))(*stacked)
    for i in range(2):
        expected = selective_scan_reference(*(x[i] for x in stacked), neg_eigval=True)
        torch.testing.assert_close(got[i], expected, **TOL)

    # The fused CUDA kernel computes exp(Δ A) only: with the option it is never called.
    def fused(*args):
        raise AssertionError("the fused kernel ran with neg_eigval")

    monkeypatch.setattr(kernels, "_on_device", lambda x: True)
    monkeypatch.setattr(kernels, "_selective_scan_impl", fused)
    args = scan_inputs(5, 7)
    with kernels.fused_kernels():
        y = selective_scan(*args, neg_eigval=True)
    torch.testing.assert_close(y, selective_scan_reference(*args, neg_eigval=True), **TOL)


def ssd_inputs(seed: int, length: int, heads: int = 4, groups: int = 2, p: int = 3, n: int = 4):
    g = gen(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=DTYPE)

    x, dt = r(2, length, heads, p), softplus(3 * r(2, length, heads))
    return x, dt, -torch.exp(r(heads)), r(2, length, groups, n), r(2, length, groups, n), r(heads)


@pytest.mark.parametrize(
    ("length", "chunk", "seed"), [(1, 4, 0), (19, 5, 1), (19, 1, 2), (24, 64, 3)]
)
def test_ssd_chunked_equals_recurrent(length: int, chunk: int, seed: int) -> None:
    args = [a.requires_grad_() for a in ssd_inputs(seed, length)]
    fast = ssd_chunked(*args, chunk_size=chunk, neg_eigval=True)
    ref = ssd_recurrent(*args, neg_eigval=True)
    assert_same_function(fast, ref, args, ["x", "dt", "A", "B", "C", "D"], seed + 100, **TOL)


def reference_form(m: Mixer, u: torch.Tensor) -> torch.Tensor:
    """The layer through its step-by-step reference (Mamba: the written-out scan)."""
    if isinstance(m, Mamba):
        xs, delta, b, c, z = m.ssm_inputs(u)
        y = selective_scan_reference(xs, delta, m.A(), b, c, m.D, neg_eigval=True)
        return m.out_proj(y * torch.nn.functional.silu(z))
    return m.mix_recurrent(u)


@pytest.mark.parametrize("arch", ARCHS)
def test_layer_fast_forms_equal_the_reference_form(arch: str) -> None:
    m = build(arch, allow_neg_eigval=True)
    u = inputs(2).requires_grad_()
    fast, ref = m(u), reference_form(m, u)
    torch.testing.assert_close(fast, ref, **TOL)
    w = torch.randn(ref.shape, generator=gen(7), dtype=DTYPE)
    leaves = [u, *m.parameters()]
    g_fast = torch.autograd.grad((fast * w).sum(), leaves, allow_unused=True)
    g_ref = torch.autograd.grad((ref * w).sum(), leaves, allow_unused=True)
    for a, b in zip(g_fast, g_ref, strict=True):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b, **TOL)
    # Resumed from the state kept at a cut (the engine's prefix path and the state site).
    with torch.no_grad():
        u = u.detach()
        full = m.mix(u)
        prefix = m.prefix(u)
        states = prefix.states
        rows = torch.arange(u.shape[0])
        for cut in (1, 8, LENGTH - 1):
            carried = prefix.initial_state(rows, cut)
            torch.testing.assert_close(m.mix_from(u, cut, carried), full[:, cut:], **TOL)
            after = states[:, cut]
            replaced = m.mix_from(u, cut, after, replace=True)
            torch.testing.assert_close(replaced, full[:, cut:], **TOL)


# ------------------------------------------ (3) the transition's eigenvalues, read back


def rayleigh(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """<a, b> / <b, b> over the last dimension: the factor a = λ b is measured by."""
    return (a * b).sum(-1) / (b * b).sum(-1)


def effective_eigenvalues(m: Mixer, u: torch.Tensor) -> torch.Tensor:
    """The transition's eigenvalues at every step t ≥ 1, measured from the states the module
    keeps after each position (``final_states``) and the drive of step t: what the states
    actually did, not what an option says."""
    states = m.final_states(u)
    prev, now = states[:, :-1], states[:, 1:]
    if isinstance(m, Mamba):  # h_t = a_t ⊙ h_{t-1} + Δ_t B_t x_t, a per channel and state
        xs, delta, b, _, _ = m.ssm_inputs(u)
        drive = (delta * xs)[:, 1:, :, None] * b[:, 1:, None, :]
        keep = prev.abs() > 1e-3  # a ratio is read where the previous state is not ~0
        return ((now - drive) / prev)[keep]
    if isinstance(m, Mamba2):  # h_t = a_t h_{t-1} + Δ_t x_t B_tᵀ, a per head
        x, delta, b, _, _ = m.ssd_inputs(u)
        b = b.repeat_interleave(m.nheads // m.ngroups, dim=2)
        drive = (delta[..., None] * x)[:, 1:, :, :, None] * b[:, 1:, :, None, :]
        return rayleigh((now - drive).flatten(-2), prev.flatten(-2))
    # DeltaNet, Gated DeltaNet: S_t = α_t S_{t-1} (I - β_t k_t k_tᵀ) + β_t v_t k_tᵀ. Along a w ⊥
    # k_t the state decays by α_t; along k_t, S_t k_t - α S_{t-1} k_t = β_t (v_t - α S_{t-1} k_t)
    # gives β_t, and the eigenvalue there is α_t (1 - β_t).
    inputs = m.qkv_beta(u) if isinstance(m, DeltaNet) else m.rule_inputs(u)
    k, v = (t.transpose(1, 2)[:, 1:] for t in inputs[1:3])  # [B, T - 1, H, d]
    w = torch.randn(k.shape, generator=gen(11), dtype=DTYPE)
    w = w - (w * k).sum(-1, keepdim=True) * k / (k * k).sum(-1, keepdim=True)
    alpha = rayleigh((now @ w[..., None])[..., 0], (prev @ w[..., None])[..., 0])
    before = alpha[..., None] * (prev @ k[..., None])[..., 0]
    beta = rayleigh((now @ k[..., None])[..., 0] - before, v - before)
    return torch.cat([(alpha * (1 - beta)).flatten(), alpha.flatten()])


@pytest.mark.parametrize("arch", ARCHS)
def test_transitions_go_negative_with_the_option_only(arch: str) -> None:
    u = inputs(3, batch=4)
    with torch.no_grad():
        on = effective_eigenvalues(build(arch, allow_neg_eigval=True), u)
        off = effective_eigenvalues(build(arch), u)
    assert on.numel() > 20 and off.numel() > 20
    assert on.min() < -0.2, f"no negative eigenvalue with the option: min {on.min():.3g}"
    assert on.abs().max() <= 1 + 1e-6  # still a contraction: (-1, 1)
    assert off.min() >= -1e-8, f"a negative eigenvalue without the option: {off.min():.3g}"
    assert off.max() <= 1 + 1e-6


# ------------------------------------------------------------ (4) off = as before, bit for bit


@pytest.mark.parametrize("arch", ARCHS)
def test_option_off_is_bit_identical_to_a_layer_without_it(arch: str) -> None:
    cls, options_class = CLASSES[arch]
    assert options_class().allow_neg_eigval is False
    u = torch.randn(2, 37, 16, generator=gen(5))
    outs, grads = [], []
    for options in ({}, {"allow_neg_eigval": False}):
        torch.manual_seed(4)
        mixer = cls(16, options_class(**options))
        x = u.clone().requires_grad_()
        y = mixer(x)
        outs.append(y)
        grads.append(torch.autograd.grad(y.square().sum(), [x, *mixer.parameters()]))
    assert torch.equal(outs[0], outs[1])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)
    # and through the whole model, as a run config builds it
    logits = []
    for mixer in ({}, {"allow_neg_eigval": False}):
        torch.manual_seed(0)
        cfg = ModelConfig(
            architecture=arch, d_model=16, n_layers=2, vocab_size=20, max_len=40, mixer=mixer
        )
        logits.append(build_model(cfg)(torch.randint(0, 20, (2, 37), generator=gen(6))))
    assert torch.equal(logits[0], logits[1])


# ---------------------------------------------------------------------- the option in configs


@pytest.mark.parametrize("arch", ARCHS)
def test_the_option_is_set_from_the_command_line(arch: str) -> None:
    data = preset("tiny", "ar", arch)
    cfg = resolve(config_from_data(data, ["model.mixer.allow_neg_eigval=true"]))
    mixers = [block.mixer for block in build_model(cfg.model).layers]
    assert mixers and all(m.options.allow_neg_eigval for m in mixers)
    with pytest.raises(ConfigError) as err:
        resolve(config_from_data(data, ["model.mixer.allow_neg_eigval=maybe"]))
    message = str(err.value)
    assert message.startswith("model.mixer.allow_neg_eigval: ") and "\n" not in message
