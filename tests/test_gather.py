"""One grid from several sweep folders (experiments/gather.py): `mecheval results A B` and
`mecheval report A B` read the pieces of a grid as one, refuse two configs under one run
name, read a run where it finished, show a cut-off run as cut off (never as a result), need
no weights, and say which machine each run came from; a grid whose run diverged exits 0, one
whose run crashed exits 1."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import small_runs
from small_runs import run_cli
from test_resume_failures import exploding as exploding  # noqa: F401 - the fixture

from mecheval.experiments.grid import SweepSpec
from mecheval.experiments.mechanisms import InterventionPlan
from mecheval.experiments.runners import run_sweep
from mecheval.training.folder import MODEL_FILE, PROVENANCE_FILE, STATUS_FILE

SEEDS = [0, 1, 2, 3]


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    """A finished grid of four seeds (one sweep folder), with interventions for the report."""
    out = tmp_path_factory.mktemp("grid")
    spec = SweepSpec(
        name="g",
        base=small_runs.SWEEP_BASE,
        grid={"model.architecture": ["attention"], "training.seed": SEEDS},
    )
    assert {o.state for o in run_sweep(spec, out, plan=InterventionPlan(n_docs=8))} == {"done"}
    return out / "g"


def pieces(grid: Path, tmp_path: Path, *where: str) -> list[Path]:
    """The grid's runs split into folders ``a``/``b`` (``where[i]`` is seed i's folder), as
    pieces run on two machines and brought together, without their weights."""
    folders = {name: tmp_path / name / "g" for name in sorted(set(where))}
    for run, name in zip(sorted(p for p in grid.iterdir() if p.is_dir()), where, strict=False):
        if (run / "config.yaml").exists():
            shutil.copytree(
                run, folders[name] / run.name, ignore=shutil.ignore_patterns(MODEL_FILE)
            )
    return list(folders.values())


def results(monkeypatch, capsys, *folders: Path, extra=()) -> pd.DataFrame:
    code, out, err = run_cli(
        monkeypatch, capsys, "results", *map(str, folders), "--format", "csv", *extra
    )
    assert code == 0, err
    return pd.read_csv(io.StringIO(out))


def set_host(run: Path, device_name: str) -> None:
    path = run / PROVENANCE_FILE
    record = json.loads(path.read_text())
    record["sessions"][-1]["device_name"] = device_name
    path.write_text(json.dumps(record))


def test_two_pieces_read_as_the_whole_grid(grid, tmp_path, monkeypatch, capsys) -> None:
    a, b = pieces(grid, tmp_path, "a", "a", "b", "b")
    for run in b.iterdir():
        set_host(run, "NVIDIA H200")
    whole = results(monkeypatch, capsys, grid)
    merged = results(monkeypatch, capsys, a, b)
    assert sorted(merged.run.unique()) == sorted(whole.run.unique())
    # The same rows, the same values: the weights were not needed.
    columns = ["run", "status", "source", "split", "site", "role", "metric", "value"]
    key = ["run", "source", "split", "site", "role", "metric", "step", "condition"]
    left = whole.sort_values(key)[columns].reset_index(drop=True)
    right = merged.sort_values(key)[columns].reset_index(drop=True)
    pd.testing.assert_frame_equal(left, right)
    by_run = merged.drop_duplicates("run").set_index("run")
    on_b = sorted(p.name for p in b.iterdir())
    assert set(by_run.loc[on_b, "ran_on"]) == {"NVIDIA H200"}
    assert "NVIDIA H200" not in set(by_run.drop(index=on_b)["ran_on"])
    assert set(by_run["folder"]) == {"g"}
    # The report says which runs ran where, and draws the grid's figures from both pieces.
    out_dir = tmp_path / "report"
    code, out, err = run_cli(
        monkeypatch, capsys, "report", str(a), str(b), "--html", "--out", str(out_dir)
    )
    assert code == 0, err
    assert "## Where the runs ran" in out
    (h200,) = [line for line in out.splitlines() if "NVIDIA H200" in line]
    assert "| 2 |" in h200 and all(f"`{name}`" in h200 for name in on_b)
    assert "Where the runs ran" in (out_dir / "report.html").read_text()
    assert "Runs: 4 (0 failed)" in out


def test_the_mechanism_table_names_the_device_where_runs_differ(grid, tmp_path) -> None:
    from mecheval.experiments.reproduce import mechanisms_markdown

    (folder,) = pieces(grid, tmp_path, "a", "a", "a", "a")
    assert "ran on" not in mechanisms_markdown(folder)  # one machine: nothing to say
    runs = sorted(p for p in folder.iterdir() if p.is_dir())
    set_host(runs[-1], "NVIDIA H200")
    table = mechanisms_markdown(folder)
    assert "ran on" in table
    (line,) = [row for row in table.splitlines() if runs[-1].name in row]
    assert "NVIDIA H200" in line


def test_two_configs_under_one_run_name_are_refused(grid, tmp_path, monkeypatch, capsys) -> None:
    a, b = pieces(grid, tmp_path, "a", "a", "b", "b")
    clash = b / sorted(p.name for p in a.iterdir())[0]
    shutil.copytree(a / clash.name, clash)
    config = clash / "config.yaml"
    config.write_text(config.read_text().replace("lr: 0.001", "lr: 0.002"))
    for command in ("results", "report"):
        code, out, err = run_cli(monkeypatch, capsys, command, str(a), str(b))
        assert code == 2
        (line,) = err.strip().splitlines()
        assert str(a / clash.name) in line and str(clash) in line
        assert "training.lr: 0.001 vs 0.002" in line
    assert not (a / "report-merged").exists()  # nothing written


def test_a_run_finished_in_two_pieces_is_refused(grid, tmp_path, monkeypatch, capsys) -> None:
    a, b = pieces(grid, tmp_path, "a", "a", "b", "b")
    twice = sorted(p.name for p in a.iterdir())[0]
    shutil.copytree(a / twice, b / twice)
    code, _, err = run_cli(monkeypatch, capsys, "results", str(a), str(b))
    assert code == 2 and f"run {twice!r} finished in both" in err


def test_a_cut_off_run_is_shown_as_such_never_as_a_result(
    grid, tmp_path, monkeypatch, capsys
) -> None:
    a, b = pieces(grid, tmp_path, "a", "a", "b", "b")
    runs = sorted(p.name for p in b.iterdir())
    # Run 0 of b was cut off (its status says running; no process holds it) ...
    cut = b / runs[0]
    status = json.loads((cut / STATUS_FILE).read_text())
    (cut / STATUS_FILE).write_text(json.dumps({**status, "state": "running", "step": 6}))
    table = results(monkeypatch, capsys, a, b).drop_duplicates("run").set_index("run")
    assert table.loc[runs[0], "status"] == "cut off"
    assert set(table.drop(index=runs[0])["status"]) == {"done"}
    # ... and its values are not in the report's cells.
    code, out, err = run_cli(monkeypatch, capsys, "report", str(a), str(b))
    assert code == 0, err
    assert "Runs: 4 (0 failed, 1 cut off)" in out and "Unfinished runs are not in" in out
    assert "over 3 seeds" in out  # the cells average the three finished runs
    # A run cut off in one piece and finished in another is read where it finished.
    shutil.copytree(grid / runs[0], a / runs[0], ignore=shutil.ignore_patterns(MODEL_FILE))
    table = results(monkeypatch, capsys, a, b).drop_duplicates("run").set_index("run")
    assert table.loc[runs[0], "status"] == "done"


def test_a_diverged_run_exits_0_and_a_crashed_one_exits_1(
    tmp_path, monkeypatch, capsys, exploding
) -> None:
    base = {**small_runs.SWEEP_BASE, "training": {**small_runs.SWEEP_BASE["training"]}}
    sweep = tmp_path / "diverging.yaml"
    sweep.write_text(json.dumps({"name": "d", "base": base, "grid": {"training.lr": [3e-3, 1e6]}}))
    code, out, err = run_cli(monkeypatch, capsys, "sweep", str(sweep), "--out", str(tmp_path), "-q")
    assert code == 0, err
    statuses = {
        p.name: json.loads((p / STATUS_FILE).read_text()) for p in (tmp_path / "d").iterdir()
    }
    assert sorted(s["state"] for s in statuses.values()) == ["done", "failed"]
    assert any(str(s.get("reason", "")).startswith("diverged") for s in statuses.values())
    crash = tmp_path / "crashing.yaml"
    model = {**base["model"], "architecture": "exploding"}
    crash.write_text(
        json.dumps(
            {"name": "c", "base": {**base, "model": model}, "grid": {"model.mixer.explode": [True]}}
        )
    )
    code, out, err = run_cli(monkeypatch, capsys, "sweep", str(crash), "--out", str(tmp_path), "-q")
    assert code == 1
    (run,) = (tmp_path / "c").iterdir()
    assert json.loads((run / STATUS_FILE).read_text())["reason"].startswith("crashed")
