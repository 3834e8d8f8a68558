"""Which layer of a hybrid carries the retrieval, and which branch of a parallel layer.

A label read at the last layer's input says where the answer comes back (the value:
induction; the query: it was retrieved before). In a model whose layers differ, what a
researcher asks next is *which* layer does it, and of which architecture. Read from the
restores of every block boundary (the engine's default plan measures them all):

* the carrying layer j is the first whose output holds the answer at the query: restoring
  the query at the input of layer j + 1 (``final_norm.input`` after the last) recovers at
  least the label's bar of what the corruption removed, and at layer j's input it did not;
* what it reads, at its input: the value (or the next key) recovering there is induction
  (the key's binding was written at the value before layer j), the key is direct retrieval
  (layer j looks the key up from the query);
* of a parallel layer, the branches whose own output, restored at the query, recovers the
  bar alone (``layers.{j}.mixer.branches.{k}.output``).

The fractions are :func:`~mecheval.interventions.intervals.recovered_fraction`'s, read
against the same bar as the label (``MechanismLabel.bar``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from mecheval.interventions.intervals import recovered_fraction
from mecheval.models.config import PARALLEL_JOIN

#: what layer j reads at its input, by the role that recovers there (best first)
READS = (("value", "induction"), ("next_key", "induction (next key)"), ("key", "direct retrieval"))


@dataclass(frozen=True)
class Carrier:
    """The layer that brings the answer to the query, what it reads, and (of a parallel
    layer) which branches do it alone."""

    layer: int
    architecture: str
    reads: str
    branches: tuple[str, ...] = ()

    def __str__(self) -> str:
        where = self.architecture
        if PARALLEL_JOIN in self.architecture:
            alone = " and ".join(self.branches) if self.branches else "no branch alone"
            where = f"{self.architecture}: {alone}"
        return f"{self.reads} in layer {self.layer} ({where})"


def carrier(
    likelihood: pd.DataFrame,
    layer_names: Sequence[str],
    original: float,
    corrupted: float,
    bar: float,
) -> Carrier | None:
    """The carrying layer from an interchange table's likelihood rows (None where the
    boundaries were not all measured, or no layer brings the answer to the query)."""
    restored = likelihood[likelihood.condition == "restored"]
    values = {
        (str(site), str(role)): float(value)
        for site, role, value in zip(restored.site, restored.role, restored.value, strict=True)
    }
    gap = original - corrupted

    def recovers(site: str, role: str) -> bool | None:
        value = values.get((site, role))
        return None if value is None else recovered_fraction(value, corrupted, gap) >= bar

    n_layers = len(layer_names)
    inputs = [f"layers.{j}.input" for j in range(n_layers)] + ["final_norm.input"]
    for j in range(n_layers):
        after = recovers(inputs[j + 1], "query")
        if after is None:
            return None
        if not after:
            continue
        reads = next((kind for role, kind in READS if recovers(inputs[j], role)), None)
        if reads is None:
            return None
        parts = layer_names[j].split(PARALLEL_JOIN)
        branches = tuple(
            part
            for k, part in enumerate(parts)
            if len(parts) > 1 and recovers(f"layers.{j}.mixer.branches.{k}.output", "query")
        )
        return Carrier(j, layer_names[j], reads, branches)
    return None
