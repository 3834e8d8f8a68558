"""Reassign AR (tasks/reassign_ar.py): each document against a naive reading of its tokens
(the value a key holds last is what a dict keeps), corruption against the one token it may
change, the generator against its seed, impossible parameters against one clear line, and its
readings (tasks/readings.py RETRIEVAL_AND_STATE): the label site decides, a state that holds
the answer is added to the label."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from mecheval.errors import ConfigError
from mecheval.interventions.labels import label_mechanism
from mecheval.tasks import ROLES, SPLITS, build_datasets, corrupt, parse_task
from mecheval.tasks.readings import RETRIEVAL, RETRIEVAL_AND_STATE
from mecheval.tasks.reassign_ar import ReassignARConfig
from mecheval.tasks.vocab import N_SPECIAL


def reassign_cfg(**kw) -> ReassignARConfig:
    base = {"n_keys": 9, "n_values": 14, "n_pairs": 4, "n_changes": 5, "query_changes": 3}
    base.update({"n_train": 300, "n_dev": 40, "n_test": 40})
    base.update(kw)
    return ReassignARConfig(**base)


def pairs_of(cfg: ReassignARConfig, doc: list[str]) -> list[tuple[str, str]]:
    return [(doc[1 + 2 * j], doc[2 + 2 * j]) for j in range(cfg.n_pairs + cfg.n_changes)]


@pytest.mark.parametrize("own", [1, 2, 3, 5])
def test_the_answer_is_the_value_the_query_key_holds_last(own: int) -> None:
    cfg = reassign_cfg(query_changes=own)
    ds = build_datasets(cfg)["train"]
    names = cfg.id_names()
    assert set(ds.roles) == {*ROLES, "stale_key", "stale_value"}
    asked_pairs = set()
    for i in range(len(ds)):
        doc = [names[t] for t in ds.document(i)]
        assert len(doc) == cfg.max_length() and doc[0] == "<bos>" and doc[-2] == "<div>"
        pairs = pairs_of(cfg, doc)
        assert all(k[0] == "k" and v[0] == "v" for k, v in pairs)
        firsts = [k for k, _ in pairs[: cfg.n_pairs]]
        assert len(set(firsts)) == cfg.n_pairs  # distinct keys first
        assert {k for k, _ in pairs[cfg.n_pairs :]} <= set(firsts)  # rebindings of those
        assert len({v for _, v in pairs}) == len(pairs)  # every binding its own value
        query = doc[-1]
        assert query in firsts
        asked_pairs.add(firsts.index(query))
        held = dict(pairs)[query]  # a dict keeps the value written last
        assert names[int(ds.answer[i])] == held
        occurrences = [1 + 2 * j for j, (k, _) in enumerate(pairs) if k == query]
        assert len(occurrences) == 1 + own  # the first binding, then its changes
        roles = {r: int(p[i]) for r, p in ds.roles.items()}
        assert roles["key"] == occurrences[-1] and roles["stale_key"] == occurrences[-2]
        assert doc[roles["value"]] == held and roles["value"] == roles["key"] + 1
        assert roles["stale_value"] == roles["stale_key"] + 1
        assert roles["next_key"] == roles["key"] + 2
        assert roles["divider"] == len(doc) - 2 and roles["query"] == len(doc) - 1
    assert asked_pairs == set(range(cfg.n_pairs))  # the query falls on every pair


def test_with_one_pair_every_rebinding_is_the_query_keys() -> None:
    cfg = reassign_cfg(n_pairs=1, n_changes=3, query_changes=3)
    ds = build_datasets(cfg)["dev"]
    for i in range(len(ds)):
        doc = [cfg.id_names()[t] for t in ds.document(i)]
        assert {k for k, _ in pairs_of(cfg, doc)} == {doc[-1]}


def test_corruption_leaves_the_query_key_its_previous_value() -> None:
    cfg = reassign_cfg()
    batch = build_datasets(cfg)["dev"].batch(torch.arange(40))
    bad = corrupt(batch, cfg, seed=3)
    rows = torch.arange(40)
    changed = (bad.tokens != batch.tokens).nonzero()
    assert torch.equal(changed[:, 0], rows) and torch.equal(changed[:, 1], batch.roles["key"])
    new = bad.tokens[rows, batch.roles["key"]]
    assert bool(((new >= N_SPECIAL) & (new < N_SPECIAL + cfg.n_keys)).all())
    assert bool(((batch.tokens == new[:, None]).sum(1) == 0).all())  # absent from the document
    names = cfg.id_names()
    for b in range(40):
        doc = [names[t] for t in bad.tokens[b].tolist()]
        held = dict(pairs_of(cfg, doc))[doc[-1]]
        assert held == names[int(batch.tokens[b, batch.roles["stale_value"][b]])]


def test_a_function_of_its_seed_and_its_roles_kept_in_the_cache(tmp_path) -> None:
    a, b = build_datasets(reassign_cfg()), build_datasets(reassign_cfg(), tmp_path)
    cached = build_datasets(reassign_cfg(), tmp_path)  # loaded back from the file
    other = build_datasets(reassign_cfg(seed=2))
    for split in SPLITS:
        for ds in (b[split], cached[split]):
            assert torch.equal(a[split].tokens, ds.tokens)
            assert torch.equal(a[split].answer, ds.answer)
            assert all(torch.equal(a[split].roles[r], ds.roles[r]) for r in a[split].roles)
    assert not torch.equal(a["train"].tokens, other["train"].tokens)


@pytest.mark.parametrize(
    ("data", "field", "says"),
    [
        ({"n_pairs": 4, "n_values": 8, "n_changes": 5}, "task.n_changes", "1..4"),
        ({"n_changes": 2, "query_changes": 3}, "task.query_changes", "n_changes=2"),
        ({"n_pairs": 1, "n_changes": 3, "query_changes": 2}, "task.query_changes", "allowed 3"),
        ({"query_changes": 0}, "task.query_changes", "greater than or equal to 1"),
    ],
)
def test_impossible_parameters(data: dict, field: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_task({"kind": "reassign_ar", **data})
    message = str(err.value)
    assert "\n" not in message and message.startswith(field) and says in message, message


def _table(restored: dict[tuple[str, str], float]) -> pd.DataFrame:
    rows = [
        ("original", "", "", "likelihood", 0.9),
        ("corrupted", "", "", "likelihood", 0.1),
        ("original", "", "", "accuracy", 0.9),
        ("original", "", "", "in_context_accuracy", 1.0),
    ]
    rows += [("restored", site, role, "likelihood", v) for (site, role), v in restored.items()]
    return pd.DataFrame(rows, columns=["condition", "site", "role", "metric", "value"])


def test_the_label_site_decides_and_a_state_that_holds_the_answer_is_added() -> None:
    assert ReassignARConfig().readings is RETRIEVAL_AND_STATE
    assert RETRIEVAL_AND_STATE.at_label_site == RETRIEVAL.at_label_site
    restores = {
        ("layers.1.input", "key"): 0.1,
        ("layers.1.input", "value"): 0.1,
        ("layers.1.input", "query"): 0.8,
        ("layers.0.mixer.state", "divider"): 0.9,  # recovers more than the query, and all
        ("layers.1.mixer.state", "value"): 0.3,
    }
    read = label_mechanism(_table(restores), 2, chance=0.25, readings=RETRIEVAL_AND_STATE)
    assert read.label == "direct retrieval, layer 0; held in the state before the query (layer 0)"
    assert (read.role, read.site) == ("query", "layers.1.input")
    assert read.recovered["divider (state)"] == pytest.approx(1.0)
    restores[("layers.0.mixer.state", "divider")] = 0.4  # under min_fraction: nothing added
    read = label_mechanism(_table(restores), 2, chance=0.25, readings=RETRIEVAL_AND_STATE)
    assert read.label == "direct retrieval, layer 0"
    restores[("layers.1.input", "query")] = 0.2  # no role decides: unclear, nothing added
    restores[("layers.0.mixer.state", "divider")] = 0.9
    read = label_mechanism(_table(restores), 2, chance=0.25, readings=RETRIEVAL_AND_STATE)
    assert read.label == "unclear"


def test_an_attention_model_without_states_reads_retrieval_alone() -> None:
    restored = {"key": 0.1, "value": 0.85, "query": 0.1}
    restores = {("layers.1.input", role): v for role, v in restored.items()}
    read = label_mechanism(_table(restores), 2, chance=0.25, readings=RETRIEVAL_AND_STATE)
    assert read.label == "induction" and "divider (state)" not in read.recovered


def test_a_hybrids_run_restores_the_state_of_its_recurrent_layer(tmp_path) -> None:
    """A Mamba + attention hybrid trained briefly on reassign AR: its interventions restore
    layer 0's state (Mamba's; attention has none) at the divider, for the label's addition."""
    from mecheval.experiments.mechanisms import InterventionPlan, intervene_run
    from mecheval.training.config import config_from_data, resolve
    from mecheval.training.presets import preset
    from mecheval.training.run import train

    data = preset("tiny", "reassign_ar", "mamba")
    data["model"]["layers"] = ["mamba", "attention"]
    cfg = resolve(config_from_data(data, ["name=h", "training.steps=30"]))

    assert train(cfg, tmp_path / "h")["state"] == "done"
    measured = intervene_run(tmp_path / "h", InterventionPlan(split="dev"))
    assert measured is not None
    sites = set(measured.rows["site"].dropna())
    assert "layers.0.mixer.state" in sites and "layers.1.mixer.state" not in sites
    roles = set(measured.rows[measured.rows["site"] == "layers.0.mixer.state"]["role"])
    assert "divider" in roles
