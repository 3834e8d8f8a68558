"""Datasets: caching, batching, config errors."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from mecheval.errors import ConfigError, validate
from mecheval.io import atomic_save_safetensors
from mecheval.tasks import (
    ROLES,
    ARConfig,
    ATRConfig,
    Batch,
    build_datasets,
    cache_path,
    parse_task,
)
from mecheval.tasks import dataset as dataset_mod

AR = ARConfig(n_keys=32, n_values=32, n_pairs=6, min_pairs=3, n_train=200, n_dev=20, n_test=20)
ATR = ATRConfig(n_train=200, n_dev=20, n_test=20)


def _same(a, b):
    for s in ("train", "dev", "test"):
        for name, t in a[s].tensors().items():
            assert torch.equal(t, b[s].tensors()[name]), (s, name)


@pytest.mark.parametrize("cfg", [AR, ATR], ids=["ar", "atr"])
def test_cache_reload_equals_build(cfg, tmp_path, monkeypatch):
    built = build_datasets(cfg, cache_dir=tmp_path)
    path = cache_path(cfg, tmp_path)
    assert path.exists() and path.suffix == ".safetensors"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left behind

    def fail(_cfg):
        raise AssertionError("rebuilt although the cache is valid")

    monkeypatch.setattr(dataset_mod, "_generate", fail)
    loaded = build_datasets(cfg, cache_dir=tmp_path)
    _same(built, loaded)
    if cfg.kind == "atr":
        assert loaded["train"].trees.rule_list(0) == built["train"].trees.rule_list(0)
        # Each expansion's head is drawn at sampling time, so the cache must carry it.
        assert "trees.heads" in loaded["train"].tensors()
        assert loaded["train"].trees.head_list(0) == built["train"].trees.head_list(0)


def test_atr_cache_without_heads_is_rebuilt(tmp_path):
    # A file of the same config but without per-expansion heads (as before they were drawn
    # per expansion) is not trusted, even under the current format version and hash.
    built = build_datasets(ATR, cache_dir=tmp_path)
    path = cache_path(ATR, tmp_path)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    tensors = {k: v for k, v in load_file(str(path)).items() if not k.endswith("trees.heads")}
    atomic_save_safetensors(path, tensors, metadata=meta)
    assert dataset_mod._load(ATR, path) is None
    _same(built, build_datasets(ATR, cache_dir=tmp_path))
    assert dataset_mod._load(ATR, path) is not None


def test_truncated_cache_is_rebuilt(tmp_path):
    built = build_datasets(AR, cache_dir=tmp_path)
    path = cache_path(AR, tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    again = build_datasets(AR, cache_dir=tmp_path)
    _same(built, again)
    assert len(path.read_bytes()) == len(data)  # rewritten whole
    assert dataset_mod._load(AR, path) is not None


def test_cache_of_another_config_is_not_trusted(tmp_path):
    other = AR.model_copy(update={"seed": 9})
    build_datasets(other, cache_dir=tmp_path)
    # A file of another config under this config's name: rebuilt, not loaded.
    cache_path(other, tmp_path).replace(cache_path(AR, tmp_path))
    _same(build_datasets(AR), build_datasets(AR, cache_dir=tmp_path))


def test_batches_trim_padding_and_cover_everything():
    ds = build_datasets(ATR)["train"]
    assert ds.tokens.dtype == torch.long and ds.tokens.shape[1] == int(ds.lengths.max())
    seen = []
    for b in ds.iter_batches(32, shuffle=True, generator=torch.Generator().manual_seed(0)):
        assert isinstance(b, Batch) and set(b.roles) == set(ROLES)
        assert b.tokens.shape[1] == int(b.lengths.max())
        assert (b.roles["query"] == b.lengths - 1).all()
        assert torch.equal(b.padding_mask.sum(1), b.lengths)
        assert "qtype" in b.extras
        seen.append(b)
    assert sum(len(b) for b in seen) == len(ds)
    assert [len(b) for b in ds.iter_batches(64, shuffle=False, drop_last=True)] == [64, 64, 64]
    first = next(ds.iter_batches(8, shuffle=False))
    assert torch.equal(first.answer, ds.answer[:8])
    g = torch.Generator().manual_seed(1)
    a = [b.answer for b in ds.iter_batches(50, shuffle=True, generator=g)]
    g = torch.Generator().manual_seed(1)
    b = [b.answer for b in ds.iter_batches(50, shuffle=True, generator=g)]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_task_config_by_kind():
    assert isinstance(parse_task({"kind": "ar"}), ARConfig)
    assert isinstance(parse_task({"kind": "atr", "query": "sibling"}), ATRConfig)
    with pytest.raises(ConfigError, match=r"task\.kind: unknown 'xyz' \(expected one of: ar, atr"):
        parse_task({"kind": "xyz"})
    with pytest.raises(ConfigError, match=r"task\.kind: missing"):
        parse_task({"n_train": 3})


@pytest.mark.parametrize(
    ("cls", "data", "field"),
    [
        (ARConfig, {"n_keys": 8, "n_pairs": 9}, "task.n_pairs"),
        (ARConfig, {"n_values": 4, "n_pairs": 5}, "task.n_pairs"),
        (ARConfig, {"min_pairs": 17}, "task.min_pairs"),
        (ARConfig, {"split_pairs": 1e-9}, "task.split_pairs"),
        (ARConfig, {"split_pairs": 1.5}, "task.split_pairs"),
        (ARConfig, {"n_pairs": 0}, "task.n_pairs"),
        (ARConfig, {"n_keyz": 3}, "task.n_keyz"),
        (ATRConfig, {"max_rhs": 1}, "task.max_rhs"),
        (ATRConfig, {"max_depth": 0}, "task.max_depth"),
        (ATRConfig, {"query": "cousin"}, "task.query"),
        (ATRConfig, {"split": 0.001}, "task.split"),
        (ATRConfig, {"head": "middle"}, "task.head"),
        (ATRConfig, {"n_terminals": 1}, "task.n_terminals"),
    ],
)
def test_bad_configs_give_one_line_errors(cls, data, field):
    with pytest.raises(ConfigError) as info:
        validate(cls, data, prefix="task")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(field + ":")


def test_typical_batch_length_is_the_median_padded_width_of_training_batches():
    from mecheval.tasks.atr import TYPICAL_BATCHES

    cfg = ATRConfig(n_train=TYPICAL_BATCHES * 8, n_dev=8, n_test=8)
    lengths = build_datasets(cfg)["train"].lengths
    widths = lengths.view(TYPICAL_BATCHES, 8).amax(1)
    assert cfg.typical_length(8) == int(widths.median())
    assert cfg.typical_length(8) < cfg.max_length() // 4  # not the longest possible
    ar = ARConfig(n_pairs=5)
    assert ar.typical_length(8) == ar.max_length()
