"""Grading an estimated interchange table (interventions/attribution.py) against the exact
one on the same documents.

Over every (site, role) cell's restored likelihood (the mean over documents):

- ``pearson`` and ``spearman``: the correlation of estimate and exact value;
- ``recall``: of the ``k`` cells that exact interchange says matter (they recover at least
  ``min_fraction``, the label's threshold, of what the corruption removed), the fraction
  that are among the estimate's ``k`` highest; NaN where no cell matters;
- ``error``: the mean absolute difference, in likelihood;
- the two mechanism labels, read the same way from each table (the caller's), and whether
  they agree;
- ``effect``: what the corruption moves, the mean original minus corrupted likelihood over
  the documents, with its 95 % bootstrap interval (interventions/intervals.py). Where that
  interval holds 0 the corruption's effect is inside its noise and there is nothing to
  grade (:attr:`Grade.gradable`): the restores are noise too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from mecheval.interventions.intervals import BOOTSTRAP, Bootstrap
from mecheval.interventions.labels import Thresholds
from mecheval.interventions.result import InterchangeResult


@dataclass(frozen=True)
class Grade:
    method: str
    cells: int
    pearson: float
    spearman: float
    k: int
    recall: float
    error: float
    exact_label: str | None
    label: str | None
    effect: float = math.nan
    effect_low: float = math.nan
    effect_high: float = math.nan

    @property
    def gradable(self) -> bool:
        """Whether the corruption's effect is outside its noise (its interval excludes 0; an
        effect without documents to bound it counts as gradable)."""
        return not self.effect_low <= 0.0 <= self.effect_high

    @property
    def agrees(self) -> bool | None:
        """Whether the estimate's label is the exact one (None: either has none)."""
        if self.exact_label is None or self.label is None:
            return None
        return self.exact_label == self.label


def cell_values(result: InterchangeResult) -> pd.Series:
    """The restored likelihood of every (site, role) cell, in the table's order."""
    table = result.table
    rows = table[(table.condition == "restored") & (table.metric == "likelihood")]
    return pd.Series(rows.value.to_numpy(), index=pd.MultiIndex.from_frame(rows[["site", "role"]]))


def grade(
    method: str,
    exact: InterchangeResult,
    estimated: InterchangeResult,
    exact_label: str | None = None,
    label: str | None = None,
    min_fraction: float = Thresholds().min_fraction,
) -> Grade:
    """The estimate's grade against ``exact`` (see the module doc)."""
    truth = cell_values(exact)
    guess = cell_values(estimated)
    if not truth.index.equals(guess.index):
        raise ValueError("grade: the two tables restore different (site, role) cells")
    original = exact.value("original")
    corrupted = exact.value("corrupted")
    gap = original - corrupted
    matter = (truth - corrupted) / gap >= min_fraction if gap > 0 else truth < -math.inf
    k = int(matter.sum())
    if k:
        top = guess.sort_values(ascending=False, kind="stable").index[:k]
        recall = float(matter.loc[top].sum()) / k
    else:
        recall = math.nan
    return Grade(
        method=method,
        cells=len(truth),
        pearson=_correlation(truth, guess, "pearson"),
        spearman=_correlation(truth, guess, "spearman"),
        k=k,
        recall=recall,
        error=float((truth - guess).abs().mean()) if len(truth) else math.nan,
        exact_label=exact_label,
        label=label,
        effect=gap,
        **dict(zip(("effect_low", "effect_high"), effect_interval(exact), strict=True)),
    )


def effect_interval(
    exact: InterchangeResult, bootstrap: Bootstrap = BOOTSTRAP
) -> tuple[float, float]:
    """The interval of the mean original minus corrupted likelihood over the documents of
    ``exact``'s per-example rows (each cell's rows carry the same two; NaN without rows)."""
    rows = exact.per_example
    if rows.empty:
        return math.nan, math.nan
    first = rows[(rows.site == rows.site.iloc[0]) & (rows.role == rows.role.iloc[0])]
    change = (first.original - first.corrupted).to_numpy(dtype=float)
    return bootstrap.mean_bounds(change)


def _correlation(a: pd.Series, b: pd.Series, method: str) -> float:
    """NaN where either side is constant (or fewer than two cells): no correlation to read."""
    if len(a) < 2 or a.nunique() < 2 or b.nunique() < 2:
        return math.nan
    if method == "spearman":
        # Spearman's rho is Pearson's r of the ranks, ties averaged (as scipy computes it);
        # pandas' own method="spearman" imports scipy, which is not a dependency.
        a, b = a.rank(), b.rank()
    return float(a.corr(b))
