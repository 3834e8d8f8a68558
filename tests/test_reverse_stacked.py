"""Reverse AR (tasks/reverse_ar.py) and stacked MQAR (tasks/stacked_mqar.py): every document
against a naive reading of its tokens, corruption against the one token (stacked MQAR: the
one key inside a pair token) it may change, the answer candidates against the context, the
impossible parameters, and the intervention that causality makes empty (reverse AR's value
comes before the key, so restoring it recovers nothing)."""

from __future__ import annotations

import pytest
import torch

from mecheval.errors import ConfigError
from mecheval.tasks import SPLITS, build_datasets, corrupt, parse_task
from mecheval.tasks.ar import ARConfig
from mecheval.tasks.reverse_ar import ReverseARConfig
from mecheval.tasks.stacked_mqar import StackedMQARConfig
from mecheval.tasks.vocab import BOS, DIV

SIZES = {"n_train": 120, "n_dev": 30, "n_test": 30}


def reverse_cfg(**kw) -> ReverseARConfig:
    return ReverseARConfig(**{"n_keys": 12, "n_values": 10, "n_pairs": 5, **SIZES, **kw})


def stacked_cfg(**kw) -> StackedMQARConfig:
    return StackedMQARConfig(**{"n_keys": 9, "n_values": 7, "n_pairs": 5, **SIZES, **kw})


def names(cfg, ids) -> list[str]:
    table = cfg.id_names()
    return [table[int(i)] for i in ids]


# ------------------------------------------------------------------------------ reverse AR


@pytest.mark.parametrize("min_pairs", [None, 2])
@pytest.mark.parametrize("split", SPLITS)
def test_reverse_ar_by_a_naive_reading(split: str, min_pairs: int | None) -> None:
    cfg = reverse_cfg(min_pairs=min_pairs)
    ds = build_datasets(cfg)[split]
    for i in range(len(ds)):
        n = int(ds.lengths[i])
        doc = names(cfg, ds.tokens[i, :n])
        assert doc[0] == "<bos>" and doc[-2] == "<div>" and int(ds.tokens[i, n - 2]) == DIV
        context = doc[1:-2]
        pairs = [(context[j], context[j + 1]) for j in range(0, len(context), 2)]
        # value first, then its key; keys distinct, values distinct
        assert all(v[0] == "v" and k[0] == "k" for v, k in pairs), doc
        assert len({k for _, k in pairs}) == len(pairs) == len({v for v, _ in pairs})
        answer_of = {k: v for v, k in pairs}
        query = doc[-1]
        assert names(cfg, [ds.answer[i]]) == [answer_of[query]]
        roles = {r: int(p[i]) for r, p in ds.roles.items()}
        assert doc[roles["key"]] == query and roles["query"] == n - 1
        assert roles["value"] == roles["key"] - 1 and roles["next_key"] == roles["key"] + 1
        assert doc[roles["value"]] == answer_of[query] and roles["divider"] == n - 2
        assert bool((ds.tokens[i, n:] == 0).all())  # right padding


def test_reverse_ar_is_ar_with_each_pair_swapped() -> None:
    """The same seed draws the same pairs and queries as AR: the generator only reorders."""
    data = {"n_keys": 12, "n_values": 10, "n_pairs": 5, "min_pairs": 3, **SIZES}
    ar = build_datasets(ARConfig(**data))["test"]
    rev = build_datasets(ReverseARConfig(**data))["test"]
    assert torch.equal(ar.answer, rev.answer) and torch.equal(ar.lengths, rev.lengths)
    for i in range(len(ar)):
        n = int(ar.lengths[i])
        a, r = ar.tokens[i, : n - 2].tolist(), rev.tokens[i, : n - 2].tolist()
        assert a[0] == r[0] == BOS
        assert [a[j + 1] for j in range(1, n - 2, 2)] == [r[j] for j in range(1, n - 2, 2)]
        assert [a[j] for j in range(1, n - 2, 2)] == [r[j + 1] for j in range(1, n - 2, 2)]
    assert torch.equal(rev.roles["key"], ar.roles["key"] + 1)


def test_reverse_ar_refuses_extra_training_queries() -> None:
    from mecheval.training.config import config_from_data, resolve
    from mecheval.training.presets import preset

    data = preset("tiny", "reverse_ar")
    data["training"]["train_queries"] = 2
    with pytest.raises(ConfigError) as err:
        resolve(config_from_data(data, ["name=x"]))
    assert "\n" not in str(err.value) and "train_queries" in str(err.value)


def test_reverse_ar_restoring_the_value_recovers_nothing(tmp_path) -> None:
    """The value comes before the corrupted key: a causal model's activations there are the
    same in both runs, so the restore there is the corrupted run at every site."""
    from mecheval.experiments.mechanisms import InterventionPlan, intervene_run
    from mecheval.training.config import config_from_data, resolve
    from mecheval.training.presets import preset
    from mecheval.training.run import train

    cfg = resolve(config_from_data(preset("tiny", "reverse_ar", "mamba"), ["name=m"]))
    assert train(cfg, tmp_path / "m")["state"] == "done"
    measured = intervene_run(tmp_path / "m", InterventionPlan(split="dev"))
    assert measured is not None
    rows = measured.rows[measured.rows.metric == "likelihood"]
    corrupted = float(rows[rows.condition == "corrupted"].value.iloc[0])
    at_value = rows[(rows.condition == "restored") & (rows.role == "value")]
    at_key = rows[(rows.condition == "restored") & (rows.role == "key")]
    assert len(at_value) >= 2 and len(at_key) == len(at_value)
    assert at_value.value.sub(corrupted).abs().max() < 1e-6
    # ...while the corrupted key itself, restored, brings the original back at layer 0
    original = float(rows[rows.condition == "original"].value.iloc[0])
    first = at_key[at_key.site == "layers.0.input"]
    assert abs(float(first.value.iloc[0]) - original) < 1e-6


# --------------------------------------------------------------------------- stacked MQAR


@pytest.mark.parametrize("queries", [None, 3])
@pytest.mark.parametrize("split", SPLITS)
def test_stacked_mqar_by_a_naive_reading(split: str, queries: int | None) -> None:
    cfg = stacked_cfg(n_queries=queries)
    ds = build_datasets(cfg)[split]
    p, q = cfg.n_pairs, cfg.queries
    assert len(ds) == cfg.split_rows(split)
    for i in range(len(ds)):
        n = int(ds.lengths[i])
        doc = names(cfg, ds.tokens[i, :n])
        assert doc[0] == "<bos>" and bool((ds.tokens[i, n:] == 0).all())
        pairs = [tok.split(":") for tok in doc[1 : 1 + p]]
        assert all(len(kv) == 2 and kv[0][0] == "k" and kv[1][0] == "v" for kv in pairs), doc
        assert len({k for k, _ in pairs}) == p == len({v for _, v in pairs})
        value_of = dict(pairs)
        asked = doc[1 + p :]
        assert all(k in value_of for k in asked) and len(set(asked)) == len(asked) <= q
        roles = {r: int(pos[i]) for r, pos in ds.roles.items()}
        assert set(roles) == {"key", "next_key", "query"} and roles["query"] == n - 1
        assert doc[roles["key"]].split(":")[0] == doc[-1]
        assert roles["next_key"] == roles["key"] + 1 and 1 <= roles["key"] <= p
        assert names(cfg, [ds.answer[i]]) == [value_of[doc[-1]]]
        if split == "train":  # every query supervised: its value
            assert len(asked) == q
            positions = ds.extras["answer_positions"][i].tolist()
            assert positions == list(range(1 + p, 1 + p + q))
            assert names(cfg, ds.extras["answers"][i]) == [value_of[k] for k in asked]


def test_stacked_mqar_corruption_changes_only_the_key_inside_the_pair() -> None:
    cfg = stacked_cfg()
    batch = build_datasets(cfg)["dev"].batch(torch.arange(40))
    bad = corrupt(batch, cfg, seed=3)
    rows = torch.arange(40)
    changed = (bad.tokens != batch.tokens).nonzero()
    assert torch.equal(changed[:, 0], rows) and torch.equal(changed[:, 1], batch.roles["key"])
    for b in range(40):
        n = int(batch.lengths[b])
        before, after = names(cfg, batch.tokens[b, :n]), names(cfg, bad.tokens[b, :n])
        key = int(batch.roles["key"][b])
        (k, v), (k2, v2) = before[key].split(":"), after[key].split(":")
        assert v2 == v and k2 != k
        keys = {tok.split(":")[0] for tok in before[1:]}
        assert k2 not in keys  # absent from the probe: the corrupted query has no answer


def test_stacked_mqar_candidates_are_the_values_of_its_pairs() -> None:
    cfg = stacked_cfg()
    ds = build_datasets(cfg)["test"]
    batch = ds.batch(torch.arange(len(ds)))
    mask = cfg.answer_candidates(batch)
    for b in range(len(ds)):
        n = int(batch.lengths[b])
        values = {tok.split(":")[1] for tok in names(cfg, batch.tokens[b, 1 : 1 + cfg.n_pairs])}
        assert set(names(cfg, mask[b].nonzero()[:, 0])) == values
        assert n > cfg.n_pairs


@pytest.mark.parametrize(
    ("kind", "data", "field", "says"),
    [
        ("stacked_mqar", {"n_pairs": 9, "n_keys": 8}, "task.n_pairs", "1..8"),
        ("stacked_mqar", {"n_pairs": 4, "n_queries": 5}, "task.n_queries", "1..n_pairs=4"),
        ("stacked_mqar", {"n_keys": 0}, "task.n_keys", "greater than or equal to 1"),
        ("reverse_ar", {"n_pairs": 5, "min_pairs": 6}, "task.min_pairs", "1..n_pairs=5"),
    ],
)
def test_impossible_parameters(kind: str, data: dict, field: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_task({"kind": kind, **data})
    message = str(err.value)
    assert "\n" not in message and message.startswith(field) and says in message, message


@pytest.mark.parametrize("kind", ["reverse_ar", "stacked_mqar"])
def test_task_show_and_stats(kind: str, monkeypatch, capsys) -> None:
    from small_runs import run_cli

    code, out, _ = run_cli(monkeypatch, capsys, "task", "show", kind, "-n", "2")
    assert code == 0, out
    assert out.count("<bos>") == 2 and "[key:" in out and "[query:" in out
    code, out, _ = run_cli(monkeypatch, capsys, "task", "stats", kind, "-n", "50")
    assert code == 0, out
    assert "key-query distance" in out
    assert ("value-query distance" in out) == (kind == "reverse_ar")
