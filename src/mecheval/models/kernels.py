"""Optional fused CUDA kernels behind the reference modules (``training.kernels: fused``).

The modules' own code is the reference, and the only path on a CPU (where a training step
runs some of it as C kernels, models/native.py, whatever this field says). On CUDA, inside
:func:`fused_kernels`, two of them hand their core to the authors' kernels when installed
(``pip install 'mecheval[cuda]'``):

* Mamba's selective scan -> ``mamba_ssm``'s ``selective_scan_fn``;
* :class:`~mecheval.models.mixers.base.ShortConv` (2-4 taps) -> ``causal_conv1d_fn``.

Same function, other arithmetic order: outputs agree to float32 rounding (the parity tests in
tests/test_kernels.py run where CUDA and the packages are present). A call falls back to the
reference when the kernel cannot take it (CPU tensors, a package missing, an unsupported
width) and under ``torch.func`` transforms (a vmapped stack of runs, see
``mecheval.training.stacking.group``), for which these kernels have no batching rule.

Only the training forward runs inside :func:`fused_kernels`; evaluation and interventions
use the reference, so every reported metric comes from the same code on every device.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch

from mecheval.errors import ConfigError

_ENABLED: ContextVar[bool] = ContextVar("mecheval_fused_kernels", default=False)

#: Widths causal-conv1d implements.
CAUSAL_CONV_WIDTHS = (2, 3, 4)

PACKAGES = {"selective_scan": "mamba_ssm", "causal_conv1d": "causal_conv1d"}


def available() -> dict[str, bool]:
    """Which fused kernels are installed, by kernel name (nothing is imported)."""
    return {name: importlib.util.find_spec(pkg) is not None for name, pkg in PACKAGES.items()}


def require_fused(device: torch.device) -> None:
    """Raise ConfigError unless ``training.kernels: fused`` can do anything on ``device``."""
    if device.type != "cuda":
        raise ConfigError(f"training.kernels: fused needs a CUDA device, got {device}")
    if not any(available().values()):
        raise ConfigError(
            "training.kernels: fused needs mamba-ssm or causal-conv1d "
            "(pip install 'mecheval[cuda]')"
        )


@contextlib.contextmanager
def fused_kernels(enabled: bool = True) -> Iterator[None]:
    """Within: CUDA calls of the modules above use the fused kernels where they can."""
    token = _ENABLED.set(enabled)
    try:
        yield
    finally:
        _ENABLED.reset(token)


def _on_device(x: torch.Tensor) -> bool:
    return x.is_cuda


def _usable(x: torch.Tensor) -> bool:
    return (
        _ENABLED.get()
        and _on_device(x)
        and not torch._C._functorch.is_functorch_wrapped_tensor(x)  # no vmap/grad rule
    )


def _load_selective_scan() -> Callable | None:
    if not available()["selective_scan"]:
        return None
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn

    return selective_scan_fn


def _load_causal_conv1d() -> Callable | None:
    if not available()["causal_conv1d"]:
        return None
    from causal_conv1d import causal_conv1d_fn

    return causal_conv1d_fn


# Resolved on first use; tests replace them to check the layout adapters on a CPU.
_selective_scan_impl: Callable | None = None
_causal_conv1d_impl: Callable | None = None


def selective_scan(
    x: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
) -> torch.Tensor | None:
    """Mamba's scan in this project's layout (x, delta [batch, T, d_inner], delta already
    softplus-ed; A [d_inner, N]; B, C [batch, T, N]; D [d_inner]) -> y [batch, T, d_inner],
    or None where the fused kernel does not apply."""
    global _selective_scan_impl
    if not _usable(x):
        return None
    if _selective_scan_impl is None:
        _selective_scan_impl = _load_selective_scan()
        if _selective_scan_impl is None:
            return None
    # The kernel's layout is channels-first: u, delta [batch, d_inner, T]; B, C [batch, N, T].
    y = _selective_scan_impl(
        x.transpose(1, 2),
        delta.transpose(1, 2),
        A,
        B.transpose(1, 2),
        C.transpose(1, 2),
        D,
    )
    return y.transpose(1, 2)


def causal_conv1d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor | None:
    """ShortConv's causal depthwise convolution (x [batch, T, C]; weight [C, 1, k], tap j
    multiplying x[t - (k - 1) + j]) -> [batch, T, C], or None where the kernel does not apply."""
    global _causal_conv1d_impl
    if not _usable(x) or weight.shape[-1] not in CAUSAL_CONV_WIDTHS:
        return None
    if _causal_conv1d_impl is None:
        _causal_conv1d_impl = _load_causal_conv1d()
        if _causal_conv1d_impl is None:
            return None
    # [batch, C, T] as a view of the channels-last tensor: the kernel reads that layout as is.
    y = _causal_conv1d_impl(x.transpose(1, 2), weight[:, 0], bias, activation=None)
    return y.transpose(1, 2)
