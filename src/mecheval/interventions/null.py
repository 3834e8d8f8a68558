"""A null to beat: the same restore at positions that play no role.

A role's restore recovers some fraction of what the key's corruption removed; how much would
any position's restore recover? Each document gets ``draws`` positions drawn uniformly from
those before its query that hold no role of the task (in AR: the other pairs' keys and values,
the BOS), matched to the same documents and the same site. Their restores, measured by the
same engine, are the cell's floor: the *null*. Its upper bound is the highest upper end of
the draws' bootstrap intervals (interventions/intervals.py), and a role's fraction counts
towards a label only above it (interventions/labels.py).

Null positions are roles named ``null 1`` .. ``null N``; the draws come from their own seeded
generator, so the null is the same on every run of the same documents.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pandas as pd
import torch

from mecheval.interventions.engine import CleanRuns, interchange
from mecheval.interventions.intervals import BOOTSTRAP, Bootstrap, restore_intervals
from mecheval.interventions.result import InterchangeResult
from mecheval.models.backbone import LanguageModel
from mecheval.tasks.batch import Batch

#: Null draws per document, and the seed of their positions.
NULL_DRAWS = 5
NULL_SEED = 0x4E0


def null_role(i: int) -> str:
    return f"null {i + 1}"


def is_null_role(role: str) -> bool:
    return role.startswith("null ")


def free_positions(batch: Batch) -> torch.Tensor:
    """[B, T] bool: the positions before each document's query that hold none of its roles."""
    size, length = batch.tokens.shape
    query = batch.roles["query"].cpu()
    free = torch.arange(length)[None, :] < query[:, None]
    rows = torch.arange(size)
    for positions in batch.roles.values():
        free[rows, positions.cpu()] = False
    return free


def null_positions(batch: Batch, draws: int = NULL_DRAWS, seed: int = NULL_SEED) -> torch.Tensor:
    """[draws, B] positions: for each document, ``draws`` positions before its query (with
    replacement) where none of its roles is."""
    free = free_positions(batch)
    empty = ~free.any(dim=1)
    if empty.any():
        raise ValueError(
            f"null: document {int(empty.nonzero()[0])} has no position before its query "
            "that plays no role"
        )
    generator = torch.Generator().manual_seed(seed)
    return torch.multinomial(free.float(), draws, replacement=True, generator=generator).T


def with_null_roles(
    original: Batch, corrupted: Batch, draws: int = NULL_DRAWS, seed: int = NULL_SEED
) -> tuple[Batch, Batch, list[str]]:
    """Both batches with the null positions as roles (the same in each: corruption moves no
    position), and those roles' names."""
    positions = null_positions(original, draws, seed).to(original.tokens.device)
    names = [null_role(i) for i in range(draws)]
    extra = dict(zip(names, positions, strict=True))
    return (
        replace(original, roles={**original.roles, **extra}),
        replace(corrupted, roles={**corrupted.roles, **extra}),
        names,
    )


def measure_null(
    model: LanguageModel,
    original: Batch,
    corrupted: Batch,
    sites: Sequence[str],
    draws: int = NULL_DRAWS,
    seed: int = NULL_SEED,
    runs: CleanRuns | None = None,
) -> InterchangeResult | None:
    """The null roles' restores at ``sites``, by the engine every role is measured with
    (from ``runs``, the pair's clean runs where the roles' restores made them); None where a
    document has no position that plays no role (nothing to draw from)."""
    if not sites or not free_positions(original).any(dim=1).all():
        return None
    original, corrupted, names = with_null_roles(original, corrupted, draws, seed)
    return interchange(model, original, corrupted, sites=sites, roles=names, runs=runs)


@dataclass(frozen=True)
class Null:
    """The null at one site: the mean restored likelihood and recovered fraction of its
    draws, and the highest upper end of the draws' fraction intervals (the bar to beat)."""

    likelihood: float
    recovered: float
    high: float


def null_at_sites(per_example: pd.DataFrame, bootstrap: Bootstrap = BOOTSTRAP) -> dict[str, Null]:
    """Per site, the :class:`Null` of the per-document table of the null roles' restores."""
    nulls = per_example[per_example.role.map(is_null_role)]
    if nulls.empty:
        return {}
    bounds = restore_intervals(nulls, bootstrap)
    return {
        str(site): Null(
            likelihood=float(draws.restored.mean()),
            recovered=float(draws.recovered.mean()),
            high=float(draws.recovered_high.max()),
        )
        for site, draws in bounds.groupby("site", sort=False)
    }
