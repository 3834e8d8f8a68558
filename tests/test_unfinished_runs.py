"""A run says what state it is in: `mecheval intervene` on a run that is not done names its
state in one line (still training, cut off, failed), and where such a run has weights all the
same, its label is marked as read from an unfinished run (stderr, the printed label and
mechanism.json)."""

from __future__ import annotations

import json

import pytest
from small_runs import config, run_cli
from test_resume_failures import Crash

from mecheval.training import train
from mecheval.training.folder import RunFolder, unfinished, write_status


@pytest.fixture
def done_run(tmp_path):
    run_dir = tmp_path / "r"
    assert train(config(), run_dir)["state"] == "done"
    return run_dir


def test_a_crashed_run_is_named_as_such_and_nothing_is_written(tmp_path, monkeypatch, capsys):
    def crash_at_4(step, model, run_dir):
        if step == 4:
            raise Crash("simulated crash")

    run_dir = tmp_path / "r"
    with pytest.raises(Crash):
        train(config(), run_dir, callbacks=[crash_at_4])
    before = sorted(p.name for p in run_dir.iterdir())
    code, out, err = run_cli(monkeypatch, capsys, "intervene", str(run_dir))
    assert code == 2 and out == ""
    assert err.strip() == (
        f"error: {run_dir}: failed at step 4 of 8: crashed: Crash: simulated crash; "
        "no model.safetensors to read"
    )
    assert sorted(p.name for p in run_dir.iterdir()) == before


def test_running_and_cut_off_runs_are_told_apart(done_run) -> None:
    assert unfinished(done_run) is None
    write_status(done_run, state="running", step=4, total_steps=8)
    assert unfinished(done_run) == (
        "cut off at step 4 of 8: no process trains it (run it again to resume)"
    )
    with RunFolder(done_run, config()).locked():  # as a process training it holds it
        assert unfinished(done_run) == "still training (step 4 of 8)"
    (done_run / "status.json").unlink()
    assert unfinished(done_run) == "not started"


def test_a_label_read_from_an_unfinished_run_is_marked(done_run, monkeypatch, capsys) -> None:
    code, out, err = run_cli(monkeypatch, capsys, "intervene", str(done_run))
    assert code == 0 and "unfinished" not in out + err
    assert "unfinished_run" not in json.loads((done_run / "mechanism.json").read_text())

    write_status(done_run, state="running", step=4, total_steps=8)
    code, out, err = run_cli(monkeypatch, capsys, "intervene", str(done_run))
    state = "cut off at step 4 of 8: no process trains it (run it again to resume)"
    assert code == 0
    assert err.strip() == (
        f"warning: {done_run}: {state}; its weights are not its final ones, and its label "
        "is marked as read from an unfinished run"
    )
    (label_line,) = [line for line in out.splitlines() if line.startswith("mechanism:")]
    assert label_line.endswith(f" (read from an unfinished run: {state})")
    assert json.loads((done_run / "mechanism.json").read_text())["unfinished_run"] == state
