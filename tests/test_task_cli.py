"""`mecheval task show|stats`."""

from __future__ import annotations

import re
import sys

import pytest
from typer.testing import CliRunner

from mecheval.cli import _register, app, main

_register()
runner = CliRunner()


def test_show_ar_marks_roles():
    result = runner.invoke(app, ["task", "show", "ar", "-n", "2", "--set", "task.n_pairs=4",
                                 "--set", "n_keys=16", "--set", "n_values=16"])  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 2
    for line in lines:
        assert line.count("[key:k") == 1 and "[value:v" in line and "[query:k" in line
        assert "[divider:<div>]" in line and " -> v" in line
        # The marked key and the query name the same key.
        key = line.split("[key:")[1].split("]")[0]
        assert f"[query:{key}]" in line


def test_show_atr_mixed_test_split():
    result = runner.invoke(
        app, ["task", "show", "atr", "-n", "3", "--split", "test", "--set", "query=mixed"]
    )
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    # The key marks a terminal, alone or with other roles on it ("[key,value:t3]" when a
    # sibling query's child is its own rightmost sibling).
    key = re.compile(r"\[key(,\w+)*:t\d+\]")
    assert len(lines) == 3 and all(key.search(ln) and " -> t" in ln for ln in lines)


def test_stats_atr():
    result = runner.invoke(app, ["task", "stats", "atr", "-n", "200"])
    assert result.exit_code == 0, result.output
    for name in ("document length", "tree depth", "branching factor", "non-unique terminals",
                 "key-value distance", "key-query distance"):  # fmt: skip
        assert name in result.output


def test_stats_ar():
    result = runner.invoke(app, ["task", "stats", "ar", "-n", "50"])
    assert result.exit_code == 0, result.output
    assert "key-query distance" in result.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["task", "show", "ar", "--set", "n_pairs=5000"], "task.n_pairs"),
        (["task", "show", "atr", "--set", "max_rhs=1"], "task.max_rhs"),
        (["task", "show", "ar", "--set", "n_pairs"], "--set"),
        (["task", "show", "ar", "--set", "bogus=1"], "task.bogus"),
        (["task", "show", "nope"], "task"),
        (["task", "stats", "ar", "--split", "val"], "--split"),
        (["task", "show", "ar", "-n", "0"], "-n"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, needle, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["mecheval", *args])
    with pytest.raises(SystemExit) as info:
        main()
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and needle in err
    assert "Traceback" not in err
