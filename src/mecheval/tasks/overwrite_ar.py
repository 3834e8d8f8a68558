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

from typing import TYPE_CHECKING, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

from mecheval.tasks.ar import (
    answer_candidates,
    distinct_rows,
    key_class,
    key_id,
    token_names,
    value_id,
)
from mecheval.tasks.base import (
    SPLIT_IDS,
    Task,
    TaskConfigBase,
    fits_distinct_pairs,
    out_of_range,
    torch_generator,
)
from mecheval.tasks.vocab import BOS, DIV

if TYPE_CHECKING:
    from mecheval.tasks.dataset import TaskDataset

#: The roles overwrite AR adds to the shared ones (tasks/batch.py's ROLES).
EXTRA_ROLES = ("stale_key", "stale_value")


class OverwriteARConfig(TaskConfigBase):
    """Overwrite AR: ``<bos> k1 v1 .. kP vP u1 w1 .. uU wU <div> q`` → the latest value of
    key ``q``."""

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

    @field_validator("n_pairs")
    @classmethod
    def _pairs_fit(cls, v: int, info: ValidationInfo) -> int:
        return fits_distinct_pairs(v, info)

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


def max_length(cfg: OverwriteARConfig) -> int:
    return 1 + 2 * (cfg.n_pairs + cfg.n_updates) + 2  # <bos> pairs updates <div> q


def generate_overwrite_ar(cfg: OverwriteARConfig, split: str, n: int, shared: None = None) -> dict:
    """``n`` documents of ``split`` as tensors for TaskDataset."""
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
    answer_value = values[rows, latest_slot]

    slot_keys = torch.cat([keys, keys[rows[:, None], updated]], dim=1)  # [n, P + U]
    pairs = torch.stack([key_id(cfg, slot_keys), value_id(cfg, values)], dim=2)
    width = 2 * (p + u) + 3
    tokens = torch.empty(n, width, dtype=torch.long)
    tokens[:, 0] = BOS
    tokens[:, 1 : width - 2] = pairs.reshape(n, 2 * (p + u))
    tokens[:, width - 2] = DIV
    tokens[:, width - 1] = key_id(cfg, keys[rows, first])
    key_pos = 1 + 2 * latest_slot
    stale_pos = 1 + 2 * first
    full = torch.full((n,), width - 2, dtype=torch.long)
    roles = {
        "key": key_pos,
        "value": key_pos + 1,
        "next_key": key_pos + 2,
        "divider": full,
        "query": full + 1,
        "stale_key": stale_pos,
        "stale_value": stale_pos + 1,
    }
    return {
        "tokens": tokens,
        "answer": value_id(cfg, answer_value),
        "roles": roles,
        "lengths": full + 2,
        "extras": {"overwritten": asks_update.long()},
        "trees": None,
    }


def describe(ds: TaskDataset, i: int) -> str:
    if not int(ds.extras["overwritten"][i]):
        return "  (query key occurs once)"
    stale = ds.tokens[i, int(ds.roles["stale_value"][i])]
    return f"  (overwrites {ds.token_names[int(stale)]})"


def stats(ds: TaskDataset) -> dict[str, torch.Tensor]:
    roles = ds.roles
    return {
        "query key occurs twice": ds.extras["overwritten"],
        "stale-latest key distance": roles["key"] - roles["stale_key"],
        "stale key-query distance": roles["query"] - roles["stale_key"],
    }


# --------------------------------------------------------------------------------- presets
# quick: AR's quick recipe (16 keys, 16 values, init_std 0.1) with 3 pairs of which 1 is
# overwritten (4 slots: AR quick's 8 context tokens), half the queries on the overwritten key,
# and 3 epochs. Measured (docs/tasks.md): in one epoch attention stays at the plateau (dev
# accuracy 0.52: the overwritten key's latest value right, the others not; 0.54 with 4 pairs
# and 2 updates, all queries overwritten; lr 3e-3 no better); with 3 epochs it reaches
# >= 97 % dev accuracy at step 2,500 and 100 % at the end.
PRESETS = {
    "paper": {
        "task": {"kind": "overwrite_ar"},
        "model": {"d_model": 64, "n_layers": 2},
        "training": {"lr": 1e-3, "batch_size": 32, "epochs": 16},
    },
    "quick": {
        "task": {
            "kind": "overwrite_ar",
            "n_keys": 16,
            "n_values": 16,
            "n_pairs": 3,
            "n_updates": 1,
            "query_updated": 0.5,
        },
        "model": {"d_model": 64, "n_layers": 2, "init_std": 0.1},
        "training": {"lr": 1e-3, "batch_size": 32, "epochs": 3, "eval_every": 250},
    },
    "tiny": {
        "task": {
            "kind": "overwrite_ar",
            "n_keys": 8,
            "n_values": 8,
            "n_pairs": 2,
            "n_updates": 1,
            "n_train": 640,
            "n_dev": 64,
            "n_test": 64,
        },
        "model": {"d_model": 16, "n_layers": 2, "init_std": 0.1},
        "training": {"steps": 40, "batch_size": 16, "eval_every": 20, "lr": 3e-3},
    },
}


TASK = Task(
    kind="overwrite_ar",
    label="Overwrite AR",
    config=OverwriteARConfig,
    generate=generate_overwrite_ar,
    token_names=token_names,
    max_length=max_length,
    key_class=key_class,
    corrupt_to_absent=True,
    default_epochs=16,  # as AR (§4.1)
    paper_lrs=(3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2),  # AR's grid
    presets=PRESETS,
    quick_lrs={"mamba": 3e-3, "hyena": 3e-3},  # AR's, not re-measured on this task
    describe=describe,
    stats=stats,
    extra_roles=EXTRA_ROLES,
    # AR's: the document's values; a stale value is one (picking it is a binding failure).
    answer_candidates=answer_candidates,
)
