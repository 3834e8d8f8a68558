"""The delta rule and the gated delta rule as Triton kernels (models/ops/delta_rule_triton.py):
forward and every gradient against the float64 references, a vmapped stack against each model
alone, when a training step runs them, and DeltaNet and Gated DeltaNet stacks trained through
them against one-by-one runs.

On a GPU the kernels run compiled; without one, under Triton's interpreter on the CPU
(``TRITON_INTERPRET=1``, which conftest.py sets before triton is imported).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from torch.func import grad_and_value, vmap

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # else interpreted (conftest.py)
#: The stack tests' batch and two steps (evaluated after each): small, as the interpreter
#: runs one program per document and head, its backward most slowly.
BATCH = 4
rule_triton = importlib.import_module("mecheval.models.ops.delta_rule_triton")

from small_runs import config  # noqa: E402
from test_training_group import assert_stack_equals_one_by_one  # noqa: E402
from test_training_group import spy as spy  # noqa: E402 - the fixture

from mecheval.models.ops import triton_path  # noqa: E402
from mecheval.models.ops.delta_rule import (  # noqa: E402
    delta_rule_chunked,
    delta_rule_recurrent,
    l2_normalize,
)
from mecheval.models.ops.gated_delta_rule import gated_delta_rule_recurrent  # noqa: E402
from mecheval.tasks import build_datasets  # noqa: E402
from mecheval.training import resolve  # noqa: E402


def rule_inputs(*lead: int, length: int, d_k: int, d_v: int, seed: int = 0):
    """q, k (unit length, as the modules pass them), v, β ∈ (0, 2), g ≤ 0."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, length, d_k, generator=gen)
    k = l2_normalize(torch.randn(*lead, length, d_k, generator=gen))
    v = torch.randn(*lead, length, d_v, generator=gen)
    beta = torch.rand(*lead, length, generator=gen) * 2
    g = -torch.rand(*lead, length, generator=gen)
    return [t.to(DEVICE) for t in (q, k, v, beta, g)]


def reference(q, k, v, beta, g=None):
    if g is None:
        return delta_rule_recurrent(q, k, v, beta)
    return gated_delta_rule_recurrent(q, k, v, beta, g)


@pytest.mark.parametrize("gated", [False, True])
def test_forward_and_gradients_equal_the_float64_reference(gated: bool) -> None:
    # d_k 5 and d_v 6: blocks of 8, masked
    q, k, v, beta, g = (t.requires_grad_() for t in rule_inputs(2, 3, length=9, d_k=5, d_v=6))
    inputs = [q, k, v, beta] + ([g] if gated else [])
    o = rule_triton.delta_rule_triton(*inputs)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, inputs, do)
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    o_ref = reference(*ref_inputs)
    ref_grads = torch.autograd.grad(o_ref, ref_inputs, do.double())
    torch.testing.assert_close(o.double(), o_ref, rtol=1e-5, atol=1e-5)
    names = ["q", "k", "v", "beta", "g"]
    for name, got, want in zip(names, grads, ref_grads, strict=False):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("gated", [False, True])
def test_a_vmapped_stack_equals_each_model_alone(gated: bool) -> None:
    """Each stacked model projects its own values; the keys, queries and gates are shared by
    the stack (in_dims None) and broadcast by the vmap rule."""
    q, k, v, beta, g = rule_inputs(2, 2, length=6, d_k=4, d_v=4)
    w = torch.randn(3, 4, 4, device=DEVICE)
    gate = g if gated else None

    def loss(rule, w, q, k, v, beta, g):
        return (rule(q, k, v @ w, beta, g) ** 2).mean()

    def triton_loss(w, *inputs):
        return loss(rule_triton.delta_rule_triton, w, *inputs)

    def reference_loss(w, *inputs):
        return loss(reference, w, *inputs)

    in_dims = (0, None, None, None, None, None)
    grads, values = vmap(grad_and_value(triton_loss), in_dims=in_dims)(w, q, k, v, beta, gate)
    for m in range(3):
        want, value = grad_and_value(reference_loss)(w[m], q, k, v, beta, gate)
        torch.testing.assert_close(values[m], value, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grads[m], want, rtol=1e-4, atol=1e-5)


def test_training_runs_them_only_when_switched_on(monkeypatch) -> None:
    """Not yet measured on a card, the delta rule's kernels run only with
    ``MECHEVAL_TRITON=all``, and then only where a gradient is wanted."""
    calls = []
    real = rule_triton.delta_rule_triton
    monkeypatch.setattr(rule_triton, "delta_rule_triton", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(triton_path, "TRITON_DEVICES", (DEVICE,))
    q, k, v, beta, _ = (t.requires_grad_() for t in rule_inputs(2, 2, length=5, d_k=4, d_v=4))
    monkeypatch.delenv("MECHEVAL_TRITON", raising=False)
    delta_rule_chunked(q, k, v, beta, chunk_size=4)
    assert calls == []
    monkeypatch.setenv("MECHEVAL_TRITON", "all")
    with torch.no_grad():
        delta_rule_chunked(q, k, v, beta, chunk_size=4)
    assert calls == []
    o = delta_rule_chunked(q, k, v, beta, chunk_size=4)
    assert calls == [1]
    torch.testing.assert_close(o, delta_rule_recurrent(q, k, v, beta), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["deltanet", "gated_deltanet"])
def test_a_stack_through_the_kernels_equals_one_by_one(
    tmp_path: Path, monkeypatch, spy, arch: str
) -> None:
    """Two runs trained as one vmapped stack, the rule in the kernels, leave the run folders
    two one-by-one runs leave (float32 tolerance); the stack's rule ran as one launch over
    both models' batches, the single runs' over one."""
    batches = []
    real = rule_triton.rule_forward
    monkeypatch.setattr(
        rule_triton, "rule_forward", lambda *a: batches.append(a[0].shape[0]) or real(*a)
    )
    monkeypatch.setattr(triton_path, "TRITON_DEVICES", (DEVICE,))
    monkeypatch.setenv("MECHEVAL_TRITON", "all")
    data = build_datasets(resolve(config()).task)
    assert_stack_equals_one_by_one(tmp_path, data, arch, DEVICE, spy, steps=2, batch_size=BATCH)
    batch = BATCH
    assert {batch, 2 * batch} <= set(batches)  # (and the probe's two documents before)
