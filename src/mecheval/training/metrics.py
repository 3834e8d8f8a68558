"""Behavioural metrics (paper §4.2): likelihood of the answer, accuracy, and loss, plus the
binding scores.

Given the predicted distribution ŷ at the query and the true answer i: likelihood ŷ_i,
accuracy 1[argmax ŷ = i], loss -log ŷ_i, in-context mass Σ_{c in C} ŷ_c and in-context
accuracy 1[argmax ŷ ∈ C] over the answer candidates C present in the document (batches
without candidates leave those two out), each averaged over a split (tasks/scores.py). Also the tidy
``metrics.csv`` (step, split, metric, value) a run writes as it trains.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from mecheval.io import atomic_write_csv
from mecheval.models.backbone import model_device
from mecheval.tasks import Batch, TaskDataset
from mecheval.tasks.batch import ANSWER_POSITIONS, ANSWERS
from mecheval.tasks.scores import answer_scores

CSV_HEADER = ("step", "split", "metric", "value")


def answer_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Next-token cross-entropy on the answer only (on every answer, for a batch that carries
    ``extras["answer_positions"]`` and ``extras["answers"]``: :func:`multi_answer_loss`).

    Only the query position's logits are computed: the loss on every other position is masked
    in the paper, so skipping them gives the same loss and gradient for far less work.
    """
    if ANSWER_POSITIONS in batch.extras:
        return multi_answer_loss(
            model, batch.tokens, batch.extras[ANSWER_POSITIONS], batch.extras[ANSWERS]
        )
    logits = model(batch.tokens, at=batch.query)
    return F.cross_entropy(logits.float(), batch.answer)


def multi_answer_loss(
    model: nn.Module, tokens: torch.Tensor, positions: torch.Tensor, answers: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy over several query positions per document.

    ``positions`` [Q] (shared by all documents) or [B, Q] (each document's own), ``answers``
    [B, Q]; every other position is masked as in :func:`answer_loss`, which this equals when
    Q = 1.
    """
    logits = model(tokens)
    if positions.dim() == 1:
        picked = logits[:, positions]  # [B, Q, V]
    else:
        picked = logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))
    return F.cross_entropy(picked.flatten(0, 1).float(), answers.flatten())


@torch.no_grad()
def batch_scores(model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
    """Per-document scores (tasks/scores.py's SCORES), each [B] float64."""
    return answer_scores(
        model(batch.tokens, at=batch.query), batch.answer, candidates=batch.candidates
    )


def eval_batches(dataset: TaskDataset, batch_size: int, device: torch.device | str) -> list[Batch]:
    """``dataset`` in order, as batches of ``batch_size`` on ``device``: what
    :func:`evaluate_batches` reads; a run makes them once and evaluates on them repeatedly."""
    return [batch.to(device) for batch in dataset.iter_batches(batch_size, shuffle=False)]


def evaluate_batches(model: nn.Module, batches: Iterable[Batch]) -> dict[str, float]:
    """Mean likelihood of the answer, accuracy and loss of ``model`` over ``batches``."""
    was_training = model.training
    model.eval()
    totals: dict[str, float] = {}
    count = 0
    try:
        for batch in batches:
            for name, values in batch_scores(model, batch).items():
                totals[name] = totals.get(name, 0.0) + values.sum().item()
            count += len(batch)
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("evaluate: empty dataset")
    return {name: total / count for name, total in totals.items()}


def evaluate(
    model: nn.Module,
    dataset: TaskDataset,
    batch_size: int,
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """Mean likelihood of the answer, accuracy and loss of ``model`` over ``dataset``."""
    if device is None:
        device = model_device(model)
    batches = (b.to(device) for b in dataset.iter_batches(batch_size, shuffle=False))
    return evaluate_batches(model, batches)


@dataclass(frozen=True)
class Row:
    step: int
    split: str
    metric: str
    value: float


class MetricsLog:
    """The rows of ``metrics.csv``, rewritten whole (atomically) on each flush.

    At these sizes (a few thousand rows) a rewrite is cheap, and it keeps the file complete
    at every moment and easy to truncate on resume.
    """

    def __init__(self, path: Path, rows: list[Row] | None = None) -> None:
        self.path = path
        self.rows: list[Row] = list(rows or [])

    @classmethod
    def read(cls, path: Path) -> MetricsLog:
        return cls(path, read_rows(path) if path.exists() else [])

    def add(self, step: int, split: str, values: dict[str, float]) -> None:
        for metric, value in values.items():
            self.rows.append(Row(step, split, metric, float(value)))

    def truncate(self, last_step: int) -> None:
        """Drop rows after ``last_step`` (written after the checkpoint a run resumes from)."""
        self.rows = [row for row in self.rows if row.step <= last_step]

    def flush(self) -> None:
        atomic_write_csv(
            self.path, CSV_HEADER, ((r.step, r.split, r.metric, r.value) for r in self.rows)
        )


def read_rows(path: Path) -> list[Row]:
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        return [Row(int(r["step"]), r["split"], r["metric"], float(r["value"])) for r in reader]
