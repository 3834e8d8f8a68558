"""`mecheval results --format csv|markdown|parquet` and `mecheval report --table` on a real
(tiny) experiment folder: every export reads back as the store's table, and a missing
optional dependency or an unreadable table is one line, not a traceback."""

from __future__ import annotations

import io
import subprocess
import sys

import pandas as pd
import pytest
from small_runs import run_cli

from mecheval.experiments.grid import SweepSpec
from mecheval.experiments.mechanisms import InterventionPlan
from mecheval.experiments.runners import run_sweep
from mecheval.experiments.store import load_results
from mecheval.report import load_table

NEEDS_PYARROW = "pyarrow (the 'parquet' extra, also in 'dev') is not installed"
EXTRA = "pip install 'mecheval[parquet]'"


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """Four tiny-preset runs, trained once for the module: attention (whose ``model.mixer``
    options block is empty) and mamba (with a mixer option, so the table has both a
    ``model.mixer`` and a ``model.mixer.d_conv`` column), each with a good LR and
    one that diverges (a failed run with a reason), with interventions for the figures."""
    out = tmp_path_factory.mktemp("runs")
    spec = SweepSpec(
        name="exp",
        base={
            "preset": "tiny",
            "task": "ar",
            "training": {"steps": 12, "eval_every": 6, "threads": 1},
        },
        grid={"model.architecture": ["attention", "mamba"], "training.lr": [3e-3, 1e6]},
        per_architecture={"mamba": {"model.mixer.d_conv": 2}},
    )
    outcomes = run_sweep(spec, out, plan=InterventionPlan(n_docs=8))
    assert [(o.name, o.state) for o in outcomes] == [
        ("attention-lr3e-3", "done"),
        ("attention-lr1e6", "failed"),
        ("mamba-lr3e-3", "done"),
        ("mamba-lr1e6", "failed"),
    ]
    return out / "exp"


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0]


def assert_same_table(read: pd.DataFrame, table: pd.DataFrame) -> None:
    """``read`` (an export read back) holds ``table``'s rows, columns and values."""
    assert list(read.columns) == list(table.columns)
    assert len(read) == len(table)
    assert read["run"].tolist() == table["run"].tolist()
    assert read["status"].tolist() == table["status"].tolist()
    for column in ("metric", "split", "site", "role"):
        assert read[column].fillna("").tolist() == table[column].fillna("").tolist(), column
    assert read["step"].tolist() == table["step"].tolist()
    assert read["value"].to_numpy() == pytest.approx(table["value"].to_numpy(), nan_ok=True)


# ---------------------------------------------------------------------- mecheval results


def test_the_experiment_table_mixes_runs_and_sources(experiment) -> None:
    table = load_results(experiment)
    assert set(table["source"]) == {"behavioural", "mechanistic"}
    failed = table[table["status"] == "failed"].drop_duplicates("run")
    assert sorted(failed["run"]) == ["attention-lr1e6", "mamba-lr1e6"]
    assert failed["reason"].str.startswith("diverged").all()
    # The column that broke the parquet export: an empty options block for attention.
    attention = table[table["model.architecture"] == "attention"]
    assert attention["model.mixer"].map(lambda v: v == {}).all()
    assert attention["model.mixer.d_conv"].isna().all()
    assert (table.loc[table["model.architecture"] == "mamba", "model.mixer.d_conv"] == 2).all()


def test_results_csv_to_stdout_and_to_a_file(experiment, tmp_path, monkeypatch, capsys) -> None:
    table = load_results(experiment)
    code, out, err = run_cli(monkeypatch, capsys, "results", str(experiment))
    assert code == 0, err
    assert_same_table(pd.read_csv(io.StringIO(out)), table)

    path = tmp_path / "results.csv"
    code, out, err = run_cli(
        monkeypatch, capsys, "results", str(experiment), "--format", "csv", "--out", str(path)
    )
    assert code == 0, err
    assert out.strip() == f"wrote {len(table)} rows to {path}"
    assert_same_table(pd.read_csv(path), table)
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]  # no temporary left


def test_results_markdown_to_stdout_and_to_a_file(
    experiment, tmp_path, monkeypatch, capsys
) -> None:
    table = load_results(experiment)
    code, out, err = run_cli(
        monkeypatch, capsys, "results", str(experiment), "--format", "markdown"
    )
    assert code == 0, err
    lines = out.rstrip("\n").splitlines()
    assert len(lines) == len(table) + 2  # header, rule, one line a row
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == list(table.columns)
    assert set(lines[1]) <= set("|-: ")
    assert [line.split("|")[1].strip() for line in lines[2:]] == table["run"].tolist()

    path = tmp_path / "results.md"
    code, _, err = run_cli(
        monkeypatch, capsys, "results", str(experiment), "--format", "markdown", "--out", str(path)
    )
    assert code == 0, err
    assert path.read_text() == out


def test_results_parquet_reads_back_as_the_table(experiment, tmp_path, monkeypatch, capsys):
    pytest.importorskip("pyarrow", reason=NEEDS_PYARROW)
    table = load_results(experiment)
    path = tmp_path / "results.parquet"
    code, out, err = run_cli(
        monkeypatch, capsys, "results", str(experiment), "--format", "parquet", "--out", str(path)
    )
    assert code == 0, err
    assert out.strip() == f"wrote {len(table)} rows to {path}"
    assert [p.name for p in tmp_path.iterdir()] == ["results.parquet"]
    read = pd.read_parquet(path)
    assert_same_table(read, table)
    # Typed columns stay typed; containers are written as the csv export writes them.
    assert read["training.lr"].tolist() == table["training.lr"].tolist()
    assert read["model.d_model"].dtype.kind == "i"
    by_arch = read.drop_duplicates("model.architecture").set_index("model.architecture")
    assert by_arch.loc["attention", "model.mixer"] == "{}"
    assert pd.isna(by_arch.loc["mamba", "model.mixer"])
    assert (
        by_arch.loc["mamba", "model.mixer.d_conv"]
        == table.loc[table["model.architecture"] == "mamba", "model.mixer.d_conv"].iloc[0]
    )
    assert read["training.betas"].iloc[0] == str(table["training.betas"].iloc[0])

    # The parquet and csv exports are the same table to the report.
    csv = tmp_path / "results.csv"
    table.to_csv(csv, index=False)
    a, b = load_table(path), load_table(csv)
    assert list(a.columns) == list(b.columns)
    for column in a.columns:
        x, y = a[column], b[column]
        same = (x.astype(object) == y.astype(object)) | (x.isna() & y.isna())
        assert same.all(), column


def without_pyarrow(*args: str, cwd) -> tuple[int, str, str]:
    """``mecheval ARGS`` in a fresh interpreter where ``import pyarrow`` fails, as without
    the extra: blocked before pandas is imported, which otherwise reads csv through it."""
    code = (
        "import sys; sys.modules['pyarrow'] = None; "
        "from mecheval.cli import main; sys.argv = ['mecheval', *sys.argv[1:]]; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    return done.returncode, done.stdout, done.stderr


def test_results_parquet_without_pyarrow_is_one_line(experiment, tmp_path) -> None:
    path = tmp_path / "results.parquet"
    code, _, err = without_pyarrow(
        "results", str(experiment), "--format", "parquet", "--out", str(path), cwd=tmp_path
    )
    assert_one_line_error(code, err, "--format parquet", "pyarrow", EXTRA)
    assert not list(tmp_path.iterdir())


def test_results_parquet_needs_out_and_formats_are_checked(experiment, monkeypatch, capsys) -> None:
    code, out, err = run_cli(monkeypatch, capsys, "results", str(experiment), "--format", "parquet")
    assert_one_line_error(code, err, "--format parquet", "--out")
    assert out == ""
    code, _, err = run_cli(monkeypatch, capsys, "results", str(experiment), "--format", "xlsx")
    assert_one_line_error(code, err, "--format", "'xlsx'")


# ---------------------------------------------------------------------- mecheval report --table


def report_from(monkeypatch, capsys, table, out_dir) -> str:
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "report",
        "--table",
        str(table),
        "--out",
        str(out_dir),
        "--format",
        "png",
    )
    assert code == 0, err
    return out


def test_report_from_a_csv_and_a_parquet_table(experiment, tmp_path, monkeypatch, capsys) -> None:
    direct = tmp_path / "direct"
    code, expected, err = run_cli(
        monkeypatch, capsys, "report", str(experiment), "--out", str(direct), "--format", "png"
    )
    assert code == 0, err
    assert "## ar-restore" in expected and "attention-lr1e6" in expected
    made = sorted(p.name for p in direct.iterdir())
    assert "ar-restore.png" in made and "ar-restore.md" in made

    csv = tmp_path / "results.csv"
    run_cli(monkeypatch, capsys, "results", str(experiment), "--out", str(csv))
    out = report_from(monkeypatch, capsys, csv, tmp_path / "from-csv")
    assert out.replace(str(tmp_path / "from-csv"), "") == expected.replace(str(direct), "")
    assert sorted(p.name for p in (tmp_path / "from-csv").iterdir()) == made

    pytest.importorskip("pyarrow", reason=NEEDS_PYARROW)
    parquet = tmp_path / "results.parquet"
    run_cli(
        monkeypatch,
        capsys,
        "results",
        str(experiment),
        "--format",
        "parquet",
        "--out",
        str(parquet),
    )
    out = report_from(monkeypatch, capsys, parquet, tmp_path / "from-parquet")
    assert out.replace(str(tmp_path / "from-parquet"), "") == expected.replace(str(direct), "")
    for name in made:
        if name.endswith(".md"):
            assert (tmp_path / "from-parquet" / name).read_text() == (direct / name).read_text()


def test_report_table_default_out_is_next_to_the_table(
    experiment, tmp_path, monkeypatch, capsys
) -> None:
    csv = tmp_path / "results.csv"
    load_results(experiment).to_csv(csv, index=False)
    code, _, err = run_cli(monkeypatch, capsys, "report", "--table", str(csv), "-f", "ar-restore")
    assert code == 0, err
    assert (tmp_path / "report" / "ar-restore.md").exists()


def test_report_parquet_table_without_pyarrow_is_one_line(tmp_path) -> None:
    table = tmp_path / "results.parquet"
    table.write_bytes(b"PAR1")
    code, _, err = without_pyarrow("report", "--table", str(table), cwd=tmp_path)
    assert_one_line_error(code, err, "--table", "pyarrow", EXTRA)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("garbage.parquet", b"not a parquet file at all"),
        ("empty.csv", b""),
        ("binary.csv", b"\xff\xfe\x00\x01garbage"),
    ],
)
def test_an_unreadable_table_is_one_line(name, content, tmp_path, monkeypatch, capsys) -> None:
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow", reason=NEEDS_PYARROW)
    table = tmp_path / name
    table.write_bytes(content)
    code, _, err = run_cli(monkeypatch, capsys, "report", "--table", str(table))
    assert_one_line_error(code, err, "--table", name, "not a readable results table")


def test_a_truncated_parquet_export_is_one_line(experiment, tmp_path, monkeypatch, capsys):
    pytest.importorskip("pyarrow", reason=NEEDS_PYARROW)
    path = tmp_path / "results.parquet"
    run_cli(
        monkeypatch, capsys, "results", str(experiment), "--format", "parquet", "--out", str(path)
    )
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    code, _, err = run_cli(monkeypatch, capsys, "report", "--table", str(path))
    assert_one_line_error(code, err, "--table", "results.parquet")
