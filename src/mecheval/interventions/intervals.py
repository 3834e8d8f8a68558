"""How sure a restore is: percentile bootstrap intervals over the documents measured.

A restore table averages over N documents; drawing N documents with replacement B times and
averaging again gives B values of each statistic, whose central ``level`` share is its
interval. Every (site, role) is resampled with the same draws, and each draw's recovered
fraction is computed from that draw's means, ``(r - c) / (o - c)`` (r, o, c the restored,
original and corrupted likelihoods), as the label reads it (interventions/labels.py): the
interval of a ratio of means, not a mean of per-document ratios, which are unbounded where a
document's corruption moves nothing.

The draws come from their own seeded generator, so an interval is the same on every run of
the same documents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

#: Per (site, role): the mean restored likelihood and the fraction it recovers, each with
#: its interval.
INTERVAL_COLUMNS = [
    "site",
    "role",
    "restored",
    "restored_low",
    "restored_high",
    "recovered",
    "recovered_low",
    "recovered_high",
]


@dataclass(frozen=True)
class Bootstrap:
    n_resamples: int = 1000
    level: float = 0.95
    seed: int = 0

    def draws(self, n_docs: int) -> np.ndarray:
        """[n_resamples, n_docs] document indices, each row a resample with replacement."""
        generator = np.random.default_rng(self.seed)
        return generator.integers(0, n_docs, size=(self.n_resamples, n_docs))

    def bounds(self, values: np.ndarray) -> tuple[float, float]:
        """The central ``level`` share of ``values`` (one statistic's resamples)."""
        tail = (1.0 - self.level) / 2.0
        low, high = np.quantile(values, [tail, 1.0 - tail])
        return float(low), float(high)


#: The intervals every label and table reports: 1,000 resamples, 95 %.
BOOTSTRAP = Bootstrap()


def recovered_fraction(restored, corrupted, gap):
    """(r - c) / gap with gap = o - c, 0 where the corruption removed nothing (gap <= 1e-12):
    the fraction the label reads; works on floats and on arrays alike."""
    gap = np.asarray(gap, dtype=np.float64)
    safe = np.where(gap > 1e-12, gap, 1.0)
    return np.where(gap > 1e-12, (restored - corrupted) / safe, 0.0)


def restore_intervals(per_example: pd.DataFrame, bootstrap: Bootstrap = BOOTSTRAP) -> pd.DataFrame:
    """Per (site, role) of ``per_example`` (the engine's ``InterchangeResult.per_example``:
    doc, site, role, restored, original, corrupted): its mean restored likelihood and the
    fraction it recovers, each with its interval (:data:`INTERVAL_COLUMNS`)."""
    if per_example.empty:
        return pd.DataFrame(columns=INTERVAL_COLUMNS)
    columns = ["restored", "original", "corrupted"]
    point = per_example.groupby(["site", "role"], sort=False)[columns].mean()
    groups = list(per_example.groupby(["site", "role"], sort=False))
    first = groups[0][1].sort_values("doc")
    docs = first["doc"].to_numpy()
    draws = bootstrap.draws(len(docs))
    original = first["original"].to_numpy(np.float64)[draws].mean(axis=1)
    corrupted = first["corrupted"].to_numpy(np.float64)[draws].mean(axis=1)
    rows = []
    for (site, role), group in groups:
        group = group.sort_values("doc")
        if not np.array_equal(group["doc"].to_numpy(), docs):
            raise ValueError(f"per_example: {site} @ {role} measured other documents")
        restored = group["restored"].to_numpy(np.float64)[draws].mean(axis=1)
        fraction = recovered_fraction(restored, corrupted, original - corrupted)
        r, o, c = point.loc[(site, role)]
        rows.append(
            (site, role, r, *bootstrap.bounds(restored))
            + (float(recovered_fraction(r, c, o - c)), *bootstrap.bounds(fraction))
        )
    return pd.DataFrame(rows, columns=INTERVAL_COLUMNS)


#: The metrics :func:`interval_table` adds to a restore table, per (site, role).
INTERVAL_METRICS = (
    "likelihood_low",
    "likelihood_high",
    "recovered",
    "recovered_low",
    "recovered_high",
)


def interval_table(per_example: pd.DataFrame, bootstrap: Bootstrap = BOOTSTRAP) -> pd.DataFrame:
    """:func:`restore_intervals` as rows of the engine's table (condition "restored", site,
    role, metric, value), with each restore's recovered fraction beside its interval: the
    rows a run's interventions.csv and the results table carry."""
    rows = []
    for row in restore_intervals(per_example, bootstrap).itertuples(index=False):
        values = (
            row.restored_low,
            row.restored_high,
            row.recovered,
            row.recovered_low,
            row.recovered_high,
        )
        rows += [
            ("restored", row.site, row.role, m, v)
            for m, v in zip(INTERVAL_METRICS, values, strict=True)
        ]
    return pd.DataFrame(rows, columns=["condition", "site", "role", "metric", "value"])
