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

import numpy as np
import torch

from mecheval.tasks.config import ARConfig
from mecheval.tasks.vocab import BOS, DIV, N_SPECIAL

SPLIT_IDS = {"train": 0, "dev": 1, "test": 2}
_CHUNK = 4096


def _generator(*entropy: int) -> torch.Generator:
    seed = int(np.random.SeedSequence(list(entropy)).generate_state(1, dtype=np.uint64)[0])
    return torch.Generator().manual_seed(seed & ((1 << 63) - 1))


def _has_duplicate(rows: torch.Tensor) -> torch.Tensor:
    s = rows.sort(dim=1).values
    return (s[:, 1:] == s[:, :-1]).any(dim=1)


def distinct_rows(gen: torch.Generator, n: int, k: int, m: int) -> torch.Tensor:
    """[n, k] long, each row k distinct ints from 0..m-1, uniformly over such rows."""
    if k * k <= 2 * m:
        # Few collisions (birthday bound): draw with replacement and redraw bad rows.
        out = torch.randint(m, (n, k), generator=gen)
        bad = _has_duplicate(out)
        while bool(bad.any()):
            out[bad] = torch.randint(m, (int(bad.sum()), k), generator=gen)
            bad = _has_duplicate(out)
        return out
    # Dense case: the k largest of m uniforms are a uniform random k-subset in random order.
    parts = [
        torch.rand(min(_CHUNK, n - i), m, generator=gen).topk(k, dim=1).indices
        for i in range(0, n, _CHUNK)
    ]
    return torch.cat(parts) if parts else torch.zeros(0, k, dtype=torch.long)


def held_out_pairs(cfg: ARConfig) -> torch.Tensor | None:
    """[n_keys, n_values] bool, True at held-out (key, value) pairs; None without a split."""
    if cfg.split_pairs is None:
        return None
    total = cfg.n_keys * cfg.n_values
    gen = _generator(cfg.seed, 0x5B17)
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


def generate_ar(cfg: ARConfig, split: str, n: int) -> dict:
    """``n`` documents of ``split`` as tensors for TaskDataset."""
    gen = _generator(cfg.seed, SPLIT_IDS[split], 0xA5)
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
    pairs = torch.stack([keys + N_SPECIAL, values + N_SPECIAL + cfg.n_keys], dim=2)
    tokens[:, 1 : 1 + 2 * p] = pairs.reshape(n, 2 * p)
    divider = 1 + 2 * n_doc
    steps = torch.arange(width)
    tokens[steps[None, :] >= divider[:, None]] = 0  # pad beyond a short document's pairs
    tokens[rows, divider] = DIV
    query_key = keys[rows, qi]
    tokens[rows, divider + 1] = query_key + N_SPECIAL
    lengths = divider + 2
    key_pos = 1 + 2 * qi
    roles = {
        "key": key_pos,
        "value": key_pos + 1,
        "next_key": key_pos + 2,
        "divider": divider,
        "query": divider + 1,
    }
    t = int(lengths.max()) if n else 1
    return {
        "tokens": tokens[:, :t].contiguous(),
        "answer": values[rows, qi] + N_SPECIAL + cfg.n_keys,
        "roles": roles,
        "lengths": lengths,
        "extras": {},
        "trees": None,
    }
