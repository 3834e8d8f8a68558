"""Interventions on the documents that need their key (InterventionPlan.documents): ATR
answers that are the root's head are answered without the key, so corrupting it cannot move
them; leaving them out gives the restores range. Optional; "all" stays the paper's way."""

from __future__ import annotations

import json

import pytest
import torch

from mecheval.errors import ConfigError
from mecheval.experiments.mechanisms import InterventionPlan, eval_batch, intervene_run
from mecheval.tasks import ARConfig, ATRConfig, build_datasets
from mecheval.training.config import config_from_data
from mecheval.training.run import train

ATR = ATRConfig(n_train=0, n_dev=200, n_test=200)
ATR_LEFT = ATRConfig(n_train=0, n_dev=200, n_test=200, head="left", grammar_seed=2)


@pytest.mark.parametrize("cfg", [ATR, ATR_LEFT], ids=["right-headed", "left-headed"])
def test_key_free_documents_are_those_whose_answer_has_no_parent(cfg) -> None:
    """Checked against the stored derivations: the answer is the root's head exactly when its
    yield position has no parent."""
    ds = build_datasets(cfg)["dev"]
    mask = cfg.key_free(ds.batch(torch.arange(len(ds))))
    from_trees = torch.tensor(
        [ds.trees.parent_list(i)[int(ds.roles["value"][i]) - 1] == -1 for i in range(len(ds))]
    )
    assert torch.equal(mask, from_trees)
    assert 0.2 < mask.float().mean() < 0.8  # both kinds occur, so the test can fail


def test_key_dependent_documents_leave_out_exactly_the_root_head_answers() -> None:
    everything, _ = eval_batch(ATR, "dev", None)
    dependent, corrupted = eval_batch(ATR, "dev", None, documents="key-dependent")
    keep = ~ATR.key_free(everything)
    assert len(dependent) == int(keep.sum()) < len(everything)
    assert torch.equal(dependent.tokens, everything.tokens[keep][:, : dependent.tokens.shape[1]])
    # The counterfactual still changes exactly the key, to another terminal.
    changed = (corrupted.tokens != dependent.tokens).nonzero()
    assert torch.equal(changed[:, 0], torch.arange(len(dependent)))
    assert torch.equal(changed[:, 1], dependent.roles["key"])
    first, _ = eval_batch(ATR, "dev", 10, documents="key-dependent")
    assert torch.equal(first.answer, dependent.answer[:10])


def test_ar_documents_all_need_their_key_so_asking_for_them_is_one_clear_line() -> None:
    cfg = ARConfig(n_keys=8, n_values=8, n_pairs=2, n_train=0, n_dev=20, n_test=20)
    assert not cfg.has_key_free_documents and ATR.has_key_free_documents
    with pytest.raises(ConfigError, match="every document of the ar task needs its key"):
        eval_batch(cfg, "dev", None, documents="key-dependent")
    InterventionPlan(documents="key-dependent").check_tasks([ATR, ATR_LEFT])  # no error
    with pytest.raises(ConfigError, match="--documents key-dependent"):
        InterventionPlan(documents="key-dependent").check_tasks([ATR, cfg])
    InterventionPlan().check_tasks([cfg])  # all documents: nothing to check


def test_key_dependent_on_ar_writes_nothing(tmp_path, monkeypatch, capsys) -> None:
    from small_runs import config, run_cli

    run_dir = tmp_path / "r"
    assert train(config(), run_dir)["state"] == "done"
    before = sorted(p.name for p in run_dir.iterdir())
    code, out, err = run_cli(
        monkeypatch, capsys, "intervene", str(run_dir), "--documents", "key-dependent"
    )
    assert code == 2 and out == ""
    assert err.strip() == (
        "error: --documents key-dependent: every document of the ar task needs its key "
        "(none can be answered without it); use --documents all"
    )
    assert sorted(p.name for p in run_dir.iterdir()) == before
    out_dir = tmp_path / "runs"
    code, _, err = run_cli(
        monkeypatch, capsys, "reproduce", "ar", "--preset", "tiny", "--out", str(out_dir),
        "--documents", "key-dependent", "-q",
    )  # fmt: skip
    assert code == 2 and "every document of the ar task needs its key" in err
    assert not out_dir.exists()


def test_intervene_run_records_its_documents_and_remeasures_when_they_change(tmp_path) -> None:
    data = {
        "task": {"kind": "atr", "n_train": 64, "n_dev": 16, "n_test": 40},
        "model": {"architecture": "attention", "d_model": 16, "n_layers": 2},
        "training": {"steps": 2, "batch_size": 8, "eval_every": 2},
    }
    cfg = config_from_data(data, ["name=r"])
    assert train(cfg, tmp_path / "r")["state"] == "done"
    run_dir = tmp_path / "r"
    plan = InterventionPlan(sites=("layers.1.input",), documents="key-dependent")
    measured = intervene_run(run_dir, plan)
    written = json.loads((run_dir / "mechanism.json").read_text())
    everything, _ = eval_batch(cfg.task, "test", None)
    expected = int((~cfg.task.key_free(everything)).sum())
    assert written["documents"] == "key-dependent"
    assert written["n_docs"] == measured.n_docs == expected < 40
    assert written["range"] == pytest.approx(written["original"] - written["corrupted"])
    # Same choice: skipped. Another choice: measured again, on all 40 documents.
    assert intervene_run(run_dir, plan, skip_existing=True) is None
    again = intervene_run(run_dir, InterventionPlan(sites=("layers.1.input",)), skip_existing=True)
    assert again is not None and again.n_docs == 40


def test_documents_flag_is_checked(tmp_path, monkeypatch, capsys) -> None:
    from small_runs import run_cli

    code, _, err = run_cli(monkeypatch, capsys, "intervene", str(tmp_path), "--documents", "x")
    assert code == 2
    assert "--documents: expected all or key-dependent, got 'x'" in err
    with pytest.raises(ValueError, match="documents"):
        eval_batch(ATR, "dev", None, documents="some")
