"""What both interchange engines share, the batched one (interventions/engine.py) and the
naive reference (interventions/reference.py): the checks of their inputs, the scores they
report per condition, site and role, and the result they return (its tables: engine.py's
module doc)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from mecheval.models.backbone import LanguageModel
from mecheval.models.sites import site_names
from mecheval.tasks.batch import ROLES, Batch
from mecheval.tasks.scores import answer_scores, available_scores

#: The scores (tasks/scores.py) reported per condition, site and role; likelihood first (the
#: per-example table and the mechanism labels read it). Every condition is scored against
#: the original documents' answer candidates (``Batch.with_tokens`` keeps them).
RESTORE_METRICS = ("likelihood", "accuracy", "in_context_mass", "in_context_accuracy")
#: The columns of ``InterchangeResult.table`` and ``InterchangeResult.per_example``.
TABLE_COLUMNS = ["condition", "site", "role", "metric", "value"]
PER_EXAMPLE_COLUMNS = ["doc", "site", "role", "restored", "original", "corrupted"]


@dataclass(frozen=True)
class InterchangeResult:
    table: pd.DataFrame
    per_example: pd.DataFrame

    @property
    def attribution(self) -> pd.DataFrame:
        """Per document and site: the role whose restore gives the highest likelihood."""
        best = self.per_example.loc[self.per_example.groupby(["doc", "site"])["restored"].idxmax()]
        return best[["doc", "site", "role", "restored"]].reset_index(drop=True)

    def value(self, condition: str, metric: str = "likelihood", site: str = "", role: str = ""):
        rows = self.table[
            (self.table.condition == condition)
            & (self.table.metric == metric)
            & (self.table.site == site)
            & (self.table.role == role)
        ]
        if len(rows) != 1:
            raise KeyError(f"no single value for {condition}/{metric}/{site}/{role}")
        return float(rows.value.iloc[0])


def batch_roles(batch: Batch) -> list[str]:
    """Every role of ``batch``: the shared ROLES in their order, then the task's own
    (overwrite AR's stale_key, stale_value)."""
    return [*(r for r in ROLES if r in batch.roles), *(r for r in batch.roles if r not in ROLES)]


def prepare(
    model: LanguageModel,
    original: Batch,
    corrupted: Batch,
    sites: Sequence[str] | None,
    roles: Sequence[str] | None,
) -> tuple[list[str], list[str], Batch, Batch]:
    """The sites (default: every module site of ``model``) and roles (default: every role of
    ``original``) to restore, once the two batches are checked to match, and the batches on
    the model's device."""
    sites = list(sites) if sites is not None else site_names(model)
    roles = list(roles) if roles is not None else batch_roles(original)
    _check(original, corrupted, roles)
    # The documents come from the CPU datasets; everything runs where the model is.
    device = model.device
    return sites, roles, original.to(device), corrupted.to(device)


def _check(original: Batch, corrupted: Batch, roles: Sequence[str]) -> None:
    if original.tokens.shape != corrupted.tokens.shape:
        raise ValueError(
            f"corrupted: shape {tuple(corrupted.tokens.shape)} differs from the original's "
            f"{tuple(original.tokens.shape)}"
        )
    for role in roles:
        if role not in original.roles or role not in corrupted.roles:
            raise ValueError(
                f"roles: {role!r} is not a role of these batches "
                f"({', '.join(batch_roles(original))})"
            )


def batch_metrics(batch: Batch) -> list[str]:
    """The :data:`RESTORE_METRICS` a batch can be scored on (the in-context ones need its
    candidates)."""
    return available_scores(RESTORE_METRICS, batch.candidates)


def score_rows(
    logits: torch.Tensor, answer: torch.Tensor, candidates: torch.Tensor | None
) -> torch.Tensor:
    """The :func:`batch_metrics` per row, [len(metrics), N] float64."""
    metrics = available_scores(RESTORE_METRICS, candidates)
    return torch.stack(list(answer_scores(logits, answer, metrics, candidates).values()))


def baseline_rows(
    s_orig: torch.Tensor, s_corr: torch.Tensor, metrics: Sequence[str]
) -> list[tuple[str, str, str, str, float]]:
    """The table's rows of the original and the corrupted run, one per metric."""
    return [
        (condition, "", "", metric, scores[m].mean().item())
        for condition, scores in (("original", s_orig), ("corrupted", s_corr))
        for m, metric in enumerate(metrics)
    ]


@dataclass(frozen=True)
class ExampleRows:
    """The per-example rows of one (site, role): each document's restored likelihood beside
    its original and corrupted one; :func:`assemble` joins them into one frame."""

    site: str
    role: str
    restored: np.ndarray
    original: np.ndarray
    corrupted: np.ndarray


def example_rows(
    site: str, role: str, restored: torch.Tensor, s_orig: torch.Tensor, s_corr: torch.Tensor
) -> ExampleRows:
    """The rows of one (site, role): ``restored`` [N] beside row 0 of the scores."""
    numpy = (t.cpu().numpy() for t in (restored, s_orig[0], s_corr[0]))
    return ExampleRows(site, role, *numpy)


def assemble(rows: list, per_example: list[ExampleRows]) -> InterchangeResult:
    """The result of the table's ``rows`` and the per-example rows, as one frame each."""
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    if not per_example:
        return InterchangeResult(table, pd.DataFrame(columns=PER_EXAMPLE_COLUMNS))
    sizes = [len(part.restored) for part in per_example]
    columns = {
        "doc": np.concatenate([np.arange(size) for size in sizes]),
        "site": np.repeat([part.site for part in per_example], sizes),
        "role": np.repeat([part.role for part in per_example], sizes),
    }
    for name in ("restored", "original", "corrupted"):
        columns[name] = np.concatenate([getattr(part, name) for part in per_example])
    examples = pd.DataFrame(columns)
    return InterchangeResult(table, examples)
