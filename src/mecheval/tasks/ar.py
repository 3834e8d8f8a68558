"""Associative recall documents (§4.1, App. C), generated with whole-tensor operations.

A document is ``<bos> k1 v1 ... kn vn <div> q`` with answer ``a``: ``q`` is one of the
document's keys, drawn uniformly, and ``a`` the value right after it. Keys are distinct
within a document, and so are values; key and value vocabularies are disjoint.

Roles: key = the in-context position of the queried key, value = key + 1, next_key =
value + 1 (for the last pair this is the divider), divider, query = last position.

With ``min_pairs`` < ``n_pairs`` the number of pairs is uniform in min_pairs..n_pairs per
document and documents are right-padded. With ``split_pairs`` = f, round(f·|K|·|V|)
(key, value) pairs (seeded by ``seed``) are held out: a test document's queried pair is
held out, a train or dev document's never is; unqueried pairs are not restricted.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

from mecheval.errors import ConfigError
from mecheval.tasks.base import SPLIT_IDS, check_split, held_out_fraction, torch_generator
from mecheval.tasks.batch import Batch
from mecheval.tasks.documents import Documents
from mecheval.tasks.family import KeyValueConfig, at_most_pairs, distinct_rows, pair_roles
from mecheval.tasks.vocab import BOS, DIV


class ARConfig(KeyValueConfig):
    """Associative recall: ``<bos> k1 v1 ... kn vn <div> q`` → the value after key ``q``."""

    label = "AR"
    preset_fields = {
        # Measured on a 2-core CPU (docs/quick-preset.md): the paper's recipe and document
        # format on a small AR task for one epoch of the paper's 100,032 documents.
        "quick": {"n_keys": 16, "n_values": 16, "n_pairs": 4},
        "tiny": {"n_keys": 8, "n_values": 8, "n_pairs": 2},
    }

    kind: Literal["ar"] = "ar"
    n_keys: int = Field(
        4096, ge=1, description="key vocabulary (paper: |Σ| = 8192 = keys + values)"
    )
    n_values: int = Field(4096, ge=1, description="value vocabulary, disjoint from the keys")
    n_pairs: int = Field(
        16,
        ge=1,
        description=(
            "key-value pairs per document. The paper's text says 32 pairs, but its released "
            "code draws L/2 pairs for context length L = 32, i.e. 16 pairs = 32 tokens; we "
            "follow the code"
        ),
    )
    min_pairs: int | None = Field(
        None, ge=1, description="fewest pairs when lengths vary (default: n_pairs, fixed length)"
    )
    split_pairs: float | None = held_out_fraction(
        "fraction of (key, value) pairs held out: only test documents query them"
    )

    @field_validator("min_pairs")
    @classmethod
    def _min_fits(cls, v: int | None, info: ValidationInfo) -> int | None:
        return at_most_pairs(v, info)

    @field_validator("split_pairs")
    @classmethod
    def _split_leaves_both(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is None or "n_keys" not in info.data or "n_values" not in info.data:
            return v
        check_split(v, info.data["n_keys"] * info.data["n_values"], "(key, value)")
        return v

    @property
    def pairs_min(self) -> int:
        return self.n_pairs if self.min_pairs is None else self.min_pairs

    def max_length(self) -> int:
        return 1 + 2 * self.n_pairs + 2  # <bos> pairs <div> q

    def generate(self, split: str, n: int, shared: None = None) -> Documents:
        return generate_ar(self, split, n)

    def check_train_queries(self, n_queries: int) -> int:
        """Extra queries need fixed-length documents and distinct keys to ask; each adds its
        predecessor's answer and itself."""
        if self.min_pairs not in (None, self.n_pairs):
            raise ConfigError(
                "training.train_queries: extra queries need fixed-length documents "
                "(task.min_pairs unset)"
            )
        if n_queries > self.n_pairs:
            raise ConfigError(
                f"training.train_queries: {n_queries} exceeds task.n_pairs={self.n_pairs}"
            )
        return 2 * (n_queries - 1)

    def extend_queries(
        self, batch: Batch, n_queries: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return extend_queries(batch, n_queries, generator)


def held_out_pairs(cfg: ARConfig) -> torch.Tensor | None:
    """[n_keys, n_values] bool, True at held-out (key, value) pairs; None without a split."""
    if cfg.split_pairs is None:
        return None
    total = cfg.n_keys * cfg.n_values
    gen = torch_generator(cfg.seed, 0x5B17)
    held = torch.zeros(total, dtype=torch.bool)
    held[torch.randperm(total, generator=gen)[: round(cfg.split_pairs * total)]] = True
    return held.view(cfg.n_keys, cfg.n_values)


def _enforce_split(
    gen: torch.Generator,
    cfg: ARConfig,
    keys: torch.Tensor,
    values: torch.Tensor,
    qi: torch.Tensor,
    held: torch.Tensor,
    want: bool,
) -> None:
    """Redraw the queried pair, in place, until it is held out iff ``want``."""
    rows = torch.arange(len(keys))
    for _ in range(100_000):
        qk, qv = keys[rows, qi], values[rows, qi]
        # A redrawn key/value must stay distinct within its document (it may equal itself).
        dup = ((keys == qk[:, None]).sum(1) > 1) | ((values == qv[:, None]).sum(1) > 1)
        bad = (held[qk, qv] != want) | dup
        if not bool(bad.any()):
            return
        idx = rows[bad]
        keys[idx, qi[idx]] = torch.randint(cfg.n_keys, (len(idx),), generator=gen)
        values[idx, qi[idx]] = torch.randint(cfg.n_values, (len(idx),), generator=gen)
    raise RuntimeError("AR: split_pairs left too few pairs to draw queries from")


def generate_ar(cfg: ARConfig, split: str, n: int) -> Documents:
    """``n`` documents of ``split``."""
    gen = torch_generator(cfg.seed, SPLIT_IDS[split], 0xA5)
    p = cfg.n_pairs
    keys = distinct_rows(gen, n, p, cfg.n_keys)
    values = distinct_rows(gen, n, p, cfg.n_values)
    if cfg.pairs_min < p:
        n_doc = torch.randint(cfg.pairs_min, p + 1, (n,), generator=gen)
    else:
        n_doc = torch.full((n,), p, dtype=torch.long)
    qi = (torch.rand(n, generator=gen) * n_doc).long().clamp_max(n_doc - 1)
    held = held_out_pairs(cfg)
    if held is not None and n:
        _enforce_split(gen, cfg, keys, values, qi, held, want=split == "test")

    rows = torch.arange(n)
    width = 2 * p + 3
    tokens = torch.zeros(n, width, dtype=torch.long)
    tokens[:, 0] = BOS
    pairs = torch.stack([cfg.key_id(keys), cfg.value_id(values)], dim=2)
    tokens[:, 1 : 1 + 2 * p] = pairs.reshape(n, 2 * p)
    divider = 1 + 2 * n_doc
    steps = torch.arange(width)
    tokens[steps[None, :] >= divider[:, None]] = 0  # pad beyond a short document's pairs
    tokens[rows, divider] = DIV
    query_key = keys[rows, qi]
    tokens[rows, divider + 1] = cfg.key_id(query_key)
    lengths = divider + 2
    roles = {
        **pair_roles(qi),
        "divider": divider,
        "query": divider + 1,
    }
    t = int(lengths.max()) if n else 1
    return Documents(
        tokens=tokens[:, :t].contiguous(),
        answer=cfg.value_id(values[rows, qi]),
        roles=roles,
        lengths=lengths,
    )


# ----------------------------------------------------------------- extra training queries


def extend_queries(
    batch: Batch, n_queries: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AR documents ``<bos> k1 v1 .. kp vp <div> q1`` -> ``... <div> q1 a1 q2 a2 .. qQ``.

    q1 is the document's own query; q2..qQ are other keys of the same document, distinct,
    drawn with ``generator``. Returns (tokens [B, T + 2(Q-1)], query positions [Q],
    answers [B, Q]). Needs fixed-length documents (one divider position for the batch).
    """
    tokens, divider = batch.tokens, batch.roles["divider"]
    d = int(divider[0])
    if not bool((divider == d).all()) or (d - 1) % 2 or tokens.shape[1] != d + 2:
        raise ValueError("extend_queries: needs fixed-length AR documents")
    b, pairs = tokens.shape[0], (d - 1) // 2
    if n_queries > pairs:
        raise ValueError(f"extend_queries: {n_queries} queries but only {pairs} pairs")
    keys, values = tokens[:, 1:d:2], tokens[:, 2:d:2]
    own = (batch.roles["key"] - 1) // 2
    # A random order of the other pairs: sort random scores with the own pair forced last.
    scores = torch.rand(b, pairs, generator=generator).to(tokens.device)
    scores[torch.arange(b), own] = 2.0
    others = scores.argsort(dim=1)[:, : n_queries - 1]
    order = torch.cat([own[:, None], others], dim=1)  # [B, Q]
    rows = torch.arange(b, device=tokens.device)[:, None]
    queries, answers = keys[rows, order], values[rows, order]
    if not torch.equal(queries[:, 0], tokens[:, d + 1]) or not torch.equal(
        answers[:, 0], batch.answer
    ):
        raise ValueError("extend_queries: documents do not have the AR layout")
    # Interleave a1 q2 a2 q3 ... qQ after the original query (the last answer is the target).
    tail = torch.stack([answers[:, :-1], queries[:, 1:]], dim=2).reshape(b, -1)
    positions = d + 1 + 2 * torch.arange(n_queries, device=tokens.device)
    return torch.cat([tokens, tail], dim=1), positions, answers
