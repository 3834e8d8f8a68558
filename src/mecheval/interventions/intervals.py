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

    def mean_bounds(self, values: np.ndarray) -> tuple[float, float]:
        """:meth:`bounds` of the mean of ``values`` (one per document, or per seed)."""
        return self.bounds(values[self.draws(len(values))].mean(axis=1))

    def row_bounds(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`bounds` of each row of ``values`` ([statistics, resamples]), equal to it
        row by row."""
        tail = (1.0 - self.level) / 2.0
        low, high = np.quantile(values, [tail, 1.0 - tail], axis=1)
        return low, high


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
    grouped = per_example.groupby(["site", "role"], sort=False)
    point = grouped[columns].mean()  # one row per (site, role), in the order they first appear
    # The rows of each (site, role) as one block, in document order, blocks in that order too.
    docs = per_example["doc"].to_numpy()
    order = np.lexsort((docs, grouped.ngroup().to_numpy()))
    docs = docs[order]
    blocks = np.split(docs, np.cumsum(grouped.size().to_numpy())[:-1])
    for (site, role), block in zip(point.index, blocks, strict=True):
        if not np.array_equal(block, blocks[0]):
            raise ValueError(f"per_example: {site} @ {role} measured other documents")
    values = per_example[columns].to_numpy(np.float64)[order]
    values = values.reshape(len(blocks), len(blocks[0]), len(columns))  # [groups, docs, 3]
    draws = bootstrap.draws(len(blocks[0]))
    original = values[0, :, 1][draws].mean(axis=1)
    corrupted = values[0, :, 2][draws].mean(axis=1)
    restored = np.stack([group[draws].mean(axis=1) for group in values[:, :, 0]])
    fraction = recovered_fraction(restored, corrupted, original - corrupted)
    restored_low, restored_high = bootstrap.row_bounds(restored)
    fraction_low, fraction_high = bootstrap.row_bounds(fraction)
    r, o, c = point.to_numpy().T
    table = point.index.to_frame(index=False)
    table["restored"] = r
    table["restored_low"], table["restored_high"] = restored_low, restored_high
    table["recovered"] = recovered_fraction(r, c, o - c)
    table["recovered_low"], table["recovered_high"] = fraction_low, fraction_high
    return table


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
