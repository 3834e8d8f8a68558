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
from typing import TYPE_CHECKING, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

from mecheval.tasks.ar import distinct_rows
from mecheval.tasks.base import (
    SPLIT_IDS,
    Task,
    TaskConfigBase,
    out_of_range,
    present_ids,
    torch_generator,
)
from mecheval.tasks.batch import Batch
from mecheval.tasks.mqar import (
    draw_slots,
    fillers,
    queries_fit,
    room_for_queries,
    rows_of,
    split_rows,
)
from mecheval.tasks.mqar import stats as mqar_stats
from mecheval.tasks.vocab import BOS, N_SPECIAL

if TYPE_CHECKING:
    from mecheval.tasks.dataset import TaskDataset

EXTRA_ROLES = ("key_first", "key_last", "query_first")


class CompositionalMQARConfig(TaskConfigBase):
    """Compositional MQAR: two-token keys on a G x G grid, MQAR's queries → each query's
    value (zoology's ``compositional_mqar``)."""

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

    @field_validator("n_queries")
    @classmethod
    def _queries_fit(cls, v: int | None, info: ValidationInfo) -> int | None:
        return queries_fit(v, info)

    @field_validator("seq_len")
    @classmethod
    def _room_for_queries(cls, v: int, info: ValidationInfo) -> int:
        return room_for_queries(v, info, tokens_per_key=2)

    @property
    def queries(self) -> int:
        return self.n_pairs if self.n_queries is None else self.n_queries


# Token ids: the specials, then first tokens a0.., last tokens b0.., values v0.. (disjoint).
def first_id(cfg: CompositionalMQARConfig, i: torch.Tensor | int) -> torch.Tensor | int:
    return i + N_SPECIAL


def last_id(cfg: CompositionalMQARConfig, i: torch.Tensor | int) -> torch.Tensor | int:
    return i + N_SPECIAL + cfg.n_first


def value_id(cfg: CompositionalMQARConfig, i: torch.Tensor | int) -> torch.Tensor | int:
    return i + N_SPECIAL + cfg.n_first + cfg.n_last


def token_names(cfg: CompositionalMQARConfig) -> list[str]:
    return (
        [f"a{i}" for i in range(cfg.n_first)]
        + [f"b{i}" for i in range(cfg.n_last)]
        + [f"v{i}" for i in range(cfg.n_values)]
    )


def max_length(cfg: CompositionalMQARConfig) -> int:
    space = (cfg.seq_len - 3 * cfg.n_pairs) // 3
    return 1 + 3 * cfg.n_pairs + 3 * (space - 1) + 2  # the last slot's query ends at + 1


def key_class(cfg: CompositionalMQARConfig) -> tuple[int, int]:
    if cfg.corrupt == "first":
        return first_id(cfg, 0), first_id(cfg, cfg.n_first)
    return last_id(cfg, 0), last_id(cfg, cfg.n_last)


def generate_compositional_mqar(
    cfg: CompositionalMQARConfig, split: str, n: int, shared: None = None
) -> dict:
    """``n`` documents of ``split`` as the rows of a TaskDataset (tasks/mqar.py's rows)."""
    gen = torch_generator(cfg.seed, SPLIT_IDS[split], 0xC0A4)
    p, q = cfg.n_pairs, cfg.queries
    side = math.isqrt(p)
    firsts = distinct_rows(gen, n, side, cfg.n_first)
    lasts = distinct_rows(gen, n, side, cfg.n_last)
    # The grid's cells in a random order per document: cell c = (first c // G, last c % G).
    cells = torch.rand(n, p, generator=gen).argsort(dim=1)
    first_tok = first_id(cfg, firsts.gather(1, cells // side))
    last_tok = last_id(cfg, lasts.gather(1, cells % side))
    values = value_id(cfg, distinct_rows(gen, n, p, cfg.n_values))
    asked = torch.rand(n, p, generator=gen).argsort(dim=1)[:, :q] if q < p else None
    if asked is None:
        asked = torch.arange(p).expand(n, p)
    space = (cfg.seq_len - 3 * p) // 3
    slots = draw_slots(gen, n, space, q, cfg.power_a)

    context_end = 1 + 3 * p
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


def describe(ds: TaskDataset, i: int) -> str:
    if "document" not in ds.extras:
        return f"  ({ds.extras['answers'].shape[1]} queries, this one the last)"
    return (
        f"  (document {int(ds.extras['document'][i])}, query "
        f"{int(ds.extras['query_index'][i]) + 1} of {ds.cfg.queries}; corrupt: "
        f"{ds.cfg.corrupt} key token)"
    )


def stats(ds: TaskDataset) -> dict[str, torch.Tensor]:
    out = mqar_stats(ds)
    out["query slot (from the region's start)"] = (ds.roles["query"] - 2 - 3 * ds.cfg.n_pairs) // 3
    return out


# --------------------------------------------------------------------------------- presets
# quick: two-token keys at MQAR quick's scale: 4 first, 4 last tokens and 16 values, a 2 x 2
# grid (4 pairs, 4 queries) with 4 query slots (seq_len 24: the queries fill them), 2 epochs.
# Measured (docs/tasks.md): attention sits at the one-token plateau (dev accuracy 0.6) until
# it composes the two tokens, at step 3,750 (then 1.00); with 8 first and 8 last tokens it had
# not composed by the end of 2 epochs (0.64-0.68, also at lr 3e-3), with 8 slots (seq_len 36)
# not in 3 epochs (0.58).
PRESETS = {
    "paper": {
        "task": {"kind": "compositional_mqar"},
        "model": {"d_model": 64, "n_layers": 2},
        "training": {"lr": 1e-3, "batch_size": 32, "epochs": 16},
    },
    "quick": {
        "task": {
            "kind": "compositional_mqar",
            "n_first": 4,
            "n_last": 4,
            "n_values": 16,
            "n_pairs": 4,
            "seq_len": 24,
        },
        "model": {"d_model": 64, "n_layers": 2, "init_std": 0.1},
        "training": {"lr": 1e-3, "batch_size": 32, "epochs": 2, "eval_every": 250},
    },
    "tiny": {
        "task": {
            "kind": "compositional_mqar",
            "n_first": 4,
            "n_last": 4,
            "n_values": 8,
            "n_pairs": 4,
            "seq_len": 24,
            "n_train": 640,
            "n_dev": 16,
            "n_test": 16,
        },
        "model": {"d_model": 16, "n_layers": 2, "init_std": 0.1},
        "training": {"steps": 40, "batch_size": 16, "eval_every": 20, "lr": 3e-3},
    },
}


def answer_candidates(cfg: CompositionalMQARConfig, batch: Batch, vocab_size: int) -> torch.Tensor:
    """The values of each document's pairs (before the query region)."""
    lo, hi = value_id(cfg, 0), value_id(cfg, cfg.n_values)
    return present_ids(batch, lo, hi, vocab_size, end=1 + 3 * cfg.n_pairs)


TASK = Task(
    kind="compositional_mqar",
    label="Compositional MQAR",
    config=CompositionalMQARConfig,
    generate=generate_compositional_mqar,
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
    answer_candidates=answer_candidates,
    shared_roles=("key", "value", "next_key", "query"),
    split_rows=lambda cfg, split: rows_of(split, cfg.split_size(split), cfg.queries),
)
