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

from typing import TYPE_CHECKING, ClassVar, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

from mecheval.tasks.base import SPLIT_IDS, out_of_range, torch_generator
from mecheval.tasks.batch import ANSWER_POSITIONS, ANSWERS
from mecheval.tasks.documents import Documents
from mecheval.tasks.family import (
    ARFamilyConfig,
    KeyValueConfig,
    at_most_pairs,
    distinct_rows,
    pair_roles,
)
from mecheval.tasks.vocab import BOS, N_SPECIAL


class MultiQueryConfig(ARFamilyConfig):
    """What MQAR and compositional MQAR share: N pairs, then a query region of two-token (or
    ``tokens_per_key`` + 1) slots of which Q hold the queries; train rows are whole documents,
    dev and test rows one probe per query; no divider."""

    shared_roles = ("key", "value", "next_key", "query")
    #: tokens of a key: a pair, and a query slot, is a key and one more token
    tokens_per_key: ClassVar[int] = 1

    if TYPE_CHECKING:  # fields of every subclass
        n_pairs: int
        n_queries: int | None
        seq_len: int
        power_a: float

    @field_validator("n_queries", check_fields=False)
    @classmethod
    def _queries_fit(cls, v: int | None, info: ValidationInfo) -> int | None:
        return at_most_pairs(v, info, "queries ask distinct keys")

    @field_validator("seq_len", check_fields=False)
    @classmethod
    def _room_for_queries(cls, v: int, info: ValidationInfo) -> int:
        """Room for the pairs and one query slot per query."""
        pairs = info.data.get("n_pairs")
        if pairs is None or "n_queries" not in info.data:
            return v
        queries = info.data["n_queries"] or pairs
        slot = cls.tokens_per_key + 1
        need = slot * (pairs + queries)
        if v < need:
            raise out_of_range(
                f"too short for {pairs} pairs and {queries} queries: allowed >= {need} "
                f"({slot} n_pairs + {slot} n_queries)",
                v,
            )
        return v

    @property
    def queries(self) -> int:
        return self.n_pairs if self.n_queries is None else self.n_queries

    @property
    def slot_width(self) -> int:
        return self.tokens_per_key + 1

    @property
    def space(self) -> int:
        """Query slots in the region after the pairs."""
        return (self.seq_len - self.slot_width * self.n_pairs) // self.slot_width

    def context_end(self) -> int:
        return 1 + self.slot_width * self.n_pairs

    def max_length(self) -> int:
        # A query's slot starts at a multiple of the slot width below the region's end; the
        # last slot's query (its last key token) is at most here.
        return self.context_end() + self.slot_width * (self.space - 1) + self.tokens_per_key

    def split_rows(self, split: str) -> int:
        return rows_of(split, self.split_size(split), self.queries)

    def describe(self, documents: Documents, i: int) -> str:
        return describe_row(documents, i, self.queries)

    def stats(self, documents: Documents) -> dict[str, torch.Tensor]:
        roles = documents.roles
        start = roles["query"] - self.tokens_per_key + 1 - self.context_end()
        out = {
            "key-query distance": roles["query"] - roles["key"],
            "query slot (from the region's start)": start // self.slot_width,
        }
        if ANSWER_POSITIONS in documents.extras:
            queries = documents.extras[ANSWERS].shape[1]
            out["queries per document"] = torch.full((len(documents),), queries)
        return out


class MQARConfig(MultiQueryConfig, KeyValueConfig):
    """MQAR: N pairs, then Q power-law-placed queries among random fillers → each query's
    value (zoology's ``multiquery_ar``)."""

    label = "MQAR"
    preset_fields = {
        # AR's quick vocabulary and model with 4 pairs, 4 queries and 8 query slots (seq_len
        # 24), one epoch of 100,032 documents; measured in docs/tasks.md.
        "quick": {"n_keys": 16, "n_values": 16, "n_pairs": 4, "seq_len": 24},
        "tiny": {
            "n_keys": 8,
            "n_values": 8,
            "n_pairs": 2,
            "seq_len": 10,
            "n_dev": 32,
            "n_test": 32,
        },
    }

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

    def generate(self, split: str, n: int, shared: None = None) -> Documents:
        return generate_mqar(self, split, n)


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
) -> Documents:
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
        return Documents(
            tokens=_padded(tokens, lengths),
            answer=answers.gather(1, last)[:, 0],
            roles=pick,
            lengths=lengths,
            extras={**extras, ANSWER_POSITIONS: query_pos, ANSWERS: answers},
        )
    order = query_pos.argsort(dim=1)  # probes of a document in the order its queries come

    def flat(x: torch.Tensor) -> torch.Tensor:
        return x.gather(1, order).reshape(-1)

    lengths = flat(query_pos) + 1
    docs = torch.arange(n).repeat_interleave(q)
    return Documents(
        tokens=_padded(tokens[docs], lengths),
        answer=flat(answers),
        roles={name: flat(pos) for name, pos in roles.items()},
        lengths=lengths,
        extras={
            **{name: v.repeat_interleave(q) for name, v in extras.items()},
            "document": docs,
            "query_index": torch.arange(q).repeat(n),
        },
    )


def describe_row(documents: Documents, i: int, queries: int) -> str:
    """``task show``'s note on a row of :func:`split_rows`: a training document's queries, or
    which document and query a probe is."""
    if "document" not in documents.extras:
        return f"  ({documents.extras[ANSWERS].shape[1]} queries, this one the last)"
    return (
        f"  (document {int(documents.extras['document'][i])}, query "
        f"{int(documents.extras['query_index'][i]) + 1} of {queries})"
    )


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


def generate_mqar(cfg: MQARConfig, split: str, n: int) -> Documents:
    """``n`` documents of ``split`` as dataset rows (see :func:`split_rows`)."""
    gen = torch_generator(cfg.seed, SPLIT_IDS[split], 0x3A4)
    p, q = cfg.n_pairs, cfg.queries
    keys = distinct_rows(gen, n, p, cfg.n_keys)
    values = distinct_rows(gen, n, p, cfg.n_values)
    # Which pairs are queried: all of them (zoology), or q distinct ones, uniformly.
    asked = torch.rand(n, p, generator=gen).argsort(dim=1)[:, :q] if q < p else None
    if asked is None:
        asked = torch.arange(p).expand(n, p)
    slots = draw_slots(gen, n, cfg.space, q, cfg.power_a)

    context_end = cfg.context_end()
    width = 1 + cfg.seq_len
    tokens = fillers(gen, (n, width), cfg.n_keys + cfg.n_values)
    tokens[:, 0] = BOS
    pairs = torch.stack([cfg.key_id(keys), cfg.value_id(values)], dim=2)
    tokens[:, 1:context_end] = pairs.reshape(n, 2 * p)
    query_pos = context_end + 2 * slots
    tokens.scatter_(1, query_pos, cfg.key_id(keys.gather(1, asked)))
    roles = {**pair_roles(asked), "query": query_pos}
    answers = cfg.value_id(values.gather(1, asked))
    return split_rows(split, tokens, query_pos, answers, roles)
