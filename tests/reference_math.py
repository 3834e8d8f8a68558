"""What the float64 reference tests of the mixers share (imported by test modules: pytest puts
this folder on sys.path): seeded generators, the activations written out from their
definitions (so a reference does not lean on the torch functions the modules call), and the
check that a fast form is the same function as its reference, outputs and gradients."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-x))


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * sigmoid(x)


def softplus(x: torch.Tensor) -> torch.Tensor:
    return torch.log1p(torch.exp(x))


def assert_same_function(
    fast: torch.Tensor,
    ref: torch.Tensor,
    inputs: Sequence[torch.Tensor],
    names: Sequence[str],
    seed: int,
    **tol: float,
) -> None:
    """``fast`` equals ``ref`` (both computed from ``inputs``), and so does every input's
    gradient along one random cotangent (drawn from ``seed``)."""
    torch.testing.assert_close(fast, ref, **tol)
    w = torch.randn(ref.shape, generator=gen(seed), dtype=ref.dtype)
    g_fast = torch.autograd.grad((fast * w).sum(), inputs, materialize_grads=True)
    g_ref = torch.autograd.grad((ref * w).sum(), inputs, materialize_grads=True)
    for name, a, b in zip(names, g_fast, g_ref, strict=True):
        torch.testing.assert_close(a, b, **tol, msg=name)
