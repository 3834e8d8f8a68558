"""Overwrite AR, "latest wins": some keys occur twice with different values and the answer is
the value after the latest occurrence.

Source: zoology's forgetting MQAR (HazyResearch/zoology, ``zoology/data/forgetting_mqar.py``,
``forgetting_mqar``): ``num_kv_pairs`` distinct keys with their values, then ``num_updates``
of those keys (a random subset, in random order) again with a new value; a query's label is
the key's final value. Defaults follow it: ``n_pairs`` = 8 (``num_kv_pairs``), ``n_updates`` =
4 (``num_updates``). As in AR (tasks/ar.py), a document has a single query after ``<div>``,
not zoology's many power-law-placed queries::

    <bos> k1 v1 .. kP vP  u1 w1 .. uU wU  <div> q   -> a

``u1..uU`` are U distinct keys of ``k1..kP``. Every value in the document is distinct
(zoology only requires an update's value to differ from that key's old one; distinct values
make the stale and the latest value two different tokens, and each value names one
occurrence). With probability ``query_updated`` (default 1: always) the query is an updated
key, uniform over the U updates, and the answer is its new value; otherwise it is one of the
P − U keys that occur once, and the answer is its only value.

Roles: ``key`` = the latest in-context occurrence of the query key, ``value`` = key + 1 (the
answer), ``next_key`` = value + 1, ``divider``, ``query``; beyond AR's roles, ``stale_key`` =
the earlier occurrence of the query key and ``stale_value`` = stale_key + 1 (the overwritten
value). Where the query key occurs once (``query_updated`` < 1), stale_key = key and
stale_value = value; ``extras["overwritten"]`` is 1 where the query key occurs twice.

Corruption: AR's, at ``key``: the latest occurrence becomes a key id absent from the
document, so the corrupted document holds the query key only at its stale occurrence, and a
model that reads the latest binding loses the answer while one that falls back on the stale
binding answers the stale value.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

from mecheval.tasks.base import SPLIT_IDS, out_of_range, torch_generator
from mecheval.tasks.documents import Documents
from mecheval.tasks.family import KeyValueConfig, distinct_rows, rebound_documents


class OverwriteARConfig(KeyValueConfig):
    """Overwrite AR: ``<bos> k1 v1 .. kP vP u1 w1 .. uU wU <div> q`` → the latest value of
    key ``q``."""

    label = "Overwrite AR"
    extra_roles = ("stale_key", "stale_value")
    preset_fields = {
        # AR's quick recipe with 3 pairs of which 1 is overwritten (4 slots: AR quick's 8
        # context tokens), half the queries on the overwritten key, and 3 epochs. Measured
        # (docs/tasks.md): in one epoch attention stays at the plateau (dev accuracy 0.52: the
        # overwritten key's latest value right, the others not; 0.54 with 4 pairs and 2
        # updates, all queries overwritten; lr 3e-3 no better); with 3 epochs it reaches
        # >= 97 % dev accuracy at step 2,500 and 100 % at the end.
        "quick": {"n_keys": 16, "n_values": 16, "n_pairs": 3, "n_updates": 1, "query_updated": 0.5},
        "tiny": {"n_keys": 8, "n_values": 8, "n_pairs": 2, "n_updates": 1},
    }
    quick_epochs = 3

    kind: Literal["overwrite_ar"] = "overwrite_ar"
    n_keys: int = Field(4096, ge=1, description="key vocabulary (as AR)")
    n_values: int = Field(4096, ge=1, description="value vocabulary, disjoint from the keys")
    n_pairs: int = Field(
        8, ge=1, description="distinct keys per document (zoology's num_kv_pairs: 8)"
    )
    n_updates: int = Field(
        4,
        ge=1,
        description="keys that occur again with a new value (zoology's num_updates: 4)",
    )
    query_updated: float = Field(
        1.0,
        description="share of documents whose query key occurs twice, 0 <= share <= 1",
    )

    @field_validator("n_updates")
    @classmethod
    def _updates_fit(cls, v: int, info: ValidationInfo) -> int:
        pairs, values = info.data.get("n_pairs"), info.data.get("n_values")
        if pairs is None or values is None:
            return v
        # Updates repeat distinct keys of the document, each with a value of its own.
        limit = min(pairs, values - pairs)
        if not 1 <= v <= limit:
            raise out_of_range(
                f"allowed 1..{limit} (= min(n_pairs, n_values - n_pairs): updates repeat "
                "distinct keys, and every value in a document is distinct)",
                v,
            )
        return v

    @field_validator("query_updated")
    @classmethod
    def _share_in_range(cls, v: float, info: ValidationInfo) -> float:
        if not 0 <= v <= 1:
            raise out_of_range("allowed range 0 <= query_updated <= 1", v)
        pairs, updates = info.data.get("n_pairs"), info.data.get("n_updates")
        if v < 1 and pairs is not None and updates is not None and updates >= pairs:
            raise out_of_range(
                f"below 1 needs keys that occur once, i.e. n_updates < n_pairs "
                f"(here {updates} >= {pairs}); allowed: 1",
                v,
            )
        return v

    def max_length(self) -> int:
        return 1 + 2 * (self.n_pairs + self.n_updates) + 2  # <bos> pairs updates <div> q

    def generate(self, split: str, n: int, shared: None = None) -> Documents:
        return generate_overwrite_ar(self, split, n)

    def describe(self, documents: Documents, i: int) -> str:
        if not int(documents.extras["overwritten"][i]):
            return "  (query key occurs once)"
        stale = documents.tokens[i, int(documents.roles["stale_value"][i])]
        return f"  (overwrites {self.id_names()[int(stale)]})"

    def stats(self, documents: Documents) -> dict[str, torch.Tensor]:
        roles = documents.roles
        return {
            "query key occurs twice": documents.extras["overwritten"],
            "stale-latest key distance": roles["key"] - roles["stale_key"],
            "stale key-query distance": roles["query"] - roles["stale_key"],
        }


def generate_overwrite_ar(cfg: OverwriteARConfig, split: str, n: int) -> Documents:
    """``n`` documents of ``split``."""
    gen = torch_generator(cfg.seed, SPLIT_IDS[split], 0x0E4)
    p, u = cfg.n_pairs, cfg.n_updates
    rows = torch.arange(n)
    keys = distinct_rows(gen, n, p, cfg.n_keys)
    values = distinct_rows(gen, n, p + u, cfg.n_values)  # P first values, then U new ones
    updated = torch.rand(n, p, generator=gen).argsort(dim=1)[:, :u]  # which pairs, in order
    twice = torch.zeros(n, p, dtype=torch.bool)
    twice[rows[:, None], updated] = True
    # The query: an updated key (uniform over the updates) with probability query_updated,
    # else a key that occurs once (uniform over those).
    asks_update = torch.rand(n, generator=gen) < cfg.query_updated
    j = torch.randint(u, (n,), generator=gen)
    once = torch.rand(n, p, generator=gen).masked_fill(twice, -1.0).argmax(dim=1)
    first = torch.where(asks_update, updated[rows, j], once)  # pair index of the stale one
    latest_slot = torch.where(asks_update, p + j, once)  # slot of the latest occurrence
    slot_keys = torch.cat([keys, keys[rows[:, None], updated]], dim=1)  # [n, P + U]
    asked = keys[rows, first]
    extras = {"overwritten": asks_update.long()}
    return rebound_documents(cfg, slot_keys, values, asked, latest_slot, first, extras)
