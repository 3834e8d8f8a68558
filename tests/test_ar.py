"""AR documents: vocabularies, distinctness, answers, roles, split, determinism, corruption."""

from __future__ import annotations

import pytest
import torch

from mecheval.tasks import (
    BOS,
    DIV,
    ARConfig,
    build_datasets,
    corrupt,
)
from mecheval.tasks.ar import held_out_pairs

SMALL = dict(n_keys=64, n_values=48, n_pairs=8, n_train=1000, n_dev=64, n_test=64)


@pytest.fixture(scope="module")
def small():
    cfg = ARConfig(**SMALL)
    return cfg, build_datasets(cfg)


def _key_ids(cfg):
    return 3, 3 + cfg.n_keys


def _value_ids(cfg):
    return 3 + cfg.n_keys, 3 + cfg.n_keys + cfg.n_values


def test_paper_defaults():
    cfg = ARConfig()
    assert (cfg.n_keys, cfg.n_values, cfg.n_pairs) == (4096, 4096, 16)
    assert (cfg.n_train, cfg.n_dev, cfg.n_test) == (100_032, 320, 320)
    assert cfg.vocab_size() == 3 + 8192
    assert cfg.max_length() == 35
    names = cfg.id_names()
    assert len(names) == cfg.vocab_size()
    assert names[:3] == ["<pad>", "<bos>", "<div>"]
    assert names[3] == "k0" and names[3 + 4096] == "v0"


def test_layout_vocabularies_and_answers(small):
    cfg, splits = small
    klo, khi = _key_ids(cfg)
    vlo, vhi = _value_ids(cfg)
    for ds in splits.values():
        t = ds.tokens
        assert t.dtype == torch.long and t.shape == (len(ds), 2 * cfg.n_pairs + 3)
        assert (t[:, 0] == BOS).all()
        keys, values = t[:, 1:-2:2], t[:, 2:-2:2]
        assert ((keys >= klo) & (keys < khi)).all()
        assert ((values >= vlo) & (values < vhi)).all()
        # Distinct keys and distinct values within each document.
        assert (keys.sort(1).values.diff(dim=1) != 0).all()
        assert (values.sort(1).values.diff(dim=1) != 0).all()
        assert (t[:, -2] == DIV).all()
        rows = torch.arange(len(ds))
        r = ds.roles
        q = t[rows, r["query"]]
        assert (r["query"] == t.shape[1] - 1).all() and (ds.lengths == t.shape[1]).all()
        assert (t[rows, r["divider"]] == DIV).all()
        assert (t[rows, r["key"]] == q).all()
        assert (r["key"] % 2 == 1).all() and (r["key"] < r["divider"]).all()
        assert (r["value"] == r["key"] + 1).all() and (r["next_key"] == r["value"] + 1).all()
        assert (t[rows, r["value"]] == ds.answer).all()
        # The answer is the value right after the (only) instance of the query key.
        assert ((keys == q[:, None]).sum(1) == 1).all()
        assert ((ds.answer >= vlo) & (ds.answer < vhi)).all()


def test_query_position_covers_all_pairs(small):
    cfg, splits = small
    slots = (splits["train"].roles["key"] - 1) // 2
    counts = torch.bincount(slots, minlength=cfg.n_pairs)
    assert (counts > 0).all()


def test_determinism_by_seed():
    cfg = ARConfig(**SMALL)
    a, b = build_datasets(cfg), build_datasets(cfg)
    for s in a:
        assert torch.equal(a[s].tokens, b[s].tokens) and torch.equal(a[s].answer, b[s].answer)
    c = build_datasets(ARConfig(**{**SMALL, "seed": 1}))
    assert not torch.equal(a["train"].tokens, c["train"].tokens)
    assert not torch.equal(a["train"].tokens[:64], a["dev"].tokens)


def test_variable_length_padding():
    cfg = ARConfig(**{**SMALL, "min_pairs": 2})
    ds = build_datasets(cfg)["train"]
    n_pairs = (ds.lengths - 3) // 2
    assert int(n_pairs.min()) == 2 and int(n_pairs.max()) == 8
    steps = torch.arange(ds.tokens.shape[1])
    pad = steps[None, :] >= ds.lengths[:, None]
    assert (ds.tokens[pad] == 0).all() and (ds.tokens[~pad] != 0).all()
    rows = torch.arange(len(ds))
    assert (ds.tokens[rows, ds.roles["divider"]] == DIV).all()
    assert (ds.tokens[rows, ds.roles["key"]] == ds.tokens[rows, ds.roles["query"]]).all()
    assert (ds.tokens[rows, ds.roles["value"]] == ds.answer).all()
    b = ds.batch(torch.nonzero(n_pairs == 2).flatten()[:4])
    assert b.tokens.shape[1] == 7  # trimmed to the batch's longest document


def test_dense_draw_uses_every_key():
    cfg = ARConfig(n_keys=10, n_values=12, n_pairs=10, n_train=300, n_dev=1, n_test=1)
    keys = build_datasets(cfg)["train"].tokens[:, 1:-2:2]
    assert (keys.sort(1).values == torch.arange(3, 13)).all()


def test_split_pairs_never_leak():
    cfg = ARConfig(n_keys=8, n_values=8, n_pairs=4, split_pairs=0.25, n_train=600, n_dev=100,
                   n_test=100)  # fmt: skip
    held = held_out_pairs(cfg)
    assert int(held.sum()) == 16
    for name, ds in build_datasets(cfg).items():
        rows = torch.arange(len(ds))
        k = ds.tokens[rows, ds.roles["query"]] - 3
        v = ds.answer - 3 - cfg.n_keys
        assert bool((held[k, v] == (name == "test")).all()), name
        keys, values = ds.tokens[:, 1:-2:2], ds.tokens[:, 2:-2:2]
        assert (keys.sort(1).values.diff(dim=1) != 0).all()
        assert (values.sort(1).values.diff(dim=1) != 0).all()


def test_corrupt_swaps_key_for_an_absent_key(small):
    cfg, splits = small
    b = splits["dev"].batch(torch.arange(64))
    c = corrupt(b, cfg, seed=3)
    changed = c.tokens != b.tokens
    assert (changed.sum(1) == 1).all()
    rows = torch.arange(len(b))
    assert changed[rows, b.roles["key"]].all()
    new = c.tokens[rows, b.roles["key"]]
    klo, khi = _key_ids(cfg)
    assert ((new >= klo) & (new < khi)).all()
    # The new key occurs nowhere else, so the query key has no answer in context any more.
    assert ((c.tokens == new[:, None]).sum(1) == 1).all()
    assert ((c.tokens[:, 1:-2:2] == b.tokens[rows, b.roles["query"]][:, None]).sum(1) == 0).all()
    assert torch.equal(corrupt(b, cfg, seed=3).tokens, c.tokens)
    assert not torch.equal(corrupt(b, cfg, seed=4).tokens, c.tokens)
    assert torch.equal(c.answer, b.answer) and c.roles["key"] is not None


def test_corrupt_when_every_key_is_present():
    cfg = ARConfig(n_keys=4, n_values=4, n_pairs=4, n_train=50, n_dev=1, n_test=1)
    b = build_datasets(cfg)["train"].batch(torch.arange(50))
    c = corrupt(b, cfg, seed=0)
    rows = torch.arange(50)
    assert ((c.tokens != b.tokens).sum(1) == 1).all()
    new = c.tokens[rows, b.roles["key"]]
    assert ((new >= 3) & (new < 7)).all()
