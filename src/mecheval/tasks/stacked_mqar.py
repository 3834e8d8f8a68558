"""Stacked MQAR: each key and its value share one position, so nothing has to be shifted.

Source: zoology's stacked (continuous) MQAR (HazyResearch/zoology,
``zoology/data/stacked_mqar.py``, ``continuous_mqar``). There every context position holds a
key's embedding and its value's embedding side by side, and the queries that follow hold a
key's embedding alone; the label at each query is its value. With token ids, mecheval
gives every (key, value) pair an id of its own, ``k3:v5``: one token carries both, as the
stacked embedding does::

    <bos> k1:v1 k2:v2 .. kN:vN  q1 q2 .. qQ          -> v(q1) at q1, v(q2) at q2, ...

As in zoology: keys are distinct within a document and so are values; the pairs come in a
random order and the queries ask Q distinct keys of the document in a random order (zoology
asks all N, ``n_queries`` unset), right after the pairs; a value is the answer class and
never an input. zoology's ``num_passes`` (the pairs repeated, JRT-style) is left out: one pass,
so that a queried key has one position to corrupt and restore. Splits are MQAR's (tasks/mqar.py):
a ``train`` row is a whole document with the loss at every query; ``dev`` and ``test`` hold one
probe per query.

Roles of a probe: key = the position of its pair (the key and the value both), next_key = the
position after it (the next pair, or the first query), query. There is no ``value`` role (it
is the key's own position) and no divider. Corruption is AR's applied to the key inside the
pair: ``k:v`` becomes ``k':v`` with ``k'`` a key absent from the probe, so the corrupted query
has no answer in context.

Why it is there: AR's ``induction`` label says the key was carried to its value's position
before the last layer, a shift that AR needs and this task does not. A protocol that reads
mechanisms rather than its own assumptions should read direct retrieval here for every
architecture, with or without a short convolution; whatever it reads is the protocol's
control result (docs/tasks.md).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

from mecheval.tasks.base import SPLIT_IDS, fits_distinct_pairs, torch_generator
from mecheval.tasks.batch import Batch
from mecheval.tasks.documents import Documents
from mecheval.tasks.family import ARFamilyConfig, at_most_pairs, distinct_rows
from mecheval.tasks.mqar import describe_row, rows_of, split_rows
from mecheval.tasks.vocab import BOS, N_SPECIAL


class StackedMQARConfig(ARFamilyConfig):
    """Stacked MQAR: N pair tokens ``k:v``, then Q queried keys → each query's value."""

    label = "Stacked MQAR"
    shared_roles = ("key", "next_key", "query")
    preset_fields = {
        # MQAR's quick sizes: 16 keys, 16 values (256 pair ids), 4 pairs, all queried.
        "quick": {"n_keys": 16, "n_values": 16, "n_pairs": 4},
        "tiny": {"n_keys": 8, "n_values": 8, "n_pairs": 2, "n_dev": 32, "n_test": 32},
    }

    kind: Literal["stacked_mqar"] = "stacked_mqar"
    n_keys: int = Field(
        64, ge=1, description="key vocabulary; a pair id per (key, value): n_keys x n_values"
    )
    n_values: int = Field(64, ge=1, description="value vocabulary, disjoint from the keys")
    n_pairs: int = Field(8, ge=1, description="pairs per document (zoology's num_kv_pairs: 8)")
    n_queries: int | None = Field(
        None, ge=1, description="queries per document, 1..n_pairs (unset: n_pairs, zoology's)"
    )

    @field_validator("n_pairs")
    @classmethod
    def _pairs_fit(cls, v: int, info: ValidationInfo) -> int:
        return fits_distinct_pairs(v, info)

    @field_validator("n_queries")
    @classmethod
    def _queries_fit(cls, v: int | None, info: ValidationInfo) -> int | None:
        return at_most_pairs(v, info, "queries ask distinct keys")

    @property
    def queries(self) -> int:
        return self.n_pairs if self.n_queries is None else self.n_queries

    # Ids: the specials, keys k0.. (the queries), values v0.. (the answers), then the pairs
    # k0:v0, k0:v1, .. (the context).
    def key_id(self, key: torch.Tensor | int) -> torch.Tensor | int:
        return key + N_SPECIAL

    def value_id(self, value: torch.Tensor | int) -> torch.Tensor | int:
        return value + N_SPECIAL + self.n_keys

    def pair_id(self, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return key * self.n_values + value + N_SPECIAL + self.n_keys + self.n_values

    def unpair(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(is a pair id, its key index, its value index) of every id (0 where not a pair)."""
        index = ids - (N_SPECIAL + self.n_keys + self.n_values)
        pair = (index >= 0) & (index < self.n_keys * self.n_values)
        index = index.clamp(0, self.n_keys * self.n_values - 1)
        return pair, index // self.n_values, index % self.n_values

    def token_names(self) -> list[str]:
        keys = [f"k{i}" for i in range(self.n_keys)]
        values = [f"v{i}" for i in range(self.n_values)]
        return [*keys, *values, *(f"{k}:{v}" for k in keys for v in values)]

    def key_class(self) -> tuple[int, int]:
        return int(self.key_id(0)), int(self.key_id(self.n_keys))

    def key_of(self, ids: torch.Tensor) -> torch.Tensor:
        """A pair id's key id; other ids as they are (corruption reads the keys in pairs)."""
        pair, key, _ = self.unpair(ids)
        return torch.where(pair, self.key_id(key), ids)

    def with_key(self, ids: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``ids`` (pair ids) with their key replaced by ``keys`` (key ids), values kept."""
        pair, _, value = self.unpair(ids)
        replaced = self.pair_id(keys - N_SPECIAL, value)
        return torch.where(pair, replaced, keys)

    def answer_candidates(self, batch: Batch) -> torch.Tensor:
        """The values of each document's pairs: its context's answers (each pair token read as
        its value id, then AR's reading of the context)."""
        pair, _, value = self.unpair(batch.tokens)
        return super().answer_candidates(
            batch.with_tokens(torch.where(pair, self.value_id(value), 0))
        )

    def context_end(self) -> int:
        return 1 + self.n_pairs

    def max_length(self) -> int:
        return self.context_end() + self.queries

    def split_rows(self, split: str) -> int:
        return rows_of(split, self.split_size(split), self.queries)

    def generate(self, split: str, n: int, shared: None = None) -> Documents:
        return generate_stacked_mqar(self, split, n)

    def describe(self, documents: Documents, i: int) -> str:
        return describe_row(documents, i, self.queries)


def generate_stacked_mqar(cfg: StackedMQARConfig, split: str, n: int) -> Documents:
    """``n`` documents of ``split`` as dataset rows (tasks/mqar.py's ``split_rows``)."""
    gen = torch_generator(cfg.seed, SPLIT_IDS[split], 0x57AC)
    p, q = cfg.n_pairs, cfg.queries
    keys = distinct_rows(gen, n, p, cfg.n_keys)
    values = distinct_rows(gen, n, p, cfg.n_values)
    # The asked pairs in the order they are asked: a random permutation's first q.
    asked = torch.rand(n, p, generator=gen).argsort(dim=1)[:, :q]
    tokens = torch.empty(n, 1 + p + q, dtype=torch.long)
    tokens[:, 0] = BOS
    tokens[:, 1 : 1 + p] = cfg.pair_id(keys, values)
    tokens[:, 1 + p :] = cfg.key_id(keys.gather(1, asked))
    key = 1 + asked
    query_pos = (1 + p + torch.arange(q)).expand(n, q)
    roles = {"key": key, "next_key": key + 1, "query": query_pos}
    answers = cfg.value_id(values.gather(1, asked))
    return split_rows(split, tokens, query_pos.contiguous(), answers, roles)
