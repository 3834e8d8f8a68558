"""The arithmetic of K same-shaped models trained as one: parameters stacked along a leading
dimension, updated by one set of kernels.

Pure tensor maths, no run folders, configs or files (group.py drives it): a functional view
of a module so that the single-run loss functions run under ``torch.func.vmap``, padding K
token batches to one stack, per-model gradient clipping and AdamW with per-model
hyper-parameters, each equal to torch's single-model version applied to every model alone
(tests/test_training_group.py checks them against torch).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn
from torch.func import functional_call

Tensors = dict[str, torch.Tensor]


class StackedAdamW:
    """``torch.optim.AdamW`` for K models whose parameters are stacked along dim 0.

    The arithmetic is torch's non-capturable single-tensor AdamW (decoupled decay
    ``p *= 1 - lr * wd``, ``lerp`` first moment, bias corrections from the step count), with
    the learning rate and weight decay given per (param group, model), so one set of kernels
    updates every model with its own hyper-parameters. All models step together, so one step
    count serves all of them.

    ``groups``: the parameter names of each param group (as ``make_optimizer`` splits them);
    ``weight_decay[g][k]``: group g's decay for model k.
    """

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        groups: Sequence[Sequence[str]],
        weight_decay: Sequence[Sequence[float]],
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self.group_of = {name: g for g, names in enumerate(groups) for name in names}
        if set(self.group_of) != set(params):
            raise ValueError("StackedAdamW: groups must name every parameter exactly once")
        device = next(iter(params.values())).device
        self.weight_decay = torch.tensor(weight_decay, dtype=torch.float64).to(device)  # [G, K]
        # Groups without decay skip the multiply (once per change of the stack, not per step).
        self.any_decay = (self.weight_decay != 0).any(dim=1).tolist()
        self.betas = betas
        self.eps = eps
        self.steps = 0
        self.exp_avg = {n: torch.zeros_like(p) for n, p in params.items()}
        self.exp_avg_sq = {n: torch.zeros_like(p) for n, p in params.items()}

    @property
    def size(self) -> int:
        return self.weight_decay.shape[1]

    @torch.no_grad()
    def step(
        self,
        params: Tensors,
        grads: Tensors,
        lr: torch.Tensor,
        bias_correction1: torch.Tensor,
        bias_correction2_sqrt: torch.Tensor,
    ) -> None:
        """Update ``params`` in place. ``lr[g, k]``: group g's current LR for model k, and the
        step's two bias corrections, all float64 tensors on the parameters' device (see
        :class:`StepTables`): no number comes from the host, so the step launches kernels
        only and can be captured as a CUDA graph. The caller counts the step in
        :attr:`steps` (a captured step replays without running Python)."""
        beta1, beta2 = self.betas
        # Per-model factors in float64, as torch computes its Python-float scalars, then
        # rounded once to the parameters' dtype.
        decays = 1 - lr * self.weight_decay
        step_sizes = lr / bias_correction1
        for name, p in params.items():
            g = self.group_of[name]
            shape = (p.shape[0],) + (1,) * (p.dim() - 1)
            grad, exp_avg, exp_avg_sq = grads[name], self.exp_avg[name], self.exp_avg_sq[name]
            if self.any_decay[g]:
                p.mul_(decays[g].to(p).view(shape))
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
            p.sub_(exp_avg / denom * step_sizes[g].to(p).view(shape))

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the models at ``index`` (dropping diverged ones), in that order."""
        self.weight_decay = self.weight_decay[:, index]
        self.any_decay = (self.weight_decay != 0).any(dim=1).tolist()
        for state in (self.exp_avg, self.exp_avg_sq):
            for name in state:
                state[name] = state[name][index]


class StepTables:
    """Every per-step number of :class:`StackedAdamW`, computed once on the host as Python
    floats (exactly as ``LambdaLR`` and torch's AdamW compute them) and kept on the device,
    where a step reads them at a device step counter: ``lr_factor[s]`` (the schedule's factor
    of optimizer step s, 0-based) and both bias corrections of step s + 1."""

    def __init__(
        self,
        lr_factor: Callable[[int], float],
        total: int,
        betas: tuple[float, float],
        device: torch.device,
    ) -> None:
        beta1, beta2 = betas
        steps = range(total + 1)

        def table(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float64).to(device)

        self.lr_factor = table([lr_factor(s) for s in steps])
        self.bias_correction1 = table([1 - beta1 ** (s + 1) for s in steps])
        self.bias_correction2_sqrt = table([(1 - beta2 ** (s + 1)) ** 0.5 for s in steps])

    def at(self, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The factors of optimizer step ``step`` (a one-element long tensor on the device)."""
        return (
            self.lr_factor.index_select(0, step)[0],
            self.bias_correction1.index_select(0, step)[0],
            self.bias_correction2_sqrt.index_select(0, step)[0],
        )


class GradClip:
    """Per-model ``nn.utils.clip_grad_norm_`` (see :func:`clip_grad_norms_`) with the limits
    kept on the device, so that clipping a step sends nothing from the host."""

    def __init__(self, max_norms: Sequence[float | None], device: torch.device) -> None:
        self.active = any(m is not None for m in max_norms)
        limits = [math.inf if m is None else m for m in max_norms]
        self.limit = torch.tensor(limits).to(device)
        self.clipped = torch.tensor([m is not None for m in max_norms]).to(device)

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the models at ``index``, in that order."""
        self.limit, self.clipped = self.limit[index], self.clipped[index]

    def __call__(self, grads: Tensors) -> torch.Tensor:
        """Clip ``grads`` in place; return the per-model norms before clipping."""
        norms = torch.stack(
            [torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads.values()], dim=1
        )
        total = torch.linalg.vector_norm(norms, dim=1)  # [K]
        if not self.active:
            return total
        limit = self.limit.to(total)
        coef = torch.where(self.clipped, (limit / (total + 1e-6)).clamp(max=1.0), 1.0)
        for g in grads.values():
            g.mul_(coef.view((g.shape[0],) + (1,) * (g.dim() - 1)))
        return total


def clip_grad_norms_(grads: Tensors, max_norms: Sequence[float | None]) -> torch.Tensor:
    """Per-model ``nn.utils.clip_grad_norm_``: model k's gradients (slice k of every tensor)
    are scaled by ``min(1, max_norms[k] / (norm_k + 1e-6))``, norm_k over its own parameters
    only; ``None`` leaves a model unclipped. Returns the per-model norms before clipping."""
    device = next(iter(grads.values())).device
    return GradClip(max_norms, device)(grads)


class Functional:
    """A module called with parameters and buffers given per call, so that the single-run loss
    functions (``answer_loss``, ``multi_answer_loss``) run unchanged under vmap."""

    def __init__(self, module: nn.Module, params: Tensors, buffers: Tensors) -> None:
        self.module, self.params, self.buffers = module, params, buffers

    def __call__(self, tokens: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
        kwargs = {} if at is None else {"at": at}
        return functional_call(self.module, (self.params, self.buffers), (tokens,), kwargs)


def pad_stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stack [B, T_k] token batches, right-padding with the pad id 0 to the longest: the loss
    is read at each document's query, which (causal models) never sees the padding."""
    width = max(t.shape[1] for t in tensors)
    return torch.stack([nn.functional.pad(t, (0, width - t.shape[1])) for t in tensors])
