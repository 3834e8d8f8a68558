"""Mamba's selective scan as Triton kernels (models/ops/selective_scan_triton.py): forward and
every gradient against the float64 reference, a vmapped stack against each model alone, and a
Mamba stack trained through them against one-by-one runs.

On a GPU the kernels run compiled; without one, under Triton's interpreter on the CPU
(``TRITON_INTERPRET=1``, which conftest.py sets before triton is imported), so CI checks the
kernels' arithmetic although it cannot run them on a card.
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
triton_scan = importlib.import_module("mecheval.models.ops.selective_scan_triton")

from small_runs import config  # noqa: E402
from test_training_group import assert_stack_equals_one_by_one  # noqa: E402
from test_training_group import spy as spy  # noqa: E402 - the fixture

from mecheval.models.ops import selective_scan as scan_module  # noqa: E402
from mecheval.models.ops import triton_path  # noqa: E402
from mecheval.models.ops.selective_scan import selective_scan_reference  # noqa: E402
from mecheval.tasks import build_datasets  # noqa: E402
from mecheval.training import resolve  # noqa: E402


def scan_inputs(*lead: int, length: int, channels: int, n_state: int, seed: int = 0):
    """x, Δ, A, B, C for a scan; ``lead`` are the leading (stack, batch) sizes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, length, channels, generator=g)
    delta = torch.rand(*lead, length, channels, generator=g) * 0.6 + 0.01
    A = -torch.rand(*lead[:-1], channels, n_state, generator=g) * 3
    B = torch.randn(*lead, length, n_state, generator=g)
    C = torch.randn(*lead, length, n_state, generator=g)
    return [t.to(DEVICE) for t in (x, delta, A, B, C)]


@pytest.mark.parametrize("neg_eigval", [False, True])
def test_forward_and_gradients_equal_the_float64_reference(neg_eigval: bool) -> None:
    # 40 channels: a full block of 32 and a masked one; 5 states: a masked block of 8.
    inputs = [t.requires_grad_() for t in scan_inputs(3, length=9, channels=40, n_state=5)]
    y = triton_scan.selective_scan_triton(*inputs, neg_eigval=neg_eigval)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, inputs, dy)

    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    no_skip = torch.zeros(40, dtype=torch.float64, device=DEVICE)
    y_ref = selective_scan_reference(*ref_inputs, no_skip, neg_eigval=neg_eigval)
    ref_grads = torch.autograd.grad(y_ref, ref_inputs, dy.double())
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-5, atol=1e-5)
    for name, got, want in zip(["x", "delta", "A", "B", "C"], grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4, msg=name)


def test_a_vmapped_stack_equals_each_model_alone() -> None:
    """The vmap rule folds the stack into the kernels' groups; each model keeps its own A, and
    an input shared by the stack (in_dims None) is broadcast."""
    x, delta, A, B, C = scan_inputs(3, 2, length=6, channels=8, n_state=4)
    w = torch.randn(3, 8, 8, device=DEVICE) * 0.3

    def loss(scan, A, w, x, delta, B, C):
        h = x @ w
        return (scan(h, delta * torch.sigmoid(h), A, B, C) ** 2).mean()

    def triton_loss(*args):
        return loss(triton_scan.selective_scan_triton, *args)

    def reference_loss(*args):
        zeros = torch.zeros(8, device=DEVICE)
        return loss(lambda *s: selective_scan_reference(*s, zeros), *args)

    grads, values = vmap(grad_and_value(triton_loss, argnums=(0, 1)))(A, w, x, delta, B, C)
    shared_B = vmap(grad_and_value(triton_loss, argnums=(0, 1)), in_dims=(0, 0, 0, 0, None, 0))
    grads_shared, _ = shared_B(A, w, x, delta, B[0], C)
    for k in range(3):
        want, value = grad_and_value(reference_loss, argnums=(0, 1))(
            A[k], w[k], x[k], delta[k], B[k], C[k]
        )
        torch.testing.assert_close(values[k], value, rtol=1e-5, atol=1e-6)
        for got, ref in zip(grads, want, strict=True):
            torch.testing.assert_close(got[k], ref, rtol=1e-4, atol=1e-5)
        want_shared, _ = grad_and_value(reference_loss, argnums=(0, 1))(
            A[k], w[k], x[k], delta[k], B[0], C[k]
        )
        for got, ref in zip(grads_shared, want_shared, strict=True):
            torch.testing.assert_close(got[k], ref, rtol=1e-4, atol=1e-5)


def test_training_runs_it_only_where_a_gradient_is_wanted(monkeypatch) -> None:
    """Where the device is allowed, a step with gradients goes through the kernels, one
    without (evaluation, interventions) through the PyTorch form; on a CPU the default keeps
    them off, so the CPU's numbers do not change."""
    calls = []
    real = triton_scan.selective_scan_triton
    monkeypatch.setattr(
        triton_scan, "selective_scan_triton", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    x, delta, A, B, C = (
        t.requires_grad_() for t in scan_inputs(2, length=5, channels=4, n_state=3)
    )
    skip = torch.ones(4, device=DEVICE)
    monkeypatch.setattr(triton_path, "TRITON_DEVICES", ("cuda",))
    scan_module.selective_scan(x, delta, A, B, C, skip)
    assert calls == ([1] if DEVICE == "cuda" else [])
    monkeypatch.setattr(triton_path, "TRITON_DEVICES", ("cuda", "cpu"))
    monkeypatch.setenv("MECHEVAL_NATIVE", "0")  # on the CPU the C kernel comes first
    calls.clear()
    with torch.no_grad():
        scan_module.selective_scan(x, delta, A, B, C, skip)
    assert calls == []
    y = scan_module.selective_scan(x, delta, A, B, C, skip)
    assert calls == [1]
    no_skip = torch.zeros(4, device=DEVICE)
    want = selective_scan_reference(x, delta, A, B, C, no_skip) + x * skip
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("MECHEVAL_TRITON", "0")
    calls.clear()
    scan_module.selective_scan(x, delta, A, B, C, skip)
    assert calls == []


@pytest.mark.slow
def test_a_mamba_stack_through_the_kernels_equals_one_by_one(
    tmp_path: Path, monkeypatch, spy
) -> None:
    """Two Mamba runs trained as one vmapped stack, the scan in the kernels, leave the run
    folders two one-by-one runs leave (float32 tolerance); the stack's scans ran as two
    groups in one launch, the single runs' as one."""
    groups = []
    real = triton_scan.scan_forward
    monkeypatch.setattr(
        triton_scan, "scan_forward", lambda *a: groups.append(a[0].shape[0]) or real(*a)
    )
    monkeypatch.setattr(triton_path, "TRITON_DEVICES", (DEVICE,))
    monkeypatch.setenv("MECHEVAL_NATIVE", "0")  # on the CPU the C kernel comes first
    data = build_datasets(resolve(config()).task)
    assert_stack_equals_one_by_one(tmp_path, data, "mamba", DEVICE, spy, steps=2, batch_size=BATCH)
    assert set(groups) == {1, 2}
