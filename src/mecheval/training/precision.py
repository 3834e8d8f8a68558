"""Reduced-precision training arithmetic (``training.precision``), scoped to the training step.

* ``fp32``: plain float32 everywhere (the reference; what every earlier result used).
* ``tf32``: float32 tensors, but CUDA matrix products and cuDNN convolutions round their inputs
  to TensorFloat-32 (10-bit mantissa, float32 accumulation). A no-op on other devices: the
  CPU stays the float32 reference (oneDNN's reduced-precision matmul modes are left off).
* ``bf16``: the training forward and loss run under ``torch.autocast(dtype=bfloat16)``; weights,
  gradients and AdamW state stay float32 (autocast casts per op), so this is mixed precision,
  not a bfloat16 model.
* ``bf16-model``: a bfloat16 model as the paper's later code trains one (tinylang casts the whole
  model with ``.to(dtype=torch.bfloat16)`` before its AdamW), emulated on float32 tensors: the
  forward under bf16 autocast as ``bf16``, and every number such a model stores rounded to
  bfloat16 (:func:`round_to_bf16`): the initial weights and buffers, each step's gradients, and
  after each update the weights and both AdamW moments. An update smaller than half a bfloat16
  step of its weight is lost, as in the bfloat16 model; what the emulation does not copy is
  the bfloat16 rounding inside element-wise operations (autocast runs them in float32).

All of them cover the training step only: evaluation (and every intervention) runs outside
them, in float32 (on ``bf16-model``'s bfloat16-valued weights), so a run's metrics stay
comparable with an fp32 run's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the config's vocabulary; this module stays free of the config's imports
    from mecheval.training.config import Precision


#: The precisions whose training forward runs under bf16 autocast.
BF16_AUTOCAST = ("bf16", "bf16-model")


def autocast(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager:
    """The context the training forward and loss run in: bf16 autocast, or nothing."""
    if precision not in BF16_AUTOCAST:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def rounding_eps(precision: Precision, device: torch.device) -> float | None:
    """The relative rounding of the training step's products under ``precision`` on
    ``device``: bf16's or TF32's machine epsilon, None where it is float32's."""
    if precision in BF16_AUTOCAST:
        return torch.finfo(torch.bfloat16).eps
    if precision == "tf32" and device.type == "cuda":
        return 2.0**-10  # TF32 keeps 10 mantissa bits
    return None


def stores_bf16(precision: Precision) -> bool:
    """Whether ``precision`` keeps weights, gradients and moments at bfloat16 values."""
    return precision == "bf16-model"


@torch.no_grad()
def round_to_bf16(tensors: Iterable[torch.Tensor | None]) -> None:
    """Round each floating-point tensor of ``tensors`` (None skipped) in place to the nearest
    bfloat16 value (round to nearest even, as ``.to(torch.bfloat16)`` rounds), keeping its
    dtype: what storing it in a bfloat16 model would keep of it."""
    for tensor in tensors:
        if tensor is not None and tensor.is_floating_point():
            tensor.copy_(tensor.to(torch.bfloat16))


def optimizer_moments(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """The AdamW moments (``exp_avg``, ``exp_avg_sq``) of every parameter that has them."""
    for state in optimizer.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                yield state[key]


@contextlib.contextmanager
def tf32(precision: Precision, device: torch.device) -> Iterator[None]:
    """While inside, CUDA matmuls and cuDNN convolutions may use TF32 if ``precision`` is
    ``tf32`` and ``device`` is CUDA; the previous settings are restored on exit (also on an
    error), so nothing leaks to evaluation or to the caller."""
    if precision != "tf32" or device.type != "cuda":
        yield
        return
    # The per-backend ``fp32_precision`` API, not ``allow_tf32`` or
    # ``set_float32_matmul_precision``: torch 2.13 reads these back exactly as they were set
    # (the legacy setters turn an unset "none" into "ieee" on the way back), and
    # ``set_float32_matmul_precision("high")`` would also switch the CPU's oneDNN matmuls.
    # Inside the scope torch's legacy getters (``allow_tf32``) may raise "mix of the legacy and
    # new APIs"; torch's compiler reads the new ones, and no callback runs in here.
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    saved = (matmul.fp32_precision, conv.fp32_precision)
    matmul.fp32_precision = "tf32"
    conv.fp32_precision = "tf32"
    try:
        yield
    finally:
        matmul.fp32_precision, conv.fp32_precision = saved
