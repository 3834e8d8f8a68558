"""Two-token keys: compositional MQAR.

Source: zoology's ``compositional_mqar`` (HazyResearch/zoology,
``zoology/data/compositional_ar.py``). Each key is two tokens, a first from one vocabulary
and a last from another, and the document's keys form a grid: G first tokens times G last
tokens, all N = G² combinations, each with its own value, in random order. Neither token
alone determines the value (``(A, X) -> v1, (A, Y) -> v2, (B, X) -> v3, (B, Y) -> v4``), so a
model must compose the two. Then a query region as MQAR's (tasks/mqar.py) with three-token
slots: a query is a key's two tokens at slot offset ``3 g``, ``3 g + 1``, and the value is
predicted at its last token::

    <bos> a1 b1 v1 .. aN bN vN  f f f a b f f f ..      -> the value of (a, b) at b

As in zoology: three disjoint vocabularies (zoology: thirds of one), ``space = (seq_len -
3N) // 3`` slots drawn with zoology's power law (``power_a``) without replacement, random
fillers over all the task's ids, every pair queried by default, the value never shown after
its query. Defaults: ``n_pairs`` 4 (zoology's, a 2 x 2 grid; a perfect square is required),
``seq_len`` 64, ``power_a`` 0.01, 2048 first and 2048 last tokens and 4096 values (8192 ids, as
AR's default). Rows are MQAR's: dense training documents, one probe per query in dev and test.

Roles: ``key_first`` and ``key_last`` = the in-context positions of the probe's key tokens,
``value`` = key_last + 1, ``next_key`` = value + 1, ``query`` = the query's last token (where
the value is predicted), ``query_first`` = the query's first token (no ``divider``: as
MQAR, there is no divider token); ``key`` is the token that corruption replaces, ``key_last`` by
default or ``key_first`` with ``corrupt: first``. Either way the token becomes one of its own
vocabulary absent from the probe, so the queried combination no longer occurs in context
while both of its tokens still occur in other pairs: the question is where the two tokens are
composed.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

from mecheval.tasks.base import SPLIT_IDS, out_of_range, torch_generator
from mecheval.tasks.documents import Documents
from mecheval.tasks.family import distinct_rows
from mecheval.tasks.mqar import MultiQueryConfig, draw_slots, fillers, split_rows
from mecheval.tasks.vocab import BOS, N_SPECIAL


class CompositionalMQARConfig(MultiQueryConfig):
    """Compositional MQAR: two-token keys on a G x G grid, MQAR's queries → each query's
    value (zoology's ``compositional_mqar``)."""

    label = "Compositional MQAR"
    extra_roles = ("key_first", "key_last", "query_first")
    tokens_per_key = 2
    preset_fields = {
        # Two-token keys at MQAR quick's scale: 4 first, 4 last tokens and 16 values, a 2 x 2
        # grid (4 pairs, 4 queries) with 4 query slots (seq_len 24: the queries fill them), 2
        # epochs. Measured (docs/tasks.md): attention sits at the one-token plateau (dev
        # accuracy 0.6) until it composes the two tokens, at step 3,750 (then 1.00); with 8
        # first and 8 last tokens it had not composed by the end of 2 epochs (0.64-0.68, also
        # at lr 3e-3), with 8 slots (seq_len 36) not in 3 epochs (0.58).
        "quick": {"n_first": 4, "n_last": 4, "n_values": 16, "n_pairs": 4, "seq_len": 24},
        "tiny": {
            "n_first": 4,
            "n_last": 4,
            "n_values": 8,
            "n_pairs": 4,
            "seq_len": 24,
            "n_dev": 16,
            "n_test": 16,
        },
    }
    quick_epochs = 2

    kind: Literal["compositional_mqar"] = "compositional_mqar"
    n_first: int = Field(2048, ge=1, description="vocabulary of a key's first token")
    n_last: int = Field(2048, ge=1, description="vocabulary of a key's last token")
    n_values: int = Field(4096, ge=1, description="value vocabulary")
    n_pairs: int = Field(
        4,
        ge=1,
        description="keys per document, a perfect square G² (zoology: 4, a 2 x 2 grid)",
    )
    n_queries: int | None = Field(
        None, ge=1, description="queries per document, 1..n_pairs (unset: n_pairs, zoology's)"
    )
    seq_len: int = Field(
        64,
        ge=3,
        description="tokens after <bos> (input_seq_len: 64); at least 3 n_pairs + 3 n_queries",
    )
    power_a: float = Field(
        0.01, gt=0.0, le=1.0, description="power law of query slots (zoology: 0.01)"
    )
    corrupt: Literal["first", "last"] = Field(
        "last", description="the key token that corruption replaces (the role 'key')"
    )

    @field_validator("n_pairs")
    @classmethod
    def _grid_fits(cls, v: int, info: ValidationInfo) -> int:
        side = math.isqrt(v)
        if side * side != v:
            raise out_of_range("the keys form a G x G grid: allowed perfect squares 1, 4, 9, ..", v)
        limit = min(info.data.get("n_first", side), info.data.get("n_last", side))
        if side > limit:
            raise out_of_range(
                f"a {side} x {side} grid needs {side} first and last tokens: allowed up to "
                f"{limit * limit} (min(n_first, n_last)²)",
                v,
            )
        if v > info.data.get("n_values", v):
            raise out_of_range(
                f"distinct values: allowed up to n_values={info.data['n_values']}", v
            )
        return v

    # Token ids: the specials, then first tokens a0.., last tokens b0.., values v0.. (disjoint).
    def first_id(self, i: torch.Tensor | int) -> torch.Tensor | int:
        return i + N_SPECIAL

    def last_id(self, i: torch.Tensor | int) -> torch.Tensor | int:
        return i + N_SPECIAL + self.n_first

    def value_id(self, i: torch.Tensor | int) -> torch.Tensor | int:
        return i + N_SPECIAL + self.n_first + self.n_last

    def token_names(self) -> list[str]:
        return (
            [f"a{i}" for i in range(self.n_first)]
            + [f"b{i}" for i in range(self.n_last)]
            + [f"v{i}" for i in range(self.n_values)]
        )

    def key_class(self) -> tuple[int, int]:
        if self.corrupt == "first":
            return int(self.first_id(0)), int(self.first_id(self.n_first))
        return int(self.last_id(0)), int(self.last_id(self.n_last))

    def generate(self, split: str, n: int, shared: None = None) -> Documents:
        return generate_compositional_mqar(self, split, n)

    def describe(self, documents: Documents, i: int) -> str:
        text = super().describe(documents, i)
        if "document" in documents.extras:  # a probe: which key token corruption replaces
            text = f"{text.removesuffix(')')}; corrupt: {self.corrupt} key token)"
        return text


def generate_compositional_mqar(cfg: CompositionalMQARConfig, split: str, n: int) -> Documents:
    """``n`` documents of ``split`` as dataset rows (tasks/mqar.py's rows)."""
    gen = torch_generator(cfg.seed, SPLIT_IDS[split], 0xC0A4)
    p, q = cfg.n_pairs, cfg.queries
    side = math.isqrt(p)
    firsts = distinct_rows(gen, n, side, cfg.n_first)
    lasts = distinct_rows(gen, n, side, cfg.n_last)
    # The grid's cells in a random order per document: cell c = (first c // G, last c % G).
    cells = torch.rand(n, p, generator=gen).argsort(dim=1)
    first_tok = cfg.first_id(firsts.gather(1, cells // side))
    last_tok = cfg.last_id(lasts.gather(1, cells % side))
    values = cfg.value_id(distinct_rows(gen, n, p, cfg.n_values))
    asked = torch.rand(n, p, generator=gen).argsort(dim=1)[:, :q] if q < p else None
    if asked is None:
        asked = torch.arange(p).expand(n, p)
    slots = draw_slots(gen, n, cfg.space, q, cfg.power_a)

    context_end = cfg.context_end()
    tokens = fillers(gen, (n, 1 + cfg.seq_len), cfg.n_first + cfg.n_last + cfg.n_values)
    tokens[:, 0] = BOS
    tokens[:, 1:context_end] = torch.stack([first_tok, last_tok, values], dim=2).reshape(n, 3 * p)
    query_pos = context_end + 3 * slots + 1  # the query's last token
    tokens.scatter_(1, query_pos - 1, first_tok.gather(1, asked))
    tokens.scatter_(1, query_pos, last_tok.gather(1, asked))
    key_first = 1 + 3 * asked
    roles = {
        "key": key_first if cfg.corrupt == "first" else key_first + 1,
        "value": key_first + 2,
        "next_key": key_first + 3,
        "query": query_pos,
        "key_first": key_first,
        "key_last": key_first + 1,
        "query_first": query_pos - 1,
    }
    return split_rows(split, tokens, query_pos, values.gather(1, asked), roles)
