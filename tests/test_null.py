"""The null to beat (interventions/null.py): restores at positions that play no role, drawn
per document before its query; a role's fraction counts towards a label only above the null's
upper bound; on a model built to do induction the null recovers nothing."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from test_intervals import SITE, per_example, table_of
from test_mechanism_labels import hand_built_induction
from test_mechanisms import run_with_weights

from mecheval.experiments.mechanisms import InterventionPlan, eval_batch, intervene_run
from mecheval.interventions.labels import label_mechanism
from mecheval.interventions.null import (
    Null,
    is_null_role,
    measure_null,
    null_at_sites,
    null_positions,
    with_null_roles,
)
from mecheval.tasks import ARConfig

AR = ARConfig(n_keys=8, n_values=8, n_pairs=3, n_train=0, n_dev=64, n_test=64)


def test_null_positions_hold_no_role_and_precede_the_query() -> None:
    original, corrupted = eval_batch(AR, "dev", None)
    positions = null_positions(original, draws=7)
    assert positions.shape == (7, len(original))
    roles = torch.stack(list(original.roles.values()))  # [R, B]
    for draw in positions:
        assert (draw < original.roles["query"]).all()
        assert not (draw[None, :] == roles).any()
    assert torch.equal(positions, null_positions(original, draws=7))  # seeded
    assert not torch.equal(positions, null_positions(original, draws=7, seed=1))
    # Positions are drawn over every free one: AR's other pairs and the BOS all occur.
    assert len(torch.unique(positions)) > 4
    o, c, names = with_null_roles(original, corrupted, draws=3)
    assert names == ["null 1", "null 2", "null 3"] and all(map(is_null_role, names))
    assert torch.equal(o.roles["null 2"], c.roles["null 2"])
    assert set(original.roles) < set(o.roles)


def test_a_document_without_a_free_position_is_one_clear_error_or_no_null() -> None:
    original, _ = eval_batch(AR, "dev", 4)
    query = original.roles["query"].clone()
    cramped = type(original)(
        original.tokens, original.answer, {**original.roles, "query": torch.ones_like(query)}
    )
    cramped.roles["key"][:] = 0
    with pytest.raises(ValueError, match="null: document 0 has no position before its query"):
        null_positions(cramped)
    # Where runs are read, such documents measure no null (the label is read without one).
    assert measure_null(None, cramped, cramped, [SITE]) is None


def test_a_role_counts_only_above_the_null() -> None:
    examples = per_example({"key": 0.05, "value": 0.7, "query": 0.05})
    table = table_of(examples)
    label = label_mechanism(table, 2, per_example=examples, nulls={SITE: Null(0.3, 0.2, 0.3)})
    assert label.label == "induction" and label.null == Null(0.3, 0.2, 0.3)
    assert label.bar == 0.5  # the threshold, above the null's bound
    high_null = {SITE: Null(0.6, 0.75, 0.8)}
    label = label_mechanism(table, 2, per_example=examples, nulls=high_null)
    assert label.label == "unclear" and label.bar == 0.8
    assert "the null (no role) recovers 75%, at most 80%" in str(label)
    # A null measured at another site does not gate this one.
    label = label_mechanism(table, 2, per_example=examples, nulls={"layers.0.input": Null(0, 1, 1)})
    assert label.label == "induction" and label.null is None


def test_null_at_sites_reads_the_null_roles_alone() -> None:
    examples = per_example({"value": 0.6, "null 1": 0.0, "null 2": 0.1}, n=300, noise=0.05)
    (null,) = null_at_sites(examples).values()
    assert null.recovered == pytest.approx(0.05, abs=0.02)
    assert 0.1 < null.high < 0.15  # the upper end of null 2's interval
    assert null_at_sites(examples[~examples.role.map(is_null_role)]) == {}


def test_on_a_model_built_for_induction_the_null_recovers_nothing(tmp_path) -> None:
    run_dir = run_with_weights(tmp_path, lambda _: hand_built_induction())
    measured = intervene_run(run_dir, InterventionPlan(split="dev"))
    assert measured.label.label == "induction"
    null = measured.label.null
    assert null is not None and abs(null.recovered) < 0.05 and null.high < 0.2
    written = json.loads((run_dir / "mechanism.json").read_text())
    assert written["null"] == pytest.approx(
        {"likelihood": null.likelihood, "recovered": null.recovered, "high": null.high}
    )
    rows = pd.read_csv(run_dir / "interventions.csv", keep_default_na=False)
    nulls = rows[rows.role.map(is_null_role) & (rows.metric == "likelihood")]
    assert set(nulls.site) == {"layers.1.input"} and len(nulls) == 5
    assert nulls.value.mean() == pytest.approx(null.likelihood)
