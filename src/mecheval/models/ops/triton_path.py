"""When a training step runs a recurrence's Triton kernels (the ``*_triton.py`` files beside
their references), the switch every recurrence's dispatch asks; and what those kernel files
share: the vmap folding of a stack of runs and the backward Functions' base."""

from __future__ import annotations

import importlib.util
import os

import torch

#: Devices whose training steps run the Triton kernels (the tests add "cpu", where Triton's
#: interpreter runs them).
TRITON_DEVICES = ("cuda",)

#: The kernels a CUDA training step runs unless ``MECHEVAL_TRITON=0``: those that made it
#: faster on a card (docs/performance.md). The others run only with ``MECHEVAL_TRITON=all``:
#: ``delta_rule`` (DeltaNet and Gated DeltaNet, models/ops/delta_rule_triton.py), right on an
#: H200 but no faster there than the chunked PyTorch form in a replayed stack.
ON_BY_DEFAULT = ("selective_scan",)


def triton_for_training(kernel: str, *tensors: torch.Tensor) -> bool:
    """Whether a training step runs ``kernel`` (a recurrence) as Triton kernels: float32 tensors
    on a device of :data:`TRITON_DEVICES`, one of them needing a gradient, Triton installed,
    the kernel switched on (``MECHEVAL_TRITON``: unset for :data:`ON_BY_DEFAULT`, ``all`` for
    every kernel, ``0`` for none), outside torch.compile. Evaluation and interventions (no
    gradient) run the PyTorch forms, as on the CPU."""
    first = tensors[0]
    switch = os.environ.get("MECHEVAL_TRITON", "1")
    return (
        (switch == "all" or (switch != "0" and kernel in ON_BY_DEFAULT))
        and first.device.type in TRITON_DEVICES
        and all(t.dtype == torch.float32 and t.device == first.device for t in tensors)
        and torch.is_grad_enabled()
        and any(t.requires_grad for t in tensors)
        and not torch.compiler.is_compiling()
        and importlib.util.find_spec("triton") is not None
    )


def fold(batch_size: int, tensor: torch.Tensor, dim: int | None) -> torch.Tensor:
    """A vmapped tensor (physical, ``dim`` its vmapped dimension, None: not vmapped) with that
    dimension merged into its leading one: how a kernel's vmap rule hands a stack of runs to
    a kernel that takes a leading batch or group dimension."""
    tensor = tensor.movedim(dim, 0) if dim is not None else tensor.expand(batch_size, *tensor.shape)
    return tensor.flatten(0, 1)


def unfold(batch_size: int, tensor: torch.Tensor) -> torch.Tensor:
    """:func:`fold`'s inverse on a kernel's output: the vmapped dimension first again."""
    return tensor.unflatten(0, (batch_size, -1))


class KernelGradient(torch.autograd.Function):
    """The base of a backward kernel's autograd.Function: called from a forward Function's
    backward so that torch.func can vmap it (the subclass gives ``forward`` and ``vmap``), and
    not differentiated again."""

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # type: ignore[override]
        pass

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        raise RuntimeError("the Triton kernels have no second derivative")
