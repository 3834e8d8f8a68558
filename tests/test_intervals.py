"""Bootstrap intervals of the restores (interventions/intervals.py) and the labels they make
fragile: the vectorised intervals against a loop over the same draws, against the normal
approximation of a mean's interval, and against invariants; a label whose deciding fraction's
interval crosses its threshold is marked, and the seed agreement counts such labels apart."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from small_runs import config, run_cli

from mecheval.experiments.store import seed_agreement
from mecheval.interventions.intervals import (
    INTERVAL_METRICS,
    Bootstrap,
    recovered_fraction,
    restore_intervals,
)
from mecheval.interventions.labels import label_mechanism
from mecheval.interventions.null import Null
from mecheval.tasks.readings import STATE_TRACKING
from mecheval.training import train

SITE = "layers.1.input"


def per_example(fractions: dict[str, float], n: int = 200, noise: float = 0.2, seed: int = 0):
    """Documents whose restore of each role recovers about ``fractions[role]`` of the gap."""
    rng = np.random.default_rng(seed)
    original = rng.uniform(0.6, 1.0, n)
    corrupted = rng.uniform(0.0, 0.1, n)
    rows = []
    for role, fraction in fractions.items():
        restored = corrupted + fraction * (original - corrupted) + rng.normal(0, noise, n)
        rows += [(d, SITE, role, restored[d], original[d], corrupted[d]) for d in range(n)]
    return pd.DataFrame(rows, columns=["doc", "site", "role", "restored", "original", "corrupted"])


def table_of(examples: pd.DataFrame) -> pd.DataFrame:
    """The engine's table of these documents (likelihood means), as label_mechanism reads it."""
    first = examples[examples.role == examples.role.iloc[0]]
    rows = [
        ("original", "", "", "likelihood", first.original.mean()),
        ("corrupted", "", "", "likelihood", first.corrupted.mean()),
    ]
    for (site, role), group in examples.groupby(["site", "role"], sort=False):
        rows.append(("restored", site, role, "likelihood", group.restored.mean()))
    return pd.DataFrame(rows, columns=["condition", "site", "role", "metric", "value"])


def test_intervals_equal_a_loop_over_the_same_draws() -> None:
    examples = per_example({"key": 0.1, "value": 0.4, "query": 0.9}, n=50)
    bootstrap = Bootstrap(n_resamples=200, seed=3)
    found = restore_intervals(examples, bootstrap).set_index(["site", "role"])
    draws = bootstrap.draws(50)
    for role in ("key", "value", "query"):
        group = examples[examples.role == role].sort_values("doc")
        restored, fractions = [], []
        for draw in draws:
            r = sum(group.restored.iloc[i] for i in draw) / len(draw)
            o = sum(group.original.iloc[i] for i in draw) / len(draw)
            c = sum(group.corrupted.iloc[i] for i in draw) / len(draw)
            restored.append(r)
            fractions.append((r - c) / (o - c))
        row = found.loc[(SITE, role)]
        assert (row.restored_low, row.restored_high) == pytest.approx(
            tuple(np.quantile(restored, [0.025, 0.975])), abs=1e-12
        )
        assert (row.recovered_low, row.recovered_high) == pytest.approx(
            tuple(np.quantile(fractions, [0.025, 0.975])), abs=1e-12
        )


def test_a_mean_s_interval_is_the_normal_approximation_s_on_many_documents() -> None:
    examples = per_example({"value": 0.5}, n=4000, noise=0.3)
    row = restore_intervals(examples, Bootstrap(n_resamples=2000)).iloc[0]
    restored = examples.restored.to_numpy()
    half = 1.96 * restored.std(ddof=1) / math.sqrt(len(restored))
    assert row.restored_low == pytest.approx(restored.mean() - half, abs=0.1 * half)
    assert row.restored_high == pytest.approx(restored.mean() + half, abs=0.1 * half)


def test_intervals_follow_their_invariants() -> None:
    examples = per_example({"value": 0.5}, n=40)
    examples_equal = examples.assign(role="query", restored=examples.original)
    examples_none = examples.assign(role="key", restored=examples.corrupted)
    both = pd.concat([examples, examples_equal, examples_none], ignore_index=True)
    found = restore_intervals(both).set_index("role")
    # A restore that gives back each document's original likelihood recovers all, always.
    assert tuple(found.loc["query", ["recovered_low", "recovered_high"]]) == pytest.approx((1, 1))
    assert tuple(found.loc["key", ["recovered_low", "recovered_high"]]) == pytest.approx((0, 0))
    # Seeded: the same documents give the same intervals.
    assert restore_intervals(both).equals(restore_intervals(both))
    # Sixteen times the documents: a narrower interval around the same fraction.
    many = pd.concat(
        [examples.assign(doc=examples.doc + k * 40) for k in range(16)], ignore_index=True
    )
    narrow = restore_intervals(many).iloc[0]
    wide = found.loc["value"]
    assert (
        narrow.recovered_high - narrow.recovered_low
        < (wide.recovered_high - wide.recovered_low) / 2
    )
    r, o, c = examples.restored.mean(), examples.original.mean(), examples.corrupted.mean()
    point = recovered_fraction(r, c, o - c)
    assert narrow.recovered_low < point < narrow.recovered_high
    assert recovered_fraction(0.5, 0.5, 0.0) == 0.0  # no gap: nothing to recover


def test_documents_must_be_the_same_for_every_restore() -> None:
    examples = per_example({"key": 0.1, "value": 0.5}, n=10)
    with pytest.raises(ValueError, match="@ value measured other documents"):
        restore_intervals(examples[(examples.role == "key") | (examples.doc < 9)])


def test_a_label_whose_deciding_fraction_straddles_the_threshold_is_fragile() -> None:
    clear = per_example({"key": 0.05, "value": 0.05, "query": 0.9})
    label = label_mechanism(table_of(clear), n_layers=2, per_example=clear)
    assert label.label == "direct retrieval, layer 0" and label.role == "query"
    assert set(label.intervals) == set(label.recovered) == {"key", "value", "query"}
    low, high = label.intervals["query"]
    assert low < label.recovered["query"] < high and low > 0.5
    assert label.fragile is None and label.headline == label.label

    near = per_example({"key": 0.05, "value": 0.05, "query": 0.62}, noise=0.5)
    label = label_mechanism(table_of(near), n_layers=2, per_example=near)
    assert label.label == "direct retrieval, layer 0"
    low, high = label.intervals["query"]
    assert low < 0.5 < high
    expected = cited(label, "query")
    assert label.fragile == expected
    assert label.headline == f"direct retrieval, layer 0 (fragile: {expected})"
    assert str(label).startswith(label.headline + " (at layers.1.input")

    below = per_example({"key": 0.05, "value": 0.5, "query": 0.05}, noise=0.5)
    label = label_mechanism(table_of(below), n_layers=2, per_example=below)
    assert label.label == "unclear" and label.role is None
    assert label.fragile is not None and label.fragile.startswith("value ")
    # Without the documents: the point reading alone, as before.
    assert label_mechanism(table_of(below), n_layers=2).intervals == {}


def cited(label, role: str) -> str:
    """A fraction as a fragile label cites it: ``query 52 % [44, 60]``."""
    low, high = label.intervals[role]
    return f"{role} {100 * label.recovered[role]:.0f} % [{100 * low:.0f}, {100 * high:.0f}]"


def test_a_label_whose_answer_comes_back_through_two_roles_is_fragile() -> None:
    """A second role that brings back a share of the answer (its interval at or above
    ``min_rival``, 10 %) makes the label fragile, however clear the deciding role: which of
    the two passes the bar turns with the model's small changes."""
    split = per_example({"key": 0.25, "value": 0.0, "query": 0.7})
    label = label_mechanism(table_of(split), n_layers=2, per_example=split)
    assert label.label == "direct retrieval, layer 0" and label.intervals["query"][0] > 0.5
    assert label.rivals == ("key",) and label.intervals["key"][0] >= 0.1
    assert label.fragile == f"{cited(label, 'query')}, {cited(label, 'key')}"
    # Below 10 % the other role is not a rival; a role at zero never is.
    alone = per_example({"key": 0.04, "value": 0.0, "query": 0.7})
    label = label_mechanism(table_of(alone), n_layers=2, per_example=alone)
    assert label.rivals == () and label.fragile is None
    # Without the documents no interval says how sure a share is: no rivals.
    assert label_mechanism(table_of(split), n_layers=2).rivals == ()

    # unclear, split between two roles that bring back together what one would need...
    shared = per_example({"key": 0.25, "value": 0.0, "query": 0.38}, noise=0.1)
    label = label_mechanism(table_of(shared), n_layers=2, per_example=shared)
    assert label.label == "unclear" and label.intervals["query"][1] < 0.5
    assert (
        label.rivals == ("key",)
        and label.fragile == f"{cited(label, 'query')}, {cited(label, 'key')}"
    )
    # ... is fragile; two small shares that cannot make a label together are not.
    small = per_example({"key": 0.15, "value": 0.0, "query": 0.2}, noise=0.1)
    label = label_mechanism(table_of(small), n_layers=2, per_example=small)
    assert label.label == "unclear" and label.rivals == ("key",) and label.fragile is None

    # A rival counts only above the null's upper bound.
    high_null = {SITE: Null(likelihood=0.3, recovered=0.2, high=0.35)}
    label = label_mechanism(table_of(split), n_layers=2, per_example=split, nulls=high_null)
    assert label.label == "direct retrieval, layer 0" and label.rivals == ()
    # Where the first role reached names the label (state tracking), no role is a rival.
    label = label_mechanism(table_of(split), n_layers=2, per_example=split, readings=STATE_TRACKING)
    assert label.role == "query" and label.rivals == () and label.fragile is None


def test_the_seed_agreement_counts_fragile_labels_apart() -> None:
    summary = pd.DataFrame(
        {
            "run": ["m-s0", "m-s1", "m-s2", "a-s0"],
            "architecture": ["mamba"] * 3 + ["attention"],
            "seed": [0, 1, 2, 0],
            "mechanism": ["direct retrieval, layer 0"] * 3 + ["induction"],
            "fragile": ["query 52 % [44, 60]", None, None, "value 55 % [45, 66]"],
            "role": ["query", "query", "query", "value"],
            "recovered": [{"query": q, "key": 0.1} for q in (0.52, 0.7, 0.9)] + [{"value": 0.55}],
        }
    )
    agreement = seed_agreement(summary).set_index("cell")
    # The deciding fraction over the seeds: its mean, and the interval of the mean with the
    # seeds resampled (by a loop over the same draws here).
    values = np.array([0.52, 0.7, 0.9])
    draws = Bootstrap().draws(3)
    means = [sum(values[i] for i in draw) / 3 for draw in draws]
    low, high = np.quantile(means, [0.025, 0.975])
    assert agreement.loc["m", "over seeds"] == f"query 71 % [{100 * low:.0f}, {100 * high:.0f}]"
    assert agreement.loc["a", "over seeds"] == ""  # one seed: no interval over seeds
    assert agreement.loc["m", "agreement"] == "direct retrieval, layer 0 3/3 (1 of them fragile)"
    assert agreement.loc["m", "labels"].startswith("s0: direct retrieval, layer 0 (fragile) · ")
    assert agreement.loc["a", "agreement"] == "induction (one seed, fragile)"


def test_intervene_prints_the_intervals_and_writes_them(tmp_path, monkeypatch, capsys) -> None:
    run_dir = tmp_path / "r"
    assert train(config(), run_dir)["state"] == "done"
    code, out, _ = run_cli(monkeypatch, capsys, "intervene", str(run_dir), "--sites", SITE)
    assert code == 0
    assert "95 % intervals of the restores (bootstrap over the documents):" in out
    assert f"| {SITE} | [" in out
    written = json.loads((run_dir / "mechanism.json").read_text())
    assert set(written["intervals"]) == set(written["recovered"])
    assert all(low <= high for low, high in written["intervals"].values())
    assert "fragile" in written
    # interventions.csv (and so `mecheval results`) carries each restore's interval and the
    # fraction it recovers, the label's numbers among them.
    rows = pd.read_csv(run_dir / "interventions.csv", keep_default_na=False)
    at_site = rows[(rows.site == SITE) & (rows.condition == "restored")]
    by = at_site.pivot(index="role", columns="metric", values="value")
    assert set(INTERVAL_METRICS) <= set(by.columns)
    assert (by.likelihood_low <= by.likelihood).all() and (
        by.likelihood <= by.likelihood_high
    ).all()
    for role, (low, high) in written["intervals"].items():
        assert by.loc[role, "recovered"] == pytest.approx(written["recovered"][role])
        assert (by.loc[role, "recovered_low"], by.loc[role, "recovered_high"]) == (low, high)
