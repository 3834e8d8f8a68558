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
from collections.abc import Mapping, Sequence

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
        self.weight_decay = torch.tensor(weight_decay, dtype=torch.float64)  # [G, K]
        self.betas = betas
        self.eps = eps
        self.steps = 0
        self.exp_avg = {n: torch.zeros_like(p) for n, p in params.items()}
        self.exp_avg_sq = {n: torch.zeros_like(p) for n, p in params.items()}

    @property
    def size(self) -> int:
        return self.weight_decay.shape[1]

    @torch.no_grad()
    def step(self, params: Tensors, grads: Tensors, lr: Sequence[Sequence[float]]) -> None:
        """Update ``params`` in place; ``lr[g][k]``: group g's current LR for model k."""
        self.steps += 1
        beta1, beta2 = self.betas
        bias_correction1 = 1 - beta1**self.steps
        bias_correction2_sqrt = (1 - beta2**self.steps) ** 0.5
        # Per-model factors in float64, as torch computes its Python-float scalars, then
        # rounded once to the parameters' dtype.
        lrs = torch.tensor(lr, dtype=torch.float64)
        decays = 1 - lrs * self.weight_decay
        step_sizes = lrs / bias_correction1
        any_decay = (self.weight_decay != 0).any(dim=1).tolist()
        for name, p in params.items():
            g = self.group_of[name]
            shape = (p.shape[0],) + (1,) * (p.dim() - 1)
            grad, exp_avg, exp_avg_sq = grads[name], self.exp_avg[name], self.exp_avg_sq[name]
            if any_decay[g]:
                p.mul_(decays[g].to(p).view(shape))
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
            p.sub_(exp_avg / denom * step_sizes[g].to(p).view(shape))

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the models at ``index`` (dropping diverged ones), in that order."""
        self.weight_decay = self.weight_decay[:, index.cpu()]
        for state in (self.exp_avg, self.exp_avg_sq):
            for name in state:
                state[name] = state[name][index]


def clip_grad_norms_(grads: Tensors, max_norms: Sequence[float | None]) -> torch.Tensor:
    """Per-model ``nn.utils.clip_grad_norm_``: model k's gradients (slice k of every tensor)
    are scaled by ``min(1, max_norms[k] / (norm_k + 1e-6))``, norm_k over its own parameters
    only; ``None`` leaves a model unclipped. Returns the per-model norms before clipping."""
    norms = torch.stack(
        [torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads.values()], dim=1
    )
    total = torch.linalg.vector_norm(norms, dim=1)  # [K]
    if all(m is None for m in max_norms):
        return total
    limit = torch.tensor([math.inf if m is None else m for m in max_norms]).to(total)
    clipped = torch.tensor([m is not None for m in max_norms], device=total.device)
    coef = torch.where(clipped, (limit / (total + 1e-6)).clamp(max=1.0), 1.0)
    for g in grads.values():
        g.mul_(coef.view((g.shape[0],) + (1,) * (g.dim() - 1)))
    return total


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
