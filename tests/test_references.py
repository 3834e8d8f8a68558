"""Mixers against independent references written here, from their definitions.

The fast forms in ``src/`` are compared with code that shares nothing with them but the
weights: each reference below is written from the published definition, with explicit loops
and plain tensor arithmetic, in float64.

* :func:`attention_reference` - causal softmax multi-head attention as zoology's ``MHA``
  (``zoology/mixers/attention.py``): one fused projection ``Wqkv`` whose 3·d outputs are laid
  out ``(three h d)`` (q of every head, then k, then v), per head
  ``softmax(q kᵀ / sqrt(d_head) + causal mask) v``, heads concatenated ``(h d)``, then
  ``out_proj`` with bias.
* :func:`delta_rule_reference` - the delta rule with a general β (Schlag et al., 2021;
  Yang et al., 2024), one batch element, one head and one step at a time:
  ``S_t = S_{t-1} + β_t (v_t - S_{t-1} k_t) k_tᵀ``, ``o_t = S_t q_t``.
* :func:`deltanet_reference` - the whole layer as fla's ``DeltaNet``
  (``fla/layers/delta_net.py``, defaults ``qk_activation="silu"``, ``qk_norm="l2"``,
  ``use_beta=True``, ``use_gate=False``): SiLU of a causal depthwise short conv of each of the
  q, k and v projections, q and k l2-normalised per head (fla's ``x * rsqrt(Σx² + 1e-6)``), q
  scaled by ``d_head^-0.5`` (fla's kernel default), ``β = sigmoid(b_proj x)``, the delta rule,
  a per-head RMSNorm of the output (``o_norm``), then ``o_proj``.

Every comparison is made able to fail: next to each match, a deliberately wrong variant of the
reference (causal mask dropped, β forced to 1, q left unscaled, ...) is asserted NOT to match
at the same tolerance.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mecheval.models.mixers.attention import Attention
from mecheval.models.mixers.deltanet import DeltaNet
from mecheval.models.ops.delta_rule import delta_rule_chunked, delta_rule_recurrent
from mecheval.models.registry import get_architecture, parse_options

DTYPE = torch.float64
# float64 round-off in these sizes is ~1e-15; every wrong variant misses by far more.
RTOL = 1e-10
ATOL = 1e-10


def matches(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    return torch.allclose(actual, expected, rtol=RTOL, atol=ATOL)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL)


def build_mixer(name: str, d_model: int, options: dict, seed: int, std: float) -> torch.nn.Module:
    """The registry's mixer in float64, every parameter redrawn from N(0, std²)."""
    torch.manual_seed(seed)
    mixer = get_architecture(name).build(0, d_model, parse_options(name, options)).to(DTYPE)
    with torch.no_grad():
        for parameter in mixer.parameters():
            parameter.normal_(0.0, std)
    return mixer.eval()


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-x))


# --------------------------------------------------------------------------------------------
# Causal softmax attention (zoology mixers/attention.py)


def attention_reference(
    mixer: Attention,
    x: torch.Tensor,
    *,
    causal: bool = True,
    scale: float | None = None,
    layout: str = "three h d",
) -> torch.Tensor:
    """Causal softmax MHA from its definition, one head at a time.

    ``scale`` defaults to 1/sqrt(d_head); ``causal=False``, another ``scale`` or
    ``layout="h three d"`` give the wrong variants used to show the comparison can fail.
    """
    batch, length, d = x.shape
    heads = mixer.num_heads
    d_head = d // heads
    scale = 1.0 / math.sqrt(d_head) if scale is None else scale

    qkv = x @ mixer.qkv.weight.T
    if mixer.qkv.bias is not None:
        qkv = qkv + mixer.qkv.bias

    def columns(which: int, h: int) -> slice:
        # zoology: rearrange(qkv, "... (three h d) -> ... three h d"), so column
        # which·d + h·d_head + j holds coordinate j of head h's q (0), k (1) or v (2).
        if layout == "three h d":
            start = which * d + h * d_head
        elif layout == "h three d":  # wrong variant
            start = h * 3 * d_head + which * d_head
        else:
            raise ValueError(layout)
        return slice(start, start + d_head)

    query_pos = torch.arange(length)[:, None]
    key_pos = torch.arange(length)[None, :]
    future = key_pos > query_pos  # [T, T]: key after query

    outputs = []
    for h in range(heads):
        q = qkv[..., columns(0, h)]  # [B, T, d_head]
        k = qkv[..., columns(1, h)]
        v = qkv[..., columns(2, h)]
        scores = (q @ k.transpose(1, 2)) * scale  # [B, T(query), T(key)]
        if causal:
            scores = scores.masked_fill(future, float("-inf"))
        weights = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        outputs.append(weights @ v)
    y = torch.cat(outputs, dim=-1)  # "... h d -> ... (h d)"
    return y @ mixer.out_proj.weight.T + mixer.out_proj.bias


@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("num_heads", [1, 2, 4])
def test_attention_matches_reference(num_heads, qkv_bias):
    d, length = 16, 9
    mixer = build_mixer(
        "attention", d, {"num_heads": num_heads, "qkv_bias": qkv_bias}, seed=num_heads, std=0.5
    )
    assert isinstance(mixer, Attention)
    x = torch.randn(3, length, d, dtype=DTYPE, generator=torch.Generator().manual_seed(7))

    with torch.no_grad():
        out = mixer.mix(x)
        assert_matches(out, attention_reference(mixer, x))

        # The tolerance separates the right function from near misses:
        assert not matches(out, attention_reference(mixer, x, causal=False))  # mask dropped
        assert not matches(out, attention_reference(mixer, x, scale=1.0))  # no 1/sqrt(d_head)
        assert not matches(out, attention_reference(mixer, x, scale=0.0))  # uniform attention
        if num_heads > 1:  # with one head both layouts are the same
            assert not matches(out, attention_reference(mixer, x, layout="h three d"))


# --------------------------------------------------------------------------------------------
# The delta rule with a general β


def delta_rule_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """S_t = S_{t-1} + β_t (v_t - S_{t-1} k_t) k_tᵀ, o_t = S_t q_t, from S_0 = 0.

    q, k: [B, H, T, d_k]; v: [B, H, T, d_v]; beta: [B, H, T] -> o: [B, H, T, d_v].
    """
    batch, heads, length, d_k = k.shape
    d_v = v.shape[-1]
    out = torch.zeros(batch, heads, length, d_v, dtype=v.dtype)
    for b in range(batch):
        for h in range(heads):
            state = torch.zeros(d_v, d_k, dtype=v.dtype)
            for t in range(length):
                k_t, v_t, q_t = k[b, h, t], v[b, h, t], q[b, h, t]
                state = state + beta[b, h, t] * torch.outer(v_t - state @ k_t, k_t)
                out[b, h, t] = state @ q_t
    return out


def delta_rule_inputs(seed: int, batch=2, heads=2, length=11, d_k=5, d_v=4):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, length, d_k, dtype=DTYPE, generator=g)
    k = torch.randn(batch, heads, length, d_k, dtype=DTYPE, generator=g)
    k = k / k.norm(dim=-1, keepdim=True)  # unit keys, as DeltaNet feeds them
    v = torch.randn(batch, heads, length, d_v, dtype=DTYPE, generator=g)
    beta = 0.05 + 0.9 * torch.rand(batch, heads, length, dtype=DTYPE, generator=g)  # in (0, 1)
    return q, k, v, beta


def test_delta_rule_recurrent_matches_reference():
    q, k, v, beta = delta_rule_inputs(0)
    expected = delta_rule_reference(q, k, v, beta)
    out = delta_rule_recurrent(q, k, v, beta)
    assert_matches(out, expected)
    assert not matches(out, delta_rule_reference(q, k, v, torch.ones_like(beta)))  # β forced to 1


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 11, 16])  # 3 and 4 do not divide T = 11
def test_delta_rule_chunked_matches_reference(chunk_size):
    q, k, v, beta = delta_rule_inputs(1)
    expected = delta_rule_reference(q, k, v, beta)
    out = delta_rule_chunked(q, k, v, beta, chunk_size)
    assert_matches(out, expected)
    assert not matches(out, delta_rule_reference(q, k, v, torch.ones_like(beta)))  # β forced to 1


# --------------------------------------------------------------------------------------------
# The DeltaNet layer (fla layers/delta_net.py)


def deltanet_reference(
    mixer: DeltaNet,
    x: torch.Tensor,
    *,
    scale_q: bool = True,
    beta_one: bool = False,
    causal_conv: bool = True,
) -> torch.Tensor:
    """fla's DeltaNet forward from the mixer's weights; the keyword arguments give the wrong
    variants (q unscaled, β forced to 1, the short conv padded on the wrong side)."""
    batch, length, d = x.shape
    heads = mixer.num_heads
    d_head = d // heads

    def short_conv(y: torch.Tensor, conv) -> torch.Tensor:
        # Depthwise conv1d over time; k-1 zeros on the left make it causal (fla's
        # ShortConvolution pads by k-1 and keeps the first T outputs: the same thing).
        size = conv.weight.shape[-1]
        padding = (size - 1, 0) if causal_conv else (0, size - 1)
        y = F.pad(y.transpose(1, 2), padding)  # [B, C, T + k - 1]
        y = F.conv1d(y, conv.weight, conv.bias, groups=d)
        return y.transpose(1, 2)

    def branch(proj, conv) -> torch.Tensor:
        y = short_conv(x @ proj.weight.T, conv)
        y = y * sigmoid(y)  # SiLU
        return y.reshape(batch, length, heads, d_head)  # "... (h d) -> ... h d"

    def l2norm(y: torch.Tensor) -> torch.Tensor:
        return y * torch.rsqrt((y * y).sum(-1, keepdim=True) + 1e-6)

    q = l2norm(branch(mixer.q_proj, mixer.q_conv))
    k = l2norm(branch(mixer.k_proj, mixer.k_conv))
    v = branch(mixer.v_proj, mixer.v_conv)
    if scale_q:
        q = q * d_head**-0.5
    beta = sigmoid(x @ mixer.b_proj.weight.T)  # [B, T, H]
    if beta_one:
        beta = torch.ones_like(beta)

    def to_heads(y: torch.Tensor) -> torch.Tensor:
        return y.permute(0, 2, 1, 3)  # [B, T, H, d_head] -> [B, H, T, d_head]

    o = delta_rule_reference(to_heads(q), to_heads(k), to_heads(v), beta.permute(0, 2, 1))
    o = o.permute(0, 2, 1, 3)  # [B, T, H, d_head]
    if mixer.o_norm is not None:
        mean_square = (o * o).mean(-1, keepdim=True)
        o = o * torch.rsqrt(mean_square + mixer.o_norm.eps) * mixer.o_norm.weight
    return o.reshape(batch, length, d) @ mixer.o_proj.weight.T


@pytest.mark.parametrize("output_norm", [True, False])
@pytest.mark.parametrize("num_heads", [1, 2])
def test_deltanet_matches_reference(num_heads, output_norm):
    d, length = 8, 10
    options = {"num_heads": num_heads, "chunk_size": 4, "output_norm": output_norm}
    mixer = build_mixer("deltanet", d, options, seed=10 + num_heads, std=0.5)
    assert isinstance(mixer, DeltaNet)
    x = torch.randn(2, length, d, dtype=DTYPE, generator=torch.Generator().manual_seed(3))

    with torch.no_grad():
        out = mixer.mix(x)
        assert_matches(out, deltanet_reference(mixer, x))

        # Through o_norm an unscaled q changes the output only via the norm's eps (RMSNorm is
        # otherwise scale-invariant); o is small enough here that this still shows.
        assert not matches(out, deltanet_reference(mixer, x, scale_q=False))
        assert not matches(out, deltanet_reference(mixer, x, beta_one=True))
        assert not matches(out, deltanet_reference(mixer, x, causal_conv=False))
