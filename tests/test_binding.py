"""The binding metric (issue #14): in-context mass and accuracy for every task, and the label
``candidates only (no binding)``.

The candidates of a document are the ids of its answer's class that occur in its context
(AR: its values; ATR: the terminals of its yield), from the task's ``answer_candidates``
hook; tasks/scores.py scores them in float64 beside likelihood and accuracy.
"""

from __future__ import annotations

import json
import math
from typing import Literal

import pandas as pd
import pytest
import torch
from test_mechanism_labels import TASK, D, P, hand_built_induction, set_head
from typer.testing import CliRunner

from mecheval.cli import _register, app
from mecheval.experiments.mechanisms import InterventionPlan, intervene_run
from mecheval.experiments.store import mechanism_summary
from mecheval.interventions import (
    Thresholds,
    interchange,
    label_mechanism,
    naive_interchange,
)
from mecheval.interventions.labels import (
    CANDIDATES_MIN_IN_CONTEXT_ACCURACY,
    CANDIDATES_ONLY,
    CHANCE_TOLERANCE,
)
from mecheval.models import ModelConfig, build_model
from mecheval.tasks import (
    ARConfig,
    ATRConfig,
    Batch,
    build_datasets,
    corrupt,
)
from mecheval.tasks.base import TaskConfigBase
from mecheval.tasks.scores import CANDIDATE_SCORES, SCORES, answer_scores, chance_level
from mecheval.training.metrics import evaluate

AR = ARConfig(n_keys=6, n_values=6, n_pairs=3, min_pairs=1, n_train=0, n_dev=48, n_test=8)
ATR = ATRConfig(n_train=0, n_dev=48, n_test=8, query="mixed", max_yield=40)


def random_model(cfg, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(
        ModelConfig(
            architecture="attention",
            d_model=16,
            n_layers=2,
            vocab_size=cfg.vocab_size(),
            max_len=cfg.max_length(),
            init_std=1.0,  # a peaked distribution: argmaxes land on different classes
        )
    ).eval()


def naive_candidates(cfg, dataset, i: int) -> set[int]:
    """Document i's candidates from its token names: AR values (v*), ATR terminals (t*),
    before the divider."""
    names = cfg.id_names()
    doc = dataset.document(i)
    context = doc[: int(dataset.roles["divider"][i])]
    prefix = "v" if cfg.kind == "ar" else "t"
    return {t for t in context if names[t].startswith(prefix) and names[t][1:].isdigit()}


@pytest.mark.parametrize("cfg", [AR, ATR], ids=["ar", "atr"])
def test_scores_equal_a_naive_per_document_loop(cfg) -> None:
    """Every score, batched over documents of different lengths, equals the same number
    computed one document at a time in plain Python (math.exp of float64 log-softmax)."""
    dev = build_datasets(cfg)["dev"]
    model = random_model(cfg)
    batch = dev.batch(torch.arange(len(dev)))
    with torch.no_grad():
        logits = model(batch.tokens, at=batch.query)
    got = answer_scores(logits, batch.answer, candidates=batch.candidates)
    assert set(got) == set(SCORES)
    argmax_in = 0
    for i in range(len(dev)):
        cands = naive_candidates(cfg, dev, i)
        assert cands == set(batch.candidates[i].nonzero()[:, 0].tolist())
        assert int(dev.answer[i]) in cands
        row = logits[i].double().tolist()
        top = max(row)
        norm = top + math.log(sum(math.exp(x - top) for x in row))
        probs = [math.exp(x - norm) for x in row]
        mass = sum(probs[t] for t in cands)
        best = max(range(len(row)), key=row.__getitem__)
        assert got["in_context_mass"][i].item() == pytest.approx(mass, rel=1e-12, abs=1e-15)
        assert got["in_context_accuracy"][i].item() == float(best in cands)
        assert got["likelihood"][i].item() == pytest.approx(probs[int(dev.answer[i])], rel=1e-12)
        argmax_in += best in cands
        assert got["in_context_mass"].dtype == torch.float64
    # The case is not degenerate: some argmaxes fall in the context, some outside.
    assert 0 < argmax_in < len(dev)


def test_atr_candidates_are_the_distinct_terminals_of_the_yield() -> None:
    """ATR's answer is a terminal (the head terminal at ``roles["value"]``): the candidates
    are the yield's distinct terminals, the query's own included, the query-type token not."""
    dev = build_datasets(ATR)["dev"]
    batch = dev.batch(torch.arange(len(dev)))
    names = ATR.id_names()
    rows = torch.arange(len(dev))
    assert torch.equal(batch.tokens[rows, batch.roles["value"]], batch.answer)
    for i in range(len(dev)):
        yield_ = dev.document(i)[1 : int(dev.roles["divider"][i])]
        assert set(batch.candidates[i].nonzero()[:, 0].tolist()) == set(yield_)
        qtype = dev.document(i)[-2]
        assert names[qtype].startswith("<") and not bool(batch.candidates[i, qtype])
        assert bool(batch.candidates[i, dev.document(i)[-1]])  # the query terminal
    counts = batch.candidates.sum(1).double()
    assert chance_level(batch.candidates) == pytest.approx((1 / counts).mean().item())
    # Terminals repeat within yields: fewer candidates than yield symbols somewhere.
    assert bool((counts < batch.roles["divider"] - 1).any())


def test_ar_candidates_are_the_values_and_chance_is_mean_one_over_pairs() -> None:
    dev = build_datasets(AR)["dev"]
    batch = dev.batch(torch.arange(len(dev)))
    pairs = (batch.roles["divider"] - 1) // 2
    assert torch.equal(batch.candidates.sum(1), pairs)  # values are distinct
    assert len(set(pairs.tolist())) > 1  # min_pairs: the count varies
    assert chance_level(batch.candidates) == pytest.approx((1 / pairs.double()).mean().item())
    assert chance_level(batch.candidates) != pytest.approx(1 / pairs.double().mean().item())


def test_hand_built_logits_argmax_on_an_unbound_in_context_value() -> None:
    """The argmax is a value of the document that is not the answer: accuracy 0, in-context
    accuracy 1; the mass adds the two in-context values' probabilities."""
    v = 8
    logits = torch.full((1, v), -30.0, dtype=torch.float64)
    logits[0, 5] = 2.0  # the bound value (the answer)
    logits[0, 6] = 3.0  # another value of the same document: the argmax
    logits[0, 7] = 2.5  # a value absent from the document
    candidates = torch.zeros(1, v, dtype=torch.bool)
    candidates[0, [5, 6]] = True
    got = answer_scores(logits, torch.tensor([5]), candidates=candidates)
    probs = torch.softmax(logits, -1)[0]
    assert got["accuracy"].item() == 0.0
    assert got["in_context_accuracy"].item() == 1.0
    assert got["in_context_mass"].item() == pytest.approx((probs[5] + probs[6]).item())
    assert got["likelihood"].item() == pytest.approx(probs[5].item())
    # The argmax outside the context: in-context accuracy 0 too.
    logits[0, 7] = 4.0
    got = answer_scores(logits, torch.tensor([5]), candidates=candidates)
    assert got["accuracy"].item() == 0.0 and got["in_context_accuracy"].item() == 0.0


@pytest.mark.parametrize("cfg", [AR, ATR], ids=["ar", "atr"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_invariants_mass_at_least_likelihood_in_context_accuracy_at_least_accuracy(
    cfg, seed
) -> None:
    """The answer is always a candidate: per document, in-context mass >= likelihood and
    in-context accuracy >= accuracy, in every condition of the engine (corrupted documents
    are scored against the original's candidates)."""
    dev = build_datasets(cfg)["dev"]
    model = random_model(cfg, seed)
    batch = dev.batch(torch.arange(len(dev)))
    assert bool(batch.candidates[torch.arange(len(dev)), batch.answer].all())
    for b in (batch, corrupt(batch, cfg, seed=seed)):
        with torch.no_grad():
            s = answer_scores(model(b.tokens, at=b.query), b.answer, candidates=b.candidates)
        assert bool((s["in_context_mass"] >= s["likelihood"]).all())
        assert bool((s["in_context_accuracy"] >= s["accuracy"]).all())
        assert bool((s["in_context_mass"] <= 1 + 1e-12).all())
    result = interchange(model, batch, corrupt(batch, cfg, seed=seed), sites=["layers.1.input"])
    wide = result.table.pivot_table(
        index=["condition", "site", "role"], columns="metric", values="value"
    )
    assert bool((wide.in_context_mass >= wide.likelihood - 1e-12).all())
    assert bool((wide.in_context_accuracy >= wide.accuracy).all())


def test_likelihood_and_accuracy_are_unchanged_by_the_candidates() -> None:
    """Existing numbers stay byte-identical: the scores that do not read candidates are the
    same tensors with or without them (and the candidate scores are left out without)."""
    dev = build_datasets(AR)["dev"]
    batch = dev.batch(torch.arange(len(dev)))
    with torch.no_grad():
        logits = random_model(AR)(batch.tokens, at=batch.query)
    plain = answer_scores(logits, batch.answer)
    assert set(plain) == {"likelihood", "accuracy", "loss"}
    full = answer_scores(logits, batch.answer, candidates=batch.candidates)
    for name, values in plain.items():
        assert torch.equal(values, full[name])
    with pytest.raises(ValueError, match="candidates"):
        answer_scores(logits, batch.answer, ["in_context_mass"])
    assert frozenset({"in_context_mass", "in_context_accuracy"}) == CANDIDATE_SCORES


def test_training_metrics_and_the_engine_report_them() -> None:
    """evaluate (metrics.csv) and the engine read the same scorer; batched engine = naive."""
    model = random_model(AR)
    dev = build_datasets(AR)["dev"]
    got = evaluate(model, dev, batch_size=5)
    batch = dev.batch(torch.arange(len(dev)))
    with torch.no_grad():
        s = answer_scores(model(batch.tokens, at=batch.query), batch.answer, None, batch.candidates)
    for name in ("in_context_mass", "in_context_accuracy"):
        assert got[name] == pytest.approx(s[name].mean().item(), rel=1e-6)
    small = batch.select(slice(0, 6))
    bad = corrupt(small, AR, seed=3)
    fast = interchange(model, small, bad, sites=["layers.0.output", "layers.1.input"])
    slow = naive_interchange(model, small, bad, sites=["layers.0.output", "layers.1.input"])
    for metric in ("in_context_mass", "in_context_accuracy"):
        a = fast.table[fast.table.metric == metric].reset_index(drop=True)
        b = slow.table[slow.table.metric == metric].reset_index(drop=True)
        assert len(a) == 2 + 2 * 5
        pd.testing.assert_frame_equal(a, b, rtol=1e-9)


def test_a_task_keeping_the_default_takes_every_non_special_context_token() -> None:
    class Plain(TaskConfigBase):
        kind: Literal["plain"] = "plain"

        def token_names(self) -> list[str]:
            return [f"t{i}" for i in range(5)]  # ids 3..7 after the 3 specials

    tokens = torch.tensor([[1, 3, 4, 5, 2, 3], [1, 6, 6, 2, 6, 0]])
    roles = {"divider": torch.tensor([4, 3]), "query": torch.tensor([5, 4])}
    batch = Batch(tokens, torch.tensor([4, 6]), roles)
    mask = Plain().answer_candidates(batch)
    assert mask.shape == (2, 8)
    assert mask.nonzero().tolist() == [[0, 3], [0, 4], [0, 5], [1, 6]]


# ----------------------------------------------------------------------------- the label


def _table(
    accuracy: float, in_context_accuracy: float, original: float = 0.9, corrupted: float = 0.1
) -> pd.DataFrame:
    """An engine table whose restores read induction, with the given binding scores."""
    rows = [
        ("original", "", "", "likelihood", original),
        ("corrupted", "", "", "likelihood", corrupted),
        ("original", "", "", "accuracy", accuracy),
        ("original", "", "", "in_context_accuracy", in_context_accuracy),
        ("original", "", "", "in_context_mass", 0.95),
    ]
    restored = {"key": corrupted, "value": original, "query": corrupted}
    rows += [("restored", "layers.1.input", r, "likelihood", v) for r, v in restored.items()]
    return pd.DataFrame(rows, columns=["condition", "site", "role", "metric", "value"])


def test_the_thresholds_are_the_documented_constants() -> None:
    assert CANDIDATES_MIN_IN_CONTEXT_ACCURACY == 0.9 == Thresholds().min_in_context_accuracy
    assert CHANCE_TOLERANCE == 0.05 == Thresholds().chance_tolerance
    assert CANDIDATES_ONLY == "candidates only (no binding)"


@pytest.mark.parametrize(
    ("accuracy", "expected"),
    [
        (0.25, CANDIDATES_ONLY),
        (0.30, CANDIDATES_ONLY),  # chance + tolerance: inclusive
        (0.20, CANDIDATES_ONLY),  # chance - tolerance: inclusive
        (0.3001, "induction"),
        (0.1999, "induction"),
        (0.32, "induction"),  # the quick H3: 7 points above chance binds in part
    ],
)
def test_candidates_only_around_the_chance_tolerance(accuracy, expected) -> None:
    label = label_mechanism(_table(accuracy, 1.0), n_layers=2, chance=0.25)
    assert label.label == expected, str(label)
    assert label.accuracy == accuracy and label.chance == 0.25


@pytest.mark.parametrize(
    ("in_context_accuracy", "expected"),
    [(0.9, CANDIDATES_ONLY), (0.95, CANDIDATES_ONLY), (0.8999, "induction"), (0.5, "induction")],
)
def test_candidates_only_around_the_in_context_accuracy_threshold(
    in_context_accuracy, expected
) -> None:
    label = label_mechanism(_table(0.25, in_context_accuracy), n_layers=2, chance=0.25)
    assert label.label == expected, str(label)


def test_candidates_only_comes_before_not_learned_and_inconclusive() -> None:
    """16 pairs at chance: o ≈ 1/16 < 0.2 would read "not learned", and a corruption that
    moves nothing "inconclusive"; both hide that the model picks from the context."""
    table = _table(1 / 16, 0.99, original=1 / 16, corrupted=1 / 16)
    assert label_mechanism(table, n_layers=2).label == "not learned"  # no chance: as before
    label = label_mechanism(table, n_layers=2, chance=1 / 16)
    assert label.label == CANDIDATES_ONLY
    assert "in-context accuracy 0.990" in str(label) and "chance" in str(label)
    table = _table(0.25, 0.99, original=0.25, corrupted=0.24)
    assert label_mechanism(table, n_layers=2).label == "inconclusive"
    assert label_mechanism(table, n_layers=2, chance=0.25).label == CANDIDATES_ONLY


def test_one_candidate_per_document_cannot_read_candidates_only() -> None:
    """At chance 1 (one candidate each), a perfect model's accuracy is at chance too, but
    binding and candidate-picking cannot be told apart: its restore label stands."""
    label = label_mechanism(_table(1.0, 1.0), n_layers=2, chance=1.0)
    assert label.label == "induction"
    # Near it, the label needs in-context accuracy to exceed accuracy by the tolerance.
    assert label_mechanism(_table(0.9, 0.95), n_layers=2, chance=0.9).label == "induction"
    assert label_mechanism(_table(0.5, 0.95), n_layers=2, chance=0.5).label == CANDIDATES_ONLY


def test_a_table_without_binding_scores_labels_as_before() -> None:
    table = _table(0.25, 1.0)
    table = table[~table.metric.isin(["accuracy", "in_context_accuracy", "in_context_mass"])]
    label = label_mechanism(table, n_layers=2, chance=0.25)
    assert label.label == "induction"
    assert label.accuracy is None and label.binding_line() == ""


# ---------------------------------------------------------------- end to end: a run folder


def candidates_only_model() -> torch.nn.Module:
    """tests/test_mechanism_labels.py's induction model with its layer-1 head blinded to the
    key: every position attends to position 2 (the first pair's value) and copies it, so the
    argmax is always an in-context value, the bound one only when the first pair is asked."""
    from test_mechanism_labels import BETA, POS, TOK, V

    model = hand_built_induction()
    wq, wk, wv, wo = (torch.zeros(D, D) for _ in range(4))
    for p in range(P):
        wq[POS + 2, POS + p] = BETA
        wk[POS + p, POS + p] = 1.0
    for t in range(V):
        wv[TOK + t, TOK + t] = 1.0
        wo[TOK + t, TOK + t] = 40.0
    set_head(model.layers[1].mixer, wq, wk, wv, wo)
    return model


def test_a_blinded_model_reads_candidates_only_in_a_run_folder(tmp_path) -> None:
    """mechanism.json, intervene's printed line and the summary column (end to end)."""
    from safetensors.torch import save_file

    from mecheval.training.config import config_from_data
    from mecheval.training.folder import MODEL_FILE, load_run
    from mecheval.training.run import train

    data = {
        "task": {**TASK.model_dump(), "n_train": 32, "n_dev": 512, "n_test": 8},
        "model": {"architecture": "attention", "d_model": D, "n_layers": 2, "max_len": P},
        "training": {"steps": 2, "batch_size": 16, "eval_every": 2, "threads": 1},
    }
    cfg = config_from_data(data, ["name=r"])
    run_dir = tmp_path / "r"
    assert train(cfg, run_dir)["state"] == "done"
    save_file(candidates_only_model().state_dict(), run_dir / MODEL_FILE)
    load_run(run_dir)  # the weights fit the config

    measured = intervene_run(run_dir, InterventionPlan(split="dev"))
    label = measured.label
    # Two values per document, the first one always picked: accuracy = the share of
    # documents that ask the first pair (0.486 of these 512), in-context accuracy 1.
    dev = build_datasets(cfg.task)["dev"]
    lower = (dev.roles["key"] == 1).double().mean().item()
    assert label.accuracy == pytest.approx(lower)
    assert label.in_context_accuracy == 1.0 and label.chance == 0.5
    assert abs(lower - 0.5) <= CHANCE_TOLERANCE
    assert label.label == CANDIDATES_ONLY, str(label)
    written = json.loads((run_dir / "mechanism.json").read_text())
    assert written["label"] == CANDIDATES_ONLY
    assert written["in_context_accuracy"] == 1.0 and written["chance"] == 0.5
    assert written["mean_candidates"] == 2.0
    assert written["accuracy"] == pytest.approx(lower)
    assert written["in_context_mass"] >= written["original"]
    assert written["thresholds"]["chance_tolerance"] == CHANCE_TOLERANCE

    _register()
    result = CliRunner().invoke(app, ["intervene", str(run_dir), "--split", "dev"])
    assert result.exit_code == 0, result.output
    assert "original documents: accuracy " in result.output
    assert "in-context accuracy 100.0%" in result.output
    assert "chance among the in-context candidates 50.0%" in result.output
    assert f"mechanism: {CANDIDATES_ONLY}" in result.output
    summary = mechanism_summary(tmp_path)
    assert summary.loc[0, "in-context acc %"] == 100.0 and summary.loc[0, "chance %"] == 50.0
    assert summary.loc[0, "mechanism"] == CANDIDATES_ONLY
    result = CliRunner().invoke(
        app, ["intervene", str(run_dir), "--split", "dev", "-n", "8", "--metric", "in_context_mass"]
    )
    assert result.exit_code == 0
    assert "in_context_mass of the candidates" in result.output
