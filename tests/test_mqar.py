"""MQAR and compositional MQAR (tasks/mqar.py, tasks/compositional_mqar.py; issue #14 tasks 1
and 4): every document against a naive reading of its tokens, every probe's roles against the
tokens they name, corruption against the one token it may change, the generators against
their seeds, the power-law slot draws against their exact distribution, and the dense
training loss against one query at a time."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mecheval.errors import ConfigError
from mecheval.tasks import SPLITS, build_datasets, corrupt, parse_task
from mecheval.tasks.compositional_mqar import CompositionalMQARConfig
from mecheval.tasks.mqar import MQARConfig, draw_slots, power_law
from mecheval.tasks.vocab import BOS


def mqar_cfg(**kw) -> MQARConfig:
    base = {"n_keys": 12, "n_values": 10, "n_pairs": 5, "seq_len": 30}
    base.update({"n_train": 200, "n_dev": 30, "n_test": 30})
    base.update(kw)
    return MQARConfig(**base)


def comp_cfg(**kw) -> CompositionalMQARConfig:
    base = {"n_first": 5, "n_last": 4, "n_values": 12, "n_pairs": 4, "seq_len": 40}
    base.update({"n_train": 200, "n_dev": 30, "n_test": 30})
    base.update(kw)
    return CompositionalMQARConfig(**base)


def names(cfg, ids) -> list[str]:
    table = cfg.id_names()
    return [table[int(i)] for i in ids]


# ------------------------------------------------------------------------------------ MQAR


def read_pairs(doc: list[str], n_pairs: int) -> dict[str, str]:
    """The document's key -> value map, read from its first 2N tokens after <bos>."""
    assert doc[0] == "<bos>"
    pairs = [(doc[1 + 2 * j], doc[2 + 2 * j]) for j in range(n_pairs)]
    assert all(k[0] == "k" and v[0] == "v" for k, v in pairs)
    assert len({k for k, _ in pairs}) == n_pairs and len({v for _, v in pairs}) == n_pairs
    return dict(pairs)


@pytest.mark.parametrize("queries", [None, 3])
def test_mqar_training_documents_by_a_naive_reading(queries) -> None:
    cfg = mqar_cfg(n_queries=queries)
    ds = build_datasets(cfg)["train"]
    q = cfg.queries
    assert ds.extras["answer_positions"].shape == (len(ds), q) == ds.extras["answers"].shape
    region = 1 + 2 * cfg.n_pairs
    for i in range(len(ds)):
        doc = names(cfg, ds.document(i))
        kv = read_pairs(doc, cfg.n_pairs)
        positions = ds.extras["answer_positions"][i].tolist()
        asked = [doc[p] for p in positions]
        # Q distinct in-context keys, at even offsets of the query region, each answered by
        # the value that followed it in context.
        assert len(set(asked)) == q and set(asked) <= set(kv)
        assert all(p >= region and (p - region) % 2 == 0 for p in positions)
        assert names(cfg, ds.extras["answers"][i]) == [kv[k] for k in asked]
        # The row ends at its last query, whose roles it carries.
        assert len(doc) == max(positions) + 1
        roles = {r: int(v[i]) for r, v in ds.roles.items()}
        assert roles["query"] == max(positions) and doc[roles["key"]] == doc[roles["query"]]
        assert names(cfg, [ds.answer[i]]) == [kv[doc[-1]]]


def test_mqar_probes_by_a_naive_reading() -> None:
    cfg = mqar_cfg()
    ds = build_datasets(cfg)["dev"]
    q = cfg.n_pairs
    assert len(ds) == cfg.n_dev * q
    assert set(ds.roles) == set(cfg.roles()) == {"key", "value", "next_key", "query"}
    for i in range(len(ds)):
        doc = names(cfg, ds.document(i))
        kv = read_pairs(doc, cfg.n_pairs)
        roles = {r: int(v[i]) for r, v in ds.roles.items()}
        assert roles["query"] == len(doc) - 1 and doc[-1] in kv
        assert doc[roles["key"]] == doc[-1] and roles["key"] < 1 + 2 * cfg.n_pairs
        assert roles["value"] == roles["key"] + 1 and roles["next_key"] == roles["key"] + 2
        assert doc[roles["value"]] == kv[doc[-1]] == names(cfg, [ds.answer[i]])[0]
        assert bool((ds.tokens[i, len(doc) :] == 0).all())  # padded after the query
    # A document's probes: its queries in order, the same document cut at each.
    docs, index = ds.extras["document"], ds.extras["query_index"]
    assert torch.equal(docs, torch.arange(cfg.n_dev).repeat_interleave(q))
    assert torch.equal(index, torch.arange(q).repeat(cfg.n_dev))
    for d in range(cfg.n_dev):
        rows = (docs == d).nonzero().flatten()
        lengths = ds.lengths[rows]
        assert bool((lengths[1:] > lengths[:-1]).all())
        longest = ds.tokens[rows[-1]]
        for r in rows:
            n = int(ds.lengths[r])
            assert torch.equal(ds.tokens[r, :n], longest[:n])
        asked = {int(ds.tokens[r, int(ds.lengths[r]) - 1]) for r in rows}
        assert len(asked) == q  # every pair asked once


def test_mqar_corruption_changes_only_the_key_to_an_absent_key() -> None:
    cfg = mqar_cfg()
    batch = build_datasets(cfg)["dev"].batch(torch.arange(60))
    bad = corrupt(batch, cfg, seed=5)
    rows = torch.arange(60)
    changed = (bad.tokens != batch.tokens).nonzero()
    assert torch.equal(changed[:, 0], rows) and torch.equal(changed[:, 1], batch.roles["key"])
    lo, hi = cfg.key_class()
    new = bad.tokens[rows, batch.roles["key"]]
    assert bool(((new >= lo) & (new < hi)).all())
    real = batch.padding_mask
    absent = ((batch.tokens == new[:, None]) & real).sum(1) == 0
    # Absent from the probe unless every key occurs in it (fillers are random keys too).
    present = torch.stack(
        [torch.isin(torch.arange(lo, hi), batch.tokens[b][real[b]]) for b in range(60)]
    )
    assert bool((absent | present.all(1)).all())


@pytest.mark.parametrize("make", [mqar_cfg, comp_cfg], ids=["mqar", "compositional_mqar"])
def test_a_function_of_its_seed_and_the_cache_keeps_its_rows(make, tmp_path) -> None:
    a, b = build_datasets(make()), build_datasets(make(), tmp_path)
    cached = build_datasets(make(), tmp_path)  # loaded back from the file (rows != documents)
    other = build_datasets(make(seed=3))
    for split in SPLITS:
        for ds in (b[split], cached[split]):
            assert torch.equal(a[split].tokens, ds.tokens)
            assert torch.equal(a[split].answer, ds.answer)
            assert a[split].roles.keys() == ds.roles.keys()
            assert all(torch.equal(a[split].roles[r], ds.roles[r]) for r in a[split].roles)
            assert all(torch.equal(a[split].extras[k], ds.extras[k]) for k in a[split].extras)
    assert not torch.equal(a["train"].tokens, other["train"].tokens)


def test_slots_follow_the_power_law_drawn_without_replacement() -> None:
    """The first slot drawn ~ p; the second ~ sum_i p_i p_j / (1 - p_i) (j != i): zoology's
    sequential ``np.random.choice(replace=False, p=p)``, computed exactly."""
    space, a, n = 6, 0.3, 60_000
    p = power_law(space, a).numpy()
    assert np.allclose(
        p, np.arange(1, space + 1) ** (a - 1) / (np.arange(1, space + 1) ** (a - 1)).sum()
    )
    slots = draw_slots(torch.Generator().manual_seed(0), n, space, 3, a).numpy()
    assert all(len(set(row)) == 3 for row in slots[:1000])
    second = np.array(
        [sum(p[i] * p[j] / (1 - p[i]) for i in range(space) if i != j) for j in range(space)]
    )
    for column, expected in [(0, p), (1, second)]:
        counts = np.bincount(slots[:, column], minlength=space)
        chi2 = ((counts - n * expected) ** 2 / (n * expected)).sum()
        assert chi2 < 25.0, (column, counts, n * expected)  # 5 dof: p < 1e-4 under the law
    # The generator's own documents: the first queried pair's slot follows p as well.
    cfg = mqar_cfg(n_train=8000, n_pairs=3, seq_len=6 + 2 * space, power_a=a)
    train = build_datasets(cfg)["train"]
    region = 1 + 2 * cfg.n_pairs
    first = ((train.extras["answer_positions"][:, 0] - region) // 2).numpy()
    counts = np.bincount(first, minlength=space)
    chi2 = ((counts - 8000 * p) ** 2 / (8000 * p)).sum()
    assert chi2 < 25.0, counts


def test_uniform_power_is_uniform() -> None:
    assert torch.allclose(power_law(7, 1.0), torch.full((7,), 1 / 7, dtype=torch.float64))


# ------------------------------------------------------------------------ compositional MQAR


@pytest.mark.parametrize("split", ["train", "dev"])
def test_compositional_documents_by_a_naive_reading(split: str) -> None:
    cfg = comp_cfg()
    ds = build_datasets(cfg)[split]
    side = math.isqrt(cfg.n_pairs)
    for i in range(len(ds)):
        doc = names(cfg, ds.document(i))
        triples = [tuple(doc[1 + 3 * j : 4 + 3 * j]) for j in range(cfg.n_pairs)]
        assert all(a[0] == "a" and b[0] == "b" and v[0] == "v" for a, b, v in triples)
        firsts, lasts = {t[0] for t in triples}, {t[1] for t in triples}
        # The grid: G first tokens x G last tokens, every combination once, values distinct.
        assert len(firsts) == len(lasts) == side
        assert {(a, b) for a, b, _ in triples} == {(a, b) for a in firsts for b in lasts}
        assert len({v for *_, v in triples}) == cfg.n_pairs
        # Neither key token alone determines the value.
        for a in firsts:
            assert len({v for x, _, v in triples if x == a}) == side
        table = {(a, b): v for a, b, v in triples}
        roles = {r: int(v[i]) for r, v in ds.roles.items()}
        query = (doc[roles["query_first"]], doc[roles["query"]])
        assert roles["query"] == len(doc) - 1 and roles["query_first"] == roles["query"] - 1
        assert (doc[roles["key_first"]], doc[roles["key_last"]]) == query
        assert roles["key_last"] == roles["key_first"] + 1 == roles["key"]
        assert roles["value"] == roles["key_last"] + 1 and roles["next_key"] == roles["value"] + 1
        assert names(cfg, [ds.answer[i]]) == [table[query]] == [doc[roles["value"]]]
        if split == "train":
            for pos, ans in zip(
                ds.extras["answer_positions"][i], ds.extras["answers"][i], strict=True
            ):
                pair = (doc[int(pos) - 1], doc[int(pos)])
                assert names(cfg, [ans]) == [table[pair]]


@pytest.mark.parametrize("which", ["first", "last"])
def test_compositional_corruption_replaces_the_chosen_key_token(which: str) -> None:
    cfg = comp_cfg(corrupt=which)
    ds = build_datasets(cfg)["dev"]
    batch = ds.batch(torch.arange(len(ds)))
    assert torch.equal(batch.roles["key"], batch.roles[f"key_{which}"])
    bad = corrupt(batch, cfg, seed=1)
    rows = torch.arange(len(ds))
    changed = (bad.tokens != batch.tokens).nonzero()
    assert torch.equal(changed[:, 0], rows) and torch.equal(changed[:, 1], batch.roles["key"])
    new = names(cfg, bad.tokens[rows, batch.roles["key"]])
    assert all(t[0] == ("a" if which == "first" else "b") for t in new)
    # The queried combination no longer occurs in the pairs.
    for b in rows.tolist():
        doc = names(cfg, bad.tokens[b, : int(batch.lengths[b])])
        pairs = {(doc[1 + 3 * j], doc[2 + 3 * j]) for j in range(cfg.n_pairs)}
        assert (doc[-2], doc[-1]) not in pairs


# ----------------------------------------------------------------------- both: bad input


@pytest.mark.parametrize(
    ("kind", "data", "field", "says"),
    [
        ("mqar", {"n_pairs": 4, "n_queries": 5}, "task.n_queries", "1..n_pairs=4"),
        ("mqar", {"n_pairs": 8, "seq_len": 30}, "task.seq_len", ">= 32"),
        ("mqar", {"n_pairs": 4, "n_queries": 2, "seq_len": 11}, "task.seq_len", ">= 12"),
        ("mqar", {"power_a": 0}, "task.power_a", "greater than 0"),
        ("mqar", {"power_a": 1.5}, "task.power_a", "less than or equal to 1"),
        ("mqar", {"n_pairs": 9, "n_keys": 8}, "task.n_pairs", "1..8"),
        ("compositional_mqar", {"n_pairs": 5}, "task.n_pairs", "perfect squares"),
        ("compositional_mqar", {"n_pairs": 9, "n_first": 2}, "task.n_pairs", "up to 4"),
        ("compositional_mqar", {"n_pairs": 4, "seq_len": 20}, "task.seq_len", ">= 24"),
        ("compositional_mqar", {"n_pairs": 4, "n_queries": 6}, "task.n_queries", "1..n_pairs=4"),
        ("compositional_mqar", {"corrupt": "middle"}, "task.corrupt", "'first' or 'last'"),
    ],
)
def test_impossible_parameters(kind: str, data: dict, field: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_task({"kind": kind, **data})
    message = str(err.value)
    assert "\n" not in message and message.startswith(field) and says in message, message


# ----------------------------------------------------------------- training and evaluation


def test_dense_loss_is_the_mean_of_one_query_at_a_time() -> None:
    from mecheval.models import ModelConfig, build_model
    from mecheval.training.metrics import answer_loss

    cfg = mqar_cfg()
    batch = build_datasets(cfg)["train"].batch(torch.arange(6))
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(architecture="attention", d_model=16, vocab_size=cfg.vocab_size(), max_len=40)
    ).double()
    dense = answer_loss(model, batch)
    logits = model(batch.tokens)
    one_at_a_time = [
        -torch.log_softmax(logits[b, int(p)], -1)[int(a)]
        for b in range(6)
        for p, a in zip(
            batch.extras["answer_positions"][b], batch.extras["answers"][b], strict=True
        )
    ]
    # (the loss is taken in float32, as training takes it)
    torch.testing.assert_close(dense.double(), torch.stack(one_at_a_time).mean(), rtol=1e-6, atol=0)
    # ...and not the loss at the last query alone.
    single = -torch.log_softmax(logits[torch.arange(6), batch.query], -1)[
        torch.arange(6), batch.answer
    ].mean()
    assert not torch.allclose(dense.double(), single)


@pytest.mark.parametrize("kind", ["mqar", "compositional_mqar"])
def test_trains_and_restores_at_its_roles(kind: str, tmp_path) -> None:
    from mecheval.experiments.mechanisms import InterventionPlan, intervene_run
    from mecheval.training.config import config_from_data, resolve
    from mecheval.training.presets import preset
    from mecheval.training.run import train

    cfg = resolve(config_from_data(preset("tiny", kind, "attention"), ["name=m"]))
    assert train(cfg, tmp_path / "m")["state"] == "done"
    measured = intervene_run(tmp_path / "m", InterventionPlan(split="dev"))
    assert measured is not None
    roles = [r for r in dict.fromkeys(measured.rows["role"].dropna()) if r]
    nulls = [f"null {i}" for i in range(1, 6)]  # positions that play no role, after the roles
    assert roles == [*cfg.task.roles(), *nulls] and "divider" not in roles
    assert measured.n_docs == cfg.task.n_dev * cfg.task.queries


def test_task_show_marks_each_probe(monkeypatch, capsys) -> None:
    from small_runs import run_cli

    code, out, _ = run_cli(
        monkeypatch, capsys, "task", "show", "compositional_mqar", "--split", "dev", "-n", "2"
    )
    assert code == 0, out
    # -n counts documents: two documents are eight probes in dev
    assert out.count("<bos>") == 8 and "[query_first:" in out and "document 1, query 2 of 4" in out
    code, out, _ = run_cli(monkeypatch, capsys, "task", "stats", "mqar", "-n", "50")
    assert code == 0, out
    assert "query slot" in out and "queries per document" in out


def test_bos_starts_every_row() -> None:
    for make in (mqar_cfg, comp_cfg):
        for ds in build_datasets(make()).values():
            assert bool((ds.tokens[:, 0] == BOS).all())
