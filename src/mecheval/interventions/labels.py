"""Mechanism labels: how a checkpoint solves the task, read as the paper reads Fig. 3.

The label is read from the restore table at the last layer's input (``layers.{L-1}.input``;
for a 1-layer model, ``layers.0.output``). With o = p(y|o), c = p(y|c) and r = the restored
likelihood at a role, a role *recovers* the fraction (r − c) / (o − c) of what the
corruption removed:

- ``not learned``: o < ``min_original``.
- ``inconclusive``: the range o − c < ``min_gap``. Corrupting the key barely moves the
  answer, so no restore can show where the key's information went: a measurement without
  range, not evidence of "no mechanism" (ATR documents whose answer does not need the key
  show it). The label and its string report the range.
- otherwise the role with the largest fraction, if it is ≥ ``min_fraction``:
  ``value`` -> ``induction`` (the key was associated at the value before the last layer);
  ``next_key`` -> ``induction (next key)`` (Mamba's variant, paper §4.4);
  ``query`` -> ``direct retrieval, layer 0`` (the answer is already at the query);
  ``key`` -> ``direct retrieval, layer >= 1`` (the last layer reads the key itself).
- ``unclear`` when no role recovers ``min_fraction``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from mecheval.models.sites import last_layer_input, layer_site

LABELS = {
    "value": "induction",
    "next_key": "induction (next key)",
    "query": "direct retrieval, layer 0",
    "key": "direct retrieval, layer >= 1",
}


@dataclass(frozen=True)
class Thresholds:
    min_original: float = 0.2
    min_gap: float = 0.05
    min_fraction: float = 0.5


@dataclass(frozen=True)
class MechanismLabel:
    label: str
    site: str
    original: float
    corrupted: float
    restored: dict[str, float] = field(default_factory=dict)
    recovered: dict[str, float] = field(default_factory=dict)
    thresholds: Thresholds = Thresholds()

    @property
    def range(self) -> float:
        """original − corrupted: what the corruption removed, which restores can recover."""
        return self.original - self.corrupted

    def __str__(self) -> str:
        parts = ", ".join(f"{r} {v:.0%}" for r, v in self.recovered.items())
        return (
            f"{self.label} (at {self.site}: original {self.original:.3f}, corrupted "
            f"{self.corrupted:.3f}, range {self.range:.3f}; recovered {parts})"
        )


def label_site(n_layers: int) -> str:
    return last_layer_input(n_layers) if n_layers >= 2 else layer_site(0, "output")


def label_mechanism(
    table: pd.DataFrame, n_layers: int, thresholds: Thresholds = Thresholds()
) -> MechanismLabel:
    """Label from an interchange table (the engine's ``InterchangeResult.table``)."""
    site = label_site(n_layers)
    likelihood = table[table.metric == "likelihood"]

    def one(condition: str) -> float:
        return float(likelihood[likelihood.condition == condition].value.iloc[0])

    original, corrupted = one("original"), one("corrupted")
    at_site = likelihood[(likelihood.condition == "restored") & (likelihood.site == site)]
    restored = {r: float(v) for r, v in zip(at_site.role, at_site.value, strict=True)}
    gap = original - corrupted
    recovered = {
        r: (v - corrupted) / gap if gap > 1e-12 else 0.0 for r, v in restored.items() if r in LABELS
    }
    if original < thresholds.min_original:
        label = "not learned"
    elif gap < thresholds.min_gap:
        label = "inconclusive"
    elif not recovered:
        raise ValueError(f"label: the table has no restores at {site} (key/value/query)")
    else:
        best = max(recovered, key=recovered.__getitem__)
        label = LABELS[best] if recovered[best] >= thresholds.min_fraction else "unclear"
    return MechanismLabel(label, site, original, corrupted, restored, recovered, thresholds)
