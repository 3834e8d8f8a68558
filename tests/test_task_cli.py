"""`mecheval task show|stats`."""

from __future__ import annotations

import re
import sys

import pytest
from typer.testing import CliRunner

from mecheval.cli import _register, app, main
from mecheval.cli.task import task_config
from mecheval.tasks import QUERY_TYPES, ROLES, build_datasets

_register()
runner = CliRunner()

LINE = re.compile(r"(\d+): (.*) -> (\S+)(?: \((\w+)\))?")
MARK = re.compile(r"\[([a-z_,]+):(\S+)\]")


def parse_show(output: str) -> list[tuple[list[str], dict[str, int], str, str | None]]:
    """`task show` lines -> (tokens, {role: position}, answer, query type) per document.

    A marked token reads ``[role,role:name]``; its position is its index in the line's
    document, as the roles index ``ds.document(i)``.
    """
    docs = []
    lines = [ln for ln in output.splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        match = LINE.fullmatch(line)
        assert match, line
        assert int(match.group(1)) == i
        tokens: list[str] = []
        roles: dict[str, int] = {}
        for pos, part in enumerate(match.group(2).split(" ")):
            mark = MARK.fullmatch(part)
            if mark:
                for role in mark.group(1).split(","):
                    assert role not in roles, f"{role} marked twice: {line}"
                    roles[role] = pos
                part = mark.group(2)
            assert "[" not in part and "]" not in part, line
            tokens.append(part)
        assert sorted(roles) == sorted(ROLES), line  # every role marked exactly once
        docs.append((tokens, roles, match.group(3), match.group(4)))
    return docs


def test_show_ar_marks_roles():
    args = ["--set", "task.n_pairs=4", "--set", "n_keys=16", "--set", "n_values=16",
            "--set", "min_pairs=1"]  # fmt: skip
    result = runner.invoke(app, ["task", "show", "ar", "-n", "12", *args])
    assert result.exit_code == 0, result.output
    docs = parse_show(result.output)
    assert len(docs) == 12
    last_pair = 0
    for tokens, roles, answer, qtype in docs:
        line = " ".join(tokens)
        key, value, div, query = (roles[r] for r in ("key", "value", "divider", "query"))
        # <bos> k v ... k v <div> q: the divider and the query close the document.
        assert tokens[0] == "<bos>" and qtype is None, line
        assert query == len(tokens) - 1 and tokens[query].startswith("k"), line
        assert div == query - 1 and tokens[div] == "<div>", line
        context = tokens[1:div]
        assert all(t.startswith("k" if j % 2 == 0 else "v") for j, t in enumerate(context))
        # The key mark sits on the context's (only) instance of the query token, in a key slot.
        assert tokens[key] == tokens[query] and context.count(tokens[query]) == 1, line
        assert key % 2 == 1 and key < div, line
        # The value mark is the token right after the key, and it is the answer.
        assert value == key + 1 and tokens[value] == answer and answer.startswith("v"), line
        # next_key: the token after the value (the next pair's key, or the divider).
        assert roles["next_key"] == value + 1, line
        last_pair += roles["next_key"] == div
    assert 0 < last_pair < len(docs)  # both kinds of next_key were checked


def test_show_atr_mixed_test_split():
    result = runner.invoke(
        app, ["task", "show", "atr", "-n", "12", "--split", "test", "--set", "query=mixed"]
    )
    assert result.exit_code == 0, result.output
    docs = parse_show(result.output)
    assert len(docs) == 12
    # The same documents, with their derivation trees: the value mark must sit on the key's
    # relative that the document's query type asks for.
    cfg = task_config("atr", ["query=mixed"], n_train=0, n_dev=0, n_test=12)
    ds = build_datasets(cfg)["test"]
    names = ds.id_names
    seen = set()
    for i, (tokens, roles, answer, qtype) in enumerate(docs):
        line = " ".join(tokens)
        assert tokens == [names[t] for t in ds.document(i)], line
        key, value, div, query = (roles[r] for r in ("key", "value", "divider", "query"))
        # <bos> yield <div> <qtype> q
        assert tokens[0] == "<bos>" and query == len(tokens) - 1, line
        assert tokens[div] == "<div>" and div == query - 2, line
        assert qtype in QUERY_TYPES and tokens[div + 1] == f"<{qtype}>", line
        seen.add(qtype)
        # The key is the rightmost instance, in the yield, of the queried terminal.
        yield_ = tokens[1:div]
        assert tokens[key] == tokens[query] and tokens[query].startswith("t"), line
        assert 0 < key < div and len(yield_) - yield_[::-1].index(tokens[query]) == key, line
        # The value is the answer, and is the key's relative of the query's type.
        assert tokens[value] == answer and 0 < value < div, line
        assert roles["next_key"] == value + 1, line
        parents = ds.trees.parent_list(i)
        child, parent = key - 1, parents[key - 1]  # yield positions (after <bos>)
        if qtype == "parent":
            assert value - 1 == parent, line
        elif qtype == "grandparent":
            assert value - 1 == parents[parent], line
        else:  # sibling: the rightmost child of the key's parent (possibly the key itself)
            siblings = [j for j, p in enumerate(parents) if p == parent]
            assert child in siblings and value - 1 == max(siblings), line
    assert len(seen) >= 2  # more than one query type was checked


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
