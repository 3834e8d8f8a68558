"""Reassign AR: a key's value changes several times, and the answer is the value it holds
at the end, so a model must retrieve a binding and track its changes at once.

Overwrite AR (tasks/overwrite_ar.py) rebinds a key once; here the queried key passes from
value to value ``query_changes`` times among ``n_changes`` rebindings of the document's keys
(the others fall on the other keys, a key possibly several times)::

    <bos> k1 v1 .. kP vP  c1 w1 .. cC wC  <div> q   -> the value q holds last

Every value in a document is distinct, so each names one binding, and the stale values of
the query key are answer candidates a model that reads the wrong occurrence picks.

Roles: ``key`` = the query key's latest occurrence, ``value`` = key + 1 (the answer),
``next_key`` = value + 1, ``divider``, ``query``; ``stale_key`` = the occurrence before the
latest (the query key's previous binding), ``stale_value`` = stale_key + 1.

Corruption: AR's, at ``key``: the latest occurrence becomes a key absent from the document,
so the corrupted document's query key last holds its previous value.

Readings (tasks/readings.py, ``RETRIEVAL_AND_STATE``): where the latest binding comes back,
as AR's labels read it, and, for a model with recurrent states, whether a layer's state
restored at the divider brings the answer back: the value the query key holds last is in
that state when the query comes (a short convolution's window is not part of the state; where
the latest binding lies within it, the state does not hold all of what the query reads).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

from mecheval.tasks.base import SPLIT_IDS, out_of_range, torch_generator
from mecheval.tasks.documents import Documents
from mecheval.tasks.family import KeyValueConfig, distinct_rows, rebound_documents
from mecheval.tasks.readings import RETRIEVAL_AND_STATE


class ReassignARConfig(KeyValueConfig):
    """Reassign AR: ``<bos> k1 v1 .. kP vP c1 w1 .. cC wC <div> q`` → the value key ``q``
    holds last, after ``query_changes`` of the ``n_changes`` rebindings."""

    label = "Reassign AR"
    extra_roles = ("stale_key", "stale_value")
    readings = RETRIEVAL_AND_STATE
    preset_fields = {
        # Overwrite AR's quick document (3 pairs) with three rebindings, two of them the
        # query key's: its value changes twice.
        "quick": {"n_keys": 16, "n_values": 16, "n_pairs": 3, "n_changes": 3, "query_changes": 2},
        "tiny": {"n_keys": 8, "n_values": 8, "n_pairs": 2, "n_changes": 2, "query_changes": 2},
    }
    quick_epochs = 3

    kind: Literal["reassign_ar"] = "reassign_ar"
    n_keys: int = Field(4096, ge=1, description="key vocabulary (as AR)")
    n_values: int = Field(4096, ge=1, description="value vocabulary, disjoint from the keys")
    n_pairs: int = Field(8, ge=1, description="distinct keys per document, each with a value")
    n_changes: int = Field(
        4, ge=1, description="rebindings after the pairs, each a key of the document anew"
    )
    query_changes: int = Field(
        2, ge=1, description="how many of the rebindings are the query key's (its changes)"
    )

    @field_validator("n_changes")
    @classmethod
    def _values_fit(cls, v: int, info: ValidationInfo) -> int:
        pairs, values = info.data.get("n_pairs"), info.data.get("n_values")
        if pairs is not None and values is not None and pairs + v > values:
            # every binding in a document has a value of its own
            raise out_of_range(f"allowed 1..{values - pairs} (= n_values - n_pairs)", v)
        return v

    @field_validator("query_changes")
    @classmethod
    def _changes_fit(cls, v: int, info: ValidationInfo) -> int:
        changes, pairs = info.data.get("n_changes"), info.data.get("n_pairs")
        if changes is None or pairs is None:
            return v
        if v > changes:
            raise out_of_range(f"allowed 1..n_changes={changes}", v)
        if pairs == 1 and v != changes:
            raise out_of_range(
                f"with one pair every rebinding is the query key's: allowed {changes}", v
            )
        return v

    def max_length(self) -> int:
        return 1 + 2 * (self.n_pairs + self.n_changes) + 2  # <bos> pairs changes <div> q

    def generate(self, split: str, n: int, shared: None = None) -> Documents:
        return generate_reassign_ar(self, split, n)

    def describe(self, documents: Documents, i: int) -> str:
        tokens, names = documents.tokens[i], self.id_names()
        query = int(tokens[int(documents.roles["query"][i])])
        held = [
            names[int(tokens[p + 1])]
            for p in range(1, int(documents.roles["divider"][i]), 2)
            if int(tokens[p]) == query
        ]
        return "  (holds " + " -> ".join(held) + ")"

    def stats(self, documents: Documents) -> dict[str, torch.Tensor]:
        roles = documents.roles
        return {"stale-latest key distance": roles["key"] - roles["stale_key"]}


def generate_reassign_ar(cfg: ReassignARConfig, split: str, n: int) -> Documents:
    """``n`` documents of ``split``."""
    gen = torch_generator(cfg.seed, SPLIT_IDS[split], 0x2EA)
    p, c, own = cfg.n_pairs, cfg.n_changes, cfg.query_changes
    rows = torch.arange(n)
    keys = distinct_rows(gen, n, p, cfg.n_keys)
    values = distinct_rows(gen, n, p + c, cfg.n_values)  # P first values, then C new ones
    asked = torch.randint(p, (n,), generator=gen)  # the query's pair
    # The query key's changes: ``own`` of the C rebinding slots, in slot order.
    mine = torch.rand(n, c, generator=gen).argsort(dim=1)[:, :own].sort(dim=1).values
    # The other slots rebind one of the other P - 1 keys each, uniformly (repeats allowed).
    other = torch.randint(max(p - 1, 1), (n, c), generator=gen)
    changed = other + (other >= asked[:, None]).long()
    changed[rows[:, None], mine] = asked[:, None]

    slot_keys = torch.cat([keys, keys[rows[:, None], changed]], dim=1)  # [n, P + C]
    latest = p + mine[:, -1]
    stale = p + mine[:, -2] if own >= 2 else asked  # the binding before the latest
    return rebound_documents(cfg, slot_keys, values, keys[rows, asked], latest, stale)
