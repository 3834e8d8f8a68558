"""Where a run came from (training/provenance.py): every run folder's provenance.json,
written when a session starts and completed when it ends, with fingerprints of the run's
documents and initial weights; `mecheval results --provenance` reads it."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest
import torch
from small_runs import config, run_cli
from test_resume_failures import Crash
from test_training_group import run_both
from test_training_group import spy as spy  # noqa: F401 - the fixture

from mecheval.tasks import build_datasets
from mecheval.training import resolve, train
from mecheval.training.folder import PROVENANCE_FILE, read_provenance
from mecheval.training.provenance import device_name, documents_fingerprint, fingerprint


@pytest.fixture(scope="module")
def data():
    return build_datasets(resolve(config()).task)


def test_a_finished_run_records_its_session_software_machine_and_fingerprints(
    tmp_path: Path, data
) -> None:
    status = train(config(), tmp_path / "run", datasets=data)
    record = read_provenance(tmp_path / "run")
    (session,) = record["sessions"]
    assert session["state"] == "done" and session["step"] == status["step"] == 8
    assert session["started"] <= session["ended"]
    assert session["torch"] == torch.__version__
    assert session["python"] == platform.python_version()
    assert session["device"] == "cpu" and session["device_name"] == device_name(torch.device("cpu"))
    assert session["precision"] == "fp32" and session["compile"] is False
    assert session["cuda"] is None  # a CPU run: no CUDA, cuDNN or Triton version
    # The documents' fingerprint is that of the documents, whoever builds them.
    assert record["documents"] == documents_fingerprint(build_datasets(resolve(config()).task))


def test_fingerprints_follow_the_documents_and_the_initial_weights(tmp_path: Path, data) -> None:
    train(config(seed=0), tmp_path / "a", datasets=data)
    train(config(seed=0, lr=1e-2), tmp_path / "b", datasets=data)  # same init, other LR
    train(config(seed=1), tmp_path / "c", datasets=data)
    other_task = config(task={**config().task.model_dump(), "seed": 4})
    train(other_task, tmp_path / "d")
    a, b, c, d = (read_provenance(tmp_path / n) for n in "abcd")
    assert a["initial_weights"] == b["initial_weights"] != c["initial_weights"]
    assert a["documents"] == b["documents"] == c["documents"] != d["documents"]
    # Of the weights before the first step, not the final ones.
    from safetensors.torch import load_file

    assert a["initial_weights"] != fingerprint(load_file(tmp_path / "a" / "model.safetensors"))


def test_a_resumed_run_adds_a_session_and_keeps_its_fingerprints(tmp_path: Path, data) -> None:
    def crash_at_8(step, model, run_dir):
        if step == 8:
            raise Crash("simulated crash")

    run = tmp_path / "run"
    with pytest.raises(Crash):
        train(config(checkpoint_every=4), run, datasets=data, callbacks=[crash_at_8])
    first = read_provenance(run)
    assert [s["state"] for s in first["sessions"]] == ["failed"]
    train(config(checkpoint_every=4), run, datasets=data)
    record = read_provenance(run)
    assert [s["state"] for s in record["sessions"]] == ["failed", "done"]
    assert record["sessions"][0] == first["sessions"][0]  # the first session kept as it was
    assert record["documents"] == first["documents"]
    assert record["initial_weights"] == first["initial_weights"]


def test_a_stacked_member_records_what_its_run_alone_records(tmp_path: Path, data, spy) -> None:
    cfgs = [config(seed=0), config(seed=1, lr=1e-2)]
    run_both(tmp_path, cfgs, data, spy)
    spy.assert_stacked(8, [2] * 8)  # trained as a stack
    for i in range(2):
        grouped, alone = read_provenance(tmp_path / f"g{i}"), read_provenance(tmp_path / f"s{i}")
        assert grouped["documents"] == alone["documents"]
        assert grouped["initial_weights"] == alone["initial_weights"]
        assert [s["state"] for s in grouped["sessions"]] == ["done"]


def test_a_damaged_provenance_file_is_started_again_not_fatal(tmp_path: Path, data) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / PROVENANCE_FILE).write_text("{not json")
    assert train(config(), run, datasets=data)["state"] == "done"
    assert len(read_provenance(run)["sessions"]) == 1


def test_results_provenance_shows_one_row_per_run_and_what_changed(
    tmp_path: Path, data, monkeypatch, capsys
) -> None:
    sweep = tmp_path / "sweep"
    train(config(seed=0), sweep / "a", datasets=data)
    train(config(seed=1), sweep / "b", datasets=data)
    # Run b's second session on another host with another torch (as a resumed run would be).
    path = sweep / "b" / PROVENANCE_FILE
    record = json.loads(path.read_text())
    record["sessions"].append({**record["sessions"][0], "host": "other", "torch": "9.9"})
    path.write_text(json.dumps(record))
    code, out, err = run_cli(
        monkeypatch, capsys, "results", str(sweep), "--provenance", "--format", "csv"
    )
    assert code == 0, err
    import io

    import pandas as pd

    table = pd.read_csv(io.StringIO(out))
    assert list(table.run) == ["a", "b"]
    assert list(table.sessions) == [1, 2]
    assert list(table.torch) == [torch.__version__, "9.9"]
    assert table.changed.fillna("").tolist() == ["", "torch, host"]
    assert table.documents.nunique() == 1 and table.initial_weights.nunique() == 2
