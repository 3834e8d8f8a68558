"""What a stack of runs reads and writes on the device at each step, so that its step sends
nothing from the host and reads nothing back: every member's batch gathered from the train
set held on the device (:class:`StackedBatches`), and every member's training loss watched
there for divergence and summed for the metrics (:class:`LossWatch`), read by the host only
when it asks (every few steps, at each evaluation).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mecheval.tasks.batch import ANSWER_POSITIONS, ANSWERS
from mecheval.tasks.dataset import TaskDataset
from mecheval.training.trainer import Diverged, divergence, epoch_order

#: Off a CPU, the host reads the stack's losses (for divergence and progress) every this many
#: steps, not at every step: a read waits for the device to finish all it was given. A
#: member that diverges is still recorded at the step it diverged.
CHECK_EVERY = 100


def check_interval(device: torch.device) -> int:
    """Every how many steps the host reads the stack's losses (on a CPU reading costs
    nothing, so progress shows every step)."""
    return 1 if device.type == "cpu" else CHECK_EVERY


class StackedBatches:
    """Member k's batch of every step, as ``Trainer.batch_at`` draws it (its own seed's
    order of each epoch, ``batch_size`` documents at a time, the last partial batch
    dropped), gathered for all members by one indexing of train tensors kept on the device.

    The orders of an epoch go to the device once, as a [K, per_epoch, B] index; a step copies
    its [K, B] slice into :attr:`index` (a fixed tensor a captured graph reads) and
    :meth:`inputs` gathers from it. Tokens are cut to the stack's longest document, as
    ``TaskDataset.batch`` and ``pad_stack`` cut them (the host knows each step's width from the
    epoch's order without asking the device).
    """

    def __init__(
        self,
        train_set: TaskDataset,
        seeds: Sequence[int],
        batch_size: int,
        device: torch.device,
    ) -> None:
        self.size = len(train_set)
        self.batch_size = batch_size
        self.per_epoch = self.size // batch_size
        self.seeds = list(seeds)
        self.dense = ANSWER_POSITIONS in train_set.extras
        self.lengths = train_set.lengths
        self.tokens = train_set.tokens.to(device)
        self.query = train_set.roles["query"].to(device)
        self.answer = train_set.answer.to(device)
        if self.dense:
            self.answer_positions = train_set.extras[ANSWER_POSITIONS].to(device)
            self.answers = train_set.extras[ANSWERS].to(device)
        self.index = torch.zeros(len(self.seeds), batch_size, dtype=torch.long, device=device)
        self._epoch: int | None = None
        self._orders = self.index[:, None]
        self._widths: list[int] = []

    @property
    def fixed_width(self) -> bool:
        """Whether every document has one length (then every step has one shape)."""
        return bool((self.lengths == self.lengths[0]).all())

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the members at ``index`` (in that order)."""
        self.seeds = [self.seeds[j] for j in index.tolist()]
        self.index = self.index[index].contiguous()
        self._epoch = None

    def load(self, step: int) -> int:
        """Point :attr:`index` at step ``step``'s documents; return the step's token width."""
        epoch, position = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            used = self.per_epoch * self.batch_size
            orders = torch.stack([epoch_order(self.size, s, epoch)[:used] for s in self.seeds])
            orders = orders.view(len(self.seeds), self.per_epoch, self.batch_size)
            self._widths = self.lengths[orders].amax(dim=(0, 2)).tolist()
            self._orders = orders.to(self.index.device)
            self._epoch = epoch
        self.index.copy_(self._orders[:, position])
        return int(self._widths[position])

    def inputs(self, width: int) -> tuple[torch.Tensor, ...]:
        """The stacked loss inputs at :attr:`index`: tokens [K, B, width] and the query and
        answer [K, B] (MQAR: every answer's position and token, [K, B, Q])."""
        tokens = self.tokens[self.index][..., :width]
        if self.dense:
            return tokens, self.answer_positions[self.index], self.answers[self.index]
        return tokens, self.query[self.index], self.answer[self.index]


class LossWatch:
    """Every member's training loss, watched on the device: the first optimizer step whose
    loss diverges (non-finite, or above the member's ceiling, as
    :func:`~mecheval.training.trainer.divergence` decides) with its value, and the float64
    sum and count of the losses before it (a diverged member's later losses count nowhere).
    """

    def __init__(self, ceilings: Sequence[float], device: torch.device) -> None:
        k = len(ceilings)
        self.ceiling = torch.tensor(ceilings, dtype=torch.float64).to(device)
        self.first_bad = torch.full((k,), -1, dtype=torch.long, device=device)
        self.bad_value = torch.zeros(k, device=device)
        self.sum = torch.zeros(k, dtype=torch.float64, device=device)
        self.count = torch.zeros(k, dtype=torch.long, device=device)
        self.last = torch.zeros(k, device=device)

    def add(self, losses: torch.Tensor, step: torch.Tensor) -> None:
        """Watch the losses of optimizer step ``step`` (0-based, a one-element tensor)."""
        losses = losses.detach().float()
        value = losses.double()
        bad = ~torch.isfinite(value) | (value > self.ceiling)
        new = bad & (self.first_bad < 0)
        self.first_bad.copy_(torch.where(new, step, self.first_bad))
        self.bad_value.copy_(torch.where(new, losses, self.bad_value))
        alive = self.first_bad < 0
        self.sum.add_(torch.where(alive, value, 0.0))
        self.count.add_(alive.long())
        self.last.copy_(losses)

    def diverged(self) -> list[tuple[int, Diverged]]:
        """(slot, why) of every member whose loss diverged, as the single-run code words it."""
        first, values = self.first_bad.tolist(), self.bad_value.tolist()
        out = []
        for j, (step, value) in enumerate(zip(first, values, strict=True)):
            if step >= 0:
                stop = divergence(value, step + 1, float(self.ceiling[j]))
                assert stop is not None
                out.append((j, stop))
        return out

    def sums(self) -> list[tuple[float, int]]:
        """Each member's (loss sum, count) since the last :meth:`reset_sums`."""
        return list(zip(self.sum.tolist(), self.count.tolist(), strict=True))

    def start_from(self, sums: Sequence[tuple[float, int]]) -> None:
        """Each member's (loss sum, count) so far (a resumed member's, from its checkpoint)."""
        self.sum.copy_(torch.tensor([total for total, _ in sums], dtype=torch.float64))
        self.count.copy_(torch.tensor([count for _, count in sums], dtype=torch.long))

    def reset_sums(self) -> None:
        self.sum.zero_()
        self.count.zero_()

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the members at ``index`` (in that order)."""
        for name in ("ceiling", "first_bad", "bad_value", "sum", "count", "last"):
            setattr(self, name, getattr(self, name)[index].contiguous())
