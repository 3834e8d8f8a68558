"""Interventions on run folders: after training, during training, in the store, via the CLI."""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file
from test_mechanism_labels import D, P, hand_built_induction
from typer.testing import CliRunner

from mecheval.cli import _register, app, main
from mecheval.experiments.grid import SweepSpec
from mecheval.experiments.mechanisms import EmergenceCallback, InterventionPlan, intervene_run
from mecheval.experiments.runners import run_sweep
from mecheval.experiments.store import load_results
from mecheval.models import build_model
from mecheval.report import FIGURES, normalise
from mecheval.training.config import config_from_data
from mecheval.training.folder import MODEL_FILE, load_run
from mecheval.training.run import train

BASE = {
    "task": {
        "kind": "ar",
        "n_keys": 4,
        "n_values": 4,
        "n_pairs": 1,
        "n_train": 256,
        "n_dev": 16,
        "n_test": 16,
    },
    "model": {"architecture": "attention", "d_model": 16, "n_layers": 2, "init_std": 0.1},
    "training": {"steps": 40, "batch_size": 16, "eval_every": 20, "threads": 1, "lr": 3e-3},
}


def trained_run(tmp_path, callbacks=()):
    cfg = config_from_data(json.loads(json.dumps(BASE)), ["name=r"])
    status = train(cfg, tmp_path / "r", callbacks=callbacks)
    assert status["state"] == "done"
    return cfg, tmp_path / "r"


def untrained(model_cfg):
    torch.manual_seed(0)
    return build_model(model_cfg)


def run_with_weights(tmp_path, weights):
    """A finished run folder of the hand-built model's task and width, holding ``weights``."""
    data = json.loads(json.dumps(BASE))
    data["task"].update(n_pairs=2, n_dev=64)  # the hand-built model's task and width
    data["model"].update(d_model=D, max_len=P)
    data["training"].update(steps=4, eval_every=4)
    cfg = config_from_data(data, ["name=r"])
    run_dir = tmp_path / "r"
    assert train(cfg, run_dir)["state"] == "done"
    save_file(weights(load_run(run_dir)[0].model).state_dict(), run_dir / MODEL_FILE)
    return run_dir


@pytest.mark.parametrize(
    ("weights", "expected"),
    [(lambda _: hand_built_induction(), "induction"), (untrained, "not learned")],
    ids=["induction", "untrained"],
)
def test_intervene_run_writes_tidy_rows_and_a_label(tmp_path, weights, expected) -> None:
    """A run folder whose weights have a known mechanism (tests/test_mechanism_labels.py's
    hand-built induction model, or an untrained model) gets that label."""
    run_dir = run_with_weights(tmp_path, weights)
    measured = intervene_run(run_dir, InterventionPlan(split="dev"))
    on_disk = pd.read_csv(run_dir / "interventions.csv", keep_default_na=False)
    assert len(on_disk) == len(measured.rows)
    assert measured.label.label == expected
    restored = on_disk[on_disk.condition == "restored"]
    sites = set(restored.site)
    assert "layers.1.mixer.output" in sites and "final_norm.input" in sites
    row = restored[restored.site == "layers.1.mixer.output"].iloc[0]
    assert (row.layer, row.component, row.io) == (1, "mixer", "output")
    assert set(on_disk.step) == {4}
    label = json.loads((run_dir / "mechanism.json").read_text())
    assert label["site"] == "layers.1.input"
    assert label["label"] == expected, label
    # The label was read from the numbers written beside it.
    likelihood = on_disk[on_disk.metric == "likelihood"]
    for condition in ("original", "corrupted"):
        value = likelihood[likelihood.condition == condition].value.iloc[0]
        assert label[condition] == pytest.approx(value)
    restored_rows = likelihood[
        (likelihood.condition == "restored") & ~likelihood.role.str.startswith("null ")
    ]
    at_site = restored_rows[restored_rows.site == label["site"]]
    assert label["restored"] == pytest.approx(dict(zip(at_site.role, at_site.value, strict=True)))
    if expected == "induction":
        # Restoring the value (where layer 0 associated the key) brings the answer back.
        assert label["original"] > 0.9 and label["recovered"]["value"] > 0.9
        assert max(label["recovered"], key=label["recovered"].get) == "value"
    else:
        assert label["original"] < 0.2


def test_intervene_at_sites_without_a_label_prints_their_table_and_keeps_the_label(
    tmp_path, monkeypatch, capsys
) -> None:
    """Sites the label is not read at (here the first block's input; a recurrent state's
    site alike): their restore table, one line naming the label's site, exit 0; the
    restores written, the label read before from the label's site kept."""
    from small_runs import run_cli

    run_dir = run_with_weights(tmp_path, lambda _: hand_built_induction())
    code, out, err = run_cli(monkeypatch, capsys, "intervene", str(run_dir), "--split", "dev")
    assert code == 0, err
    before = (run_dir / "mechanism.json").read_text()
    assert json.loads(before)["label"] == "induction"

    args = ("intervene", str(run_dir), "--split", "dev", "--sites", "layers.0.input")
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert (code, err) == (0, "")
    restores, intervals = out.split("95 % intervals of the restores")
    for table in (restores, intervals):  # each table: the asked site alone
        rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| l")]
        assert rows == ["layers.0.input"]
    assert (
        "mechanism: not read here; a label is read from the key, value and query restores at "
        "layers.1.input (add --sites layers.1.input)"
    ) in out.splitlines()
    written = pd.read_csv(run_dir / "interventions.csv", keep_default_na=False)
    assert set(written[written.condition == "restored"].site) == {"layers.0.input"}
    assert (run_dir / "mechanism.json").read_text() == before


def test_emergence_callback_records_every_evaluation_and_survives_resume(tmp_path) -> None:
    cfg = config_from_data(json.loads(json.dumps(BASE)), ["name=r"])
    callback = EmergenceCallback(cfg.task, n_layers=2, n_docs=8)
    _, run_dir = trained_run(tmp_path, callbacks=[callback])
    rows = pd.read_csv(run_dir / "emergence.csv", keep_default_na=False)
    assert sorted(set(rows.step)) == [0, 20, 40]
    restored = rows[rows.condition == "restored"]
    assert set(restored.role) == {"key", "value", "query"}
    assert set(restored.site) == {"layers.1.input"}
    # A resumed run re-measures from its checkpoint on: no step appears twice.
    callback(20, load_run(run_dir)[1], run_dir)
    again = pd.read_csv(run_dir / "emergence.csv", keep_default_na=False)
    assert sorted(set(again.step)) == [0, 20]
    assert len(again[again.step == 20]) == len(rows[rows.step == 20])


def test_a_sweep_with_interventions_feeds_the_store_and_the_report(tmp_path) -> None:
    spec = SweepSpec(name="mech", base=BASE, grid={"model.architecture": ["attention", "mamba"]})
    plan = InterventionPlan(during_training=True, n_docs=8)
    outcomes = run_sweep(spec, tmp_path, plan=plan)
    assert [o.state for o in outcomes] == ["done", "done"]
    table = load_results(tmp_path / "mech")
    mech = table[table.source == "mechanistic"]
    assert set(mech.run) == {"attention", "mamba"}
    assert {"original", "corrupted", "restored"} <= set(mech.condition)
    assert len(set(mech.step)) == 3  # emergence at 0, 20, 40 (+ the final set at 40)
    result = FIGURES["ar-restore"](normalise(table))
    assert "Attention" in result.markdown and "Mamba" in result.markdown


def test_intervene_cli_prints_the_table_and_label(tmp_path, monkeypatch, capsys) -> None:
    _register()
    _, run_dir = trained_run(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["intervene", str(run_dir), "--split", "dev", "-n", "8"])
    assert result.exit_code == 0, result.output
    assert "@ value" in result.output and "mechanism:" in result.output
    assert (run_dir / "interventions.csv").exists()
    monkeypatch.setattr(sys, "argv", ["mecheval", "intervene", str(run_dir), "--sites", "x.y"])
    with pytest.raises(SystemExit) as info:
        main()
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and err.startswith("error: --sites") and "\n" not in err
