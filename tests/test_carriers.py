"""Which layer of a hybrid carries the retrieval (interventions/carriers.py), read from
restores at every block boundary, and the label that names it."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from small_runs import config

from mecheval.experiments.mechanisms import InterventionPlan, intervene_run
from mecheval.interventions.carriers import Carrier, carrier
from mecheval.interventions.labels import label_mechanism
from mecheval.training import resolve, train

ORIGINAL, CORRUPTED = 0.9, 0.1


def table(restored: dict[tuple[str, str], float]) -> pd.DataFrame:
    """Likelihood rows: the original and corrupted runs, and a restore per (site, role)
    (every other role at every boundary recovers nothing)."""
    rows = [
        ("original", "", "", "likelihood", ORIGINAL),
        ("corrupted", "", "", "likelihood", CORRUPTED),
    ]
    sites = ["layers.0.input", "layers.1.input", "final_norm.input"]
    for site in sites:
        for role in ("key", "value", "next_key", "query"):
            value = restored.get((site, role), CORRUPTED)
            rows.append(("restored", site, role, "likelihood", value))
    rows += [
        ("restored", site, role, "likelihood", value)
        for (site, role), value in restored.items()
        if site not in sites
    ]
    return pd.DataFrame(rows, columns=["condition", "site", "role", "metric", "value"])


# The key restored at the embeddings undoes the corruption in every model.
KEY_AT_EMBEDDING = {("layers.0.input", "key"): ORIGINAL}


def read(restored: dict, names=("mamba", "attention")) -> Carrier | None:
    return carrier(table({**KEY_AT_EMBEDDING, **restored}), names, ORIGINAL, CORRUPTED, 0.5)


def test_induction_in_the_last_layer() -> None:
    """The answer reaches the query only after layer 1, which reads it at the value."""
    found = read({("layers.1.input", "value"): 0.85, ("final_norm.input", "query"): 0.9})
    assert found == Carrier(1, "attention", "induction")
    assert str(found) == "induction in layer 1 (attention)"


def test_direct_retrieval_in_the_first_layer() -> None:
    """The answer is at the query after layer 0, which read the key."""
    found = read({("layers.1.input", "query"): 0.8, ("final_norm.input", "query"): 0.9})
    assert str(found) == "direct retrieval in layer 0 (mamba)"


def test_the_bar_decides_and_a_missing_boundary_reads_nothing() -> None:
    assert read({("final_norm.input", "query"): 0.45}) is None  # 44 % of the gap < 50 %
    assert read({("layers.1.input", "value"): 0.55, ("final_norm.input", "query"): 0.5}) == (
        Carrier(1, "attention", "induction")  # exactly 50 %
    )
    rows = table({("final_norm.input", "query"): 0.9})
    rows = rows[rows.site != "layers.1.input"]
    assert carrier(rows, ("mamba", "attention"), ORIGINAL, CORRUPTED, 0.5) is None


def test_a_parallel_layer_names_the_branches_that_carry_it_alone() -> None:
    both = {("layers.1.input", "value"): 0.85, ("final_norm.input", "query"): 0.9}
    names = ("mamba", "attention~mamba")
    branch = "layers.1.mixer.branches.{}.output"
    found = read({**both, (branch.format(0), "query"): 0.8}, names)
    assert str(found) == "induction in layer 1 (attention~mamba: attention)"
    found = read(
        {**both, (branch.format(0), "query"): 0.8, (branch.format(1), "query"): 0.7}, names
    )
    assert found.branches == ("attention", "mamba")
    assert str(read(both, names)) == "induction in layer 1 (attention~mamba: no branch alone)"


def test_a_hybrids_retrieval_label_names_its_carrier() -> None:
    rows = table(
        {
            **KEY_AT_EMBEDDING,
            ("layers.1.input", "value"): 0.85,
            ("final_norm.input", "query"): 0.9,
        }
    )
    plain = label_mechanism(rows, n_layers=2)
    assert plain.label == "induction" and plain.carrier is None
    named = label_mechanism(rows, n_layers=2, layer_names=["mamba", "attention"])
    assert named.label == "induction in layer 1 (attention)"
    assert named.carrier == Carrier(1, "attention", "induction")
    assert (named.role, named.recovered) == (plain.role, plain.recovered)
    # A label that is not retrieval names no layer.
    flat = table({})
    assert label_mechanism(flat, 2, layer_names=["mamba", "attention"]).carrier is None


def test_mechanism_json_holds_the_carrier_of_hybrids_only(tmp_path, monkeypatch) -> None:
    import mecheval.experiments.mechanisms as mechanisms

    found = Carrier(1, "attention", "induction")
    seen = []
    label_mechanism_ = mechanisms.label_mechanism

    def labelled(*args, layer_names=None, **kwargs):
        seen.append(layer_names)
        label = label_mechanism_(*args, layer_names=layer_names, **kwargs)
        return (
            label
            if layer_names is None
            else label.__class__(**{**label.__dict__, "label": str(found), "carrier": found})
        )

    monkeypatch.setattr(mechanisms, "label_mechanism", labelled)
    plan = InterventionPlan(n_docs=8)
    for name, model in (("hybrid", {"layers": ["mamba", "attention"]}), ("plain", {})):
        train(resolve(config(model=model)), tmp_path / name)
        intervene_run(tmp_path / name, plan)
    assert seen == [["mamba", "attention"], None]
    hybrid = json.loads((tmp_path / "hybrid" / "mechanism.json").read_text())
    plain = json.loads((tmp_path / "plain" / "mechanism.json").read_text())
    assert hybrid["carrier"] == {
        "layer": 1, "architecture": "attention", "reads": "induction", "branches": []
    }  # fmt: skip
    assert hybrid["label"] == "induction in layer 1 (attention)"
    assert "carrier" not in plain
    from mecheval.experiments.store import label_records

    records = label_records(tmp_path).set_index("run")
    carriers = records[["carrier layer", "carrier architecture", "reads"]]
    assert carriers.loc["hybrid"].tolist() == [1, "attention", "induction"]
    assert carriers.loc["plain"].isna().all()


@pytest.mark.parametrize("layers", [["mamba", {"parallel": ["attention", "hyena"]}]])
def test_every_boundary_and_branch_is_measured_by_default(tmp_path, layers) -> None:
    """The default plan restores at every block boundary and every branch's output, which
    the carrier is read from."""
    train(resolve(config(model={"layers": layers})), tmp_path / "run")
    result = intervene_run(tmp_path / "run", InterventionPlan(n_docs=4)).result
    sites = set(result.table.site)
    assert {"layers.0.input", "layers.1.input", "final_norm.input"} <= sites
    assert {"layers.1.mixer.branches.0.output", "layers.1.mixer.branches.1.output"} <= sites
    assert torch.isfinite(torch.tensor(result.table.value.to_numpy())).all()


def test_restoring_only_the_boundaries_reads_the_same_label_and_restores(tmp_path) -> None:
    """A plan of scope "boundaries" restores each block's input, final_norm.input and a
    parallel layer's branch outputs: the label, its carrier and every one of those restores
    as the plan of every site has them, in a fraction of the rows."""
    import shutil

    from mecheval.models.sites import boundary_sites
    from mecheval.training import load_run

    layers = ["mamba", {"parallel": ["attention", "mamba"]}]
    every = tmp_path / "every"
    train(resolve(config(model={"layers": layers})), every)
    shutil.copytree(every, tmp_path / "boundaries")
    _, model = load_run(every, "cpu")
    assert boundary_sites(model) == [
        "layers.0.input",
        "layers.1.input",
        "layers.1.mixer.branches.0.output",
        "layers.1.mixer.branches.1.output",
        "final_norm.input",
    ]
    found = {}
    for scope in ("every site", "boundaries"):
        intervene_run(tmp_path / scope.split()[0], InterventionPlan(n_docs=16, scope=scope))
        run = tmp_path / scope.split()[0]
        rows = pd.read_csv(run / "interventions.csv")
        found[scope] = (rows, json.loads((run / "mechanism.json").read_text()))
    (all_rows, all_label), (rows, label) = found["every site"], found["boundaries"]
    assert label == all_label
    assert set(rows.site.dropna()) == set(boundary_sites(model))
    assert len(rows) < len(all_rows) / 2
    keys = ["condition", "site", "role", "metric", "split", "step"]
    merged = rows.merge(all_rows, on=keys, how="left", suffixes=("", "_every"))
    assert merged.value.tolist() == merged.value_every.tolist()
