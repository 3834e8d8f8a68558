"""Multi-query associative recall, MQAR.

Source: zoology's ``multiquery_ar`` (HazyResearch/zoology, ``zoology/data/multiquery_ar.py``;
Arora et al., 2024a, "Zoology"). A document is N key-value pairs, then a query region of
``seq_len - 2N`` tokens in which Q of the document's keys occur once each, at even offsets
whose distances from the region's start follow zoology's power law; every other token of the
region is a random filler (zoology's ``random_non_queries``). The model predicts, at each
query, the value that followed that key in context::

    <bos> k1 v1 .. kN vN  f f q1 f f f q2 f ..        -> v(q1) at q1, v(q2) at q2, ...

As in zoology: keys and values are distinct within a document and come from disjoint
vocabularies (zoology splits one vocabulary in halves; here ``n_keys`` + ``n_values``); the
query region has ``space = (seq_len - 2N) // 2`` two-token slots and the queries take Q
distinct slots ``g`` drawn without replacement with probability proportional to
``(g + 1) ** (power_a - 1)``, in draw order: the i-th queried pair gets the i-th slot drawn
(zoology's ``np.random.choice(space, size, replace=False, p)``, reproduced in distribution by
Gumbel top-k); query i sits at region offset ``2 g_i``; fillers are uniform over all the task's
ids, keys and values alike (zoology: the whole vocabulary). The token after a query is a
filler, not its value: zoology supervises the value as the *label* at the query and never
shows it (we follow the code). Fields
with a zoology counterpart keep its default: ``n_pairs`` 8 (``num_kv_pairs``), ``seq_len`` 64
(``input_seq_len``, without our ``<bos>``), ``power_a`` 0.01; zoology queries every key
(``n_queries`` unset = ``n_pairs``).

Splits. A ``train`` row is a whole document up to its last query, and the loss is taken at
every query (zoology's dense supervision): ``extras["answer_positions"]`` and
``extras["answers"]``, [Q] per document, which training reads (training/metrics.py). A ``dev``
or ``test`` row is one *probe*: the document cut after one of its queries, with that query's
roles and answer, so that evaluation and interventions treat each query as its own document
(a causal model's output at a query does not depend on what follows it). ``n_dev`` and
``n_test`` count documents; their splits hold Q probes per document, document by document in
query order (``extras["document"]``, ``extras["query_index"]``).

Roles of a probe: key = the in-context position of its key, value = key + 1, next_key =
value + 1 (for the last pair: the first token of the query region, which may be a query),
query = the probe's query. MQAR has no divider token, so no ``divider`` role (the region's
first token is a query in most documents: the power law favours slot 0). Corruption is AR's:
the token at ``key`` becomes a key id absent from the probe (``corrupt_to_absent``), so the
corrupted query has no answer in context.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

from mecheval.tasks.ar import distinct_rows, key_class, key_id, token_names, value_id
from mecheval.tasks.base import (
    SPLIT_IDS,
    Task,
    TaskConfigBase,
    fits_distinct_pairs,
    out_of_range,
    present_ids,
    torch_generator,
)
from mecheval.tasks.batch import ANSWER_POSITIONS, ANSWERS, Batch
from mecheval.tasks.vocab import BOS, N_SPECIAL

if TYPE_CHECKING:
    from mecheval.tasks.dataset import TaskDataset


class MQARConfig(TaskConfigBase):
    """MQAR: N pairs, then Q power-law-placed queries among random fillers → each query's
    value (zoology's ``multiquery_ar``)."""

    kind: Literal["mqar"] = "mqar"
    n_keys: int = Field(4096, ge=1, description="key vocabulary (zoology: vocab_size / 2)")
    n_values: int = Field(4096, ge=1, description="value vocabulary, disjoint from the keys")
    n_pairs: int = Field(8, ge=1, description="key-value pairs per document (num_kv_pairs: 8)")
    n_queries: int | None = Field(
        None, ge=1, description="queries per document, 1..n_pairs (unset: n_pairs, zoology's)"
    )
    seq_len: int = Field(
        64,
        ge=2,
        description="tokens after <bos>: pairs plus query region (input_seq_len: 64); at "
        "least 2 n_pairs + 2 n_queries",
    )
    power_a: float = Field(
        0.01,
        gt=0.0,
        le=1.0,
        description="power law of query slots, p(g) ∝ (g+1)^(a-1) (power_a: 0.01; 1 = uniform)",
    )

    @field_validator("n_pairs")
    @classmethod
    def _pairs_fit(cls, v: int, info: ValidationInfo) -> int:
        return fits_distinct_pairs(v, info)

    @field_validator("n_queries")
    @classmethod
    def _queries_fit(cls, v: int | None, info: ValidationInfo) -> int | None:
        return queries_fit(v, info)

    @field_validator("seq_len")
    @classmethod
    def _room_for_queries(cls, v: int, info: ValidationInfo) -> int:
        return room_for_queries(v, info, tokens_per_key=1)

    @property
    def queries(self) -> int:
        return self.n_pairs if self.n_queries is None else self.n_queries


def queries_fit(v: int | None, info: ValidationInfo) -> int | None:
    """A field validator's body for ``n_queries``: at most ``n_pairs`` (distinct keys)."""
    pairs = info.data.get("n_pairs")
    if v is not None and pairs is not None and v > pairs:
        raise out_of_range(f"queries ask distinct keys: allowed 1..n_pairs={pairs}", v)
    return v


def room_for_queries(v: int, info: ValidationInfo, tokens_per_key: int) -> int:
    """A field validator's body for ``seq_len``: room for the pairs and one query slot per
    query, (tokens_per_key + 1) tokens each."""
    pairs = info.data.get("n_pairs")
    if pairs is None or "n_queries" not in info.data:
        return v
    queries = info.data["n_queries"] or pairs
    slot = tokens_per_key + 1
    need = slot * (pairs + queries)
    if v < need:
        raise out_of_range(
            f"too short for {pairs} pairs and {queries} queries: allowed >= {need} "
            f"({slot} n_pairs + {slot} n_queries)",
            v,
        )
    return v


def max_length(cfg: MQARConfig) -> int:
    # A query's slot starts at an even offset < 2 * space, so the last query is at most here.
    return 1 + 2 * cfg.n_pairs + 2 * ((cfg.seq_len - 2 * cfg.n_pairs) // 2 - 1) + 1


# ---------------------------------------------------------------- shared with compositional


def power_law(space: int, power_a: float) -> torch.Tensor:
    """[space] float64: zoology's slot distribution, p(g) ∝ (g + 1) ** (power_a - 1)."""
    p = torch.arange(1, space + 1, dtype=torch.float64) ** (power_a - 1)
    return p / p.sum()


def draw_slots(gen: torch.Generator, n: int, space: int, k: int, power_a: float) -> torch.Tensor:
    """[n, k] long: per document k distinct slots of 0..space-1, drawn one after another
    without replacement with probabilities ``power_law`` (renormalised over the slots left),
    in draw order. Gumbel top-k: the k largest of log p + Gumbel noise, sorted, have exactly
    that distribution."""
    logp = power_law(space, power_a).log()
    uniform = torch.rand(n, space, generator=gen, dtype=torch.float64)
    gumbel = -torch.log(-torch.log(uniform.clamp_min(1e-300)))
    return (logp + gumbel).topk(k, dim=1, sorted=True).indices


def split_rows(
    split: str,
    tokens: torch.Tensor,
    query_pos: torch.Tensor,
    answers: torch.Tensor,
    roles: dict[str, torch.Tensor],
    extras: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """The rows of ``split`` from whole documents with several queries each.

    tokens [n, W]; query_pos, answers and every role [n, Q] (the q-th query's). ``train``:
    one row per document, up to its last query, with the roles of that query and every query
    in ``extras["answer_positions"]`` / ``extras["answers"]``; otherwise one probe per query,
    document by document in query order.
    """
    n, q = query_pos.shape
    extras = dict(extras or {})
    if split == "train":
        last = query_pos.argmax(dim=1, keepdim=True)
        pick = {name: pos.gather(1, last)[:, 0] for name, pos in roles.items()}
        lengths = query_pos.max(dim=1).values + 1
        return {
            "tokens": _padded(tokens, lengths),
            "answer": answers.gather(1, last)[:, 0],
            "roles": pick,
            "lengths": lengths,
            "extras": {**extras, ANSWER_POSITIONS: query_pos, ANSWERS: answers},
            "trees": None,
        }
    order = query_pos.argsort(dim=1)  # probes of a document in the order its queries come

    def flat(x: torch.Tensor) -> torch.Tensor:
        return x.gather(1, order).reshape(-1)

    lengths = flat(query_pos) + 1
    docs = torch.arange(n).repeat_interleave(q)
    return {
        "tokens": _padded(tokens[docs], lengths),
        "answer": flat(answers),
        "roles": {name: flat(pos) for name, pos in roles.items()},
        "lengths": lengths,
        "extras": {
            **{name: v.repeat_interleave(q) for name, v in extras.items()},
            "document": docs,
            "query_index": torch.arange(q).repeat(n),
        },
        "trees": None,
    }


def _padded(tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Rows cut to their lengths: pad ids after each, the width the longest's."""
    width = int(lengths.max()) if len(lengths) else 1
    out = tokens[:, :width].clone()
    out[torch.arange(width)[None, :] >= lengths[:, None]] = 0
    return out


def fillers(gen: torch.Generator, shape: tuple[int, ...], n_ids: int) -> torch.Tensor:
    """Random fillers: uniform over the task's ``n_ids`` ids (zoology's random_non_queries)."""
    return torch.randint(n_ids, shape, generator=gen) + N_SPECIAL


def rows_of(split: str, documents: int, queries: int) -> int:
    """Rows of a split of ``documents`` documents: one each in train, one per query else."""
    return documents if split == "train" else documents * queries


# --------------------------------------------------------------------------------- generator


def generate_mqar(cfg: MQARConfig, split: str, n: int, shared: None = None) -> dict:
    """``n`` documents of ``split`` as the rows of a TaskDataset (see :func:`split_rows`)."""
    gen = torch_generator(cfg.seed, SPLIT_IDS[split], 0x3A4)
    p, q = cfg.n_pairs, cfg.queries
    keys = distinct_rows(gen, n, p, cfg.n_keys)
    values = distinct_rows(gen, n, p, cfg.n_values)
    # Which pairs are queried: all of them (zoology), or q distinct ones, uniformly.
    asked = torch.rand(n, p, generator=gen).argsort(dim=1)[:, :q] if q < p else None
    if asked is None:
        asked = torch.arange(p).expand(n, p)
    space = (cfg.seq_len - 2 * p) // 2
    slots = draw_slots(gen, n, space, q, cfg.power_a)

    context_end = 1 + 2 * p
    width = 1 + cfg.seq_len
    tokens = fillers(gen, (n, width), cfg.n_keys + cfg.n_values)
    tokens[:, 0] = BOS
    pairs = torch.stack([key_id(cfg, keys), value_id(cfg, values)], dim=2)
    tokens[:, 1:context_end] = pairs.reshape(n, 2 * p)
    query_pos = context_end + 2 * slots
    tokens.scatter_(1, query_pos, key_id(cfg, keys.gather(1, asked)))
    key_pos = 1 + 2 * asked
    roles = {
        "key": key_pos,
        "value": key_pos + 1,
        "next_key": key_pos + 2,
        "query": query_pos,
    }
    answers = value_id(cfg, values.gather(1, asked))
    return split_rows(split, tokens, query_pos, answers, roles)


def describe(ds: TaskDataset, i: int) -> str:
    if "document" not in ds.extras:
        return f"  ({ds.extras['answers'].shape[1]} queries, this one the last)"
    return (
        f"  (document {int(ds.extras['document'][i])}, query "
        f"{int(ds.extras['query_index'][i]) + 1} of {ds.cfg.queries})"
    )


def stats(ds: TaskDataset) -> dict[str, torch.Tensor]:
    roles = ds.roles
    out = {
        "key-query distance": roles["query"] - roles["key"],
        "query slot (from the region's start)": (roles["query"] - 1 - 2 * ds.cfg.n_pairs) // 2,
    }
    if ANSWER_POSITIONS in ds.extras:
        out["queries per document"] = torch.full((len(ds),), ds.extras[ANSWERS].shape[1])
    return out


# --------------------------------------------------------------------------------- presets
# quick: AR's quick vocabulary and model (16 keys, 16 values, d 64, 2 layers, init_std 0.1)
# with 4 pairs, 4 queries and 8 query slots (seq_len 24), one epoch of 100,032 documents;
# measured in docs/tasks.md.
PRESETS = {
    "paper": {
        "task": {"kind": "mqar"},
        "model": {"d_model": 64, "n_layers": 2},
        "training": {"lr": 1e-3, "batch_size": 32, "epochs": 16},
    },
    "quick": {
        "task": {"kind": "mqar", "n_keys": 16, "n_values": 16, "n_pairs": 4, "seq_len": 24},
        "model": {"d_model": 64, "n_layers": 2, "init_std": 0.1},
        "training": {"lr": 1e-3, "batch_size": 32, "epochs": 1, "eval_every": 250},
    },
    "tiny": {
        "task": {
            "kind": "mqar",
            "n_keys": 8,
            "n_values": 8,
            "n_pairs": 2,
            "seq_len": 10,
            "n_train": 640,
            "n_dev": 32,
            "n_test": 32,
        },
        "model": {"d_model": 16, "n_layers": 2, "init_std": 0.1},
        "training": {"steps": 40, "batch_size": 16, "eval_every": 20, "lr": 3e-3},
    },
}


def answer_candidates(cfg: MQARConfig, batch: Batch, vocab_size: int) -> torch.Tensor:
    """The values of each document's pairs (before the query region), as for AR."""
    lo, hi = value_id(cfg, 0), value_id(cfg, cfg.n_values)
    return present_ids(batch, lo, hi, vocab_size, end=1 + 2 * cfg.n_pairs)


TASK = Task(
    kind="mqar",
    label="MQAR",
    config=MQARConfig,
    generate=generate_mqar,
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
    answer_candidates=answer_candidates,
    shared_roles=("key", "value", "next_key", "query"),
    split_rows=lambda cfg, split: rows_of(split, cfg.split_size(split), cfg.queries),
)
