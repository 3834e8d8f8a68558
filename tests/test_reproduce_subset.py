"""`mecheval reproduce NAME --widths/--lrs/--seeds`: a slice of an experiment's grid, checked
against the grid it would run at that preset, trained into the experiment's own folder."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

from mecheval.cli import _register, app
from mecheval.cli import experiments as experiments_cli
from mecheval.cli.experiments import reproduce_spec
from mecheval.errors import ConfigError
from mecheval.experiments.catalog import PAPER_WIDTHS, _archs
from mecheval.experiments.grid import expand
from mecheval.tasks import get_task
from mecheval.training.presets import preset


def invoke(*args: str):
    _register()
    return CliRunner().invoke(app, list(args))


def test_a_paper_column_keeps_the_chosen_widths_and_lrs_for_every_architecture() -> None:
    full = reproduce_spec("ar", "paper")[1]
    assert full.grid["model.d_model"] == PAPER_WIDTHS  # the slice below is a real cut
    assert full.grid["training.lr"] == list(get_task("ar").paper_lrs)

    _, spec = reproduce_spec("ar", "paper", widths="64", lrs="1e-3,3e-4")
    # The grid's order and values (LRs compared as numbers): 0.001 is the grid's 1e-3.
    assert spec.grid == {
        "model.architecture": _archs(),
        "model.d_model": [64],
        "training.lr": [3e-4, 1e-3],
    }
    assert len(_archs()) == 7
    assert reproduce_spec("ar", "paper", widths="64", lrs="0.0003, 0.0010")[1].grid == spec.grid
    # The same folder and run names as the full grid, so a full run resumes the slice.
    assert spec.name == full.name == "ar-paper"
    names = [r.name for r in expand(spec)]
    assert len(names) == 14 and "mamba-d64-lr1e-3" in names
    assert set(names) <= {r.name for r in expand(full)}


def test_archs_and_a_subset_combine() -> None:
    _, spec = reproduce_spec("ar", "paper", "attention,mamba", widths="64", lrs="1e-3,3e-4")
    assert spec.grid == {
        "model.architecture": ["attention", "mamba"],
        "model.d_model": [64],
        "training.lr": [3e-4, 1e-3],
    }
    assert sorted(r.name for r in expand(spec)) == [
        "attention-d64-lr1e-3",
        "attention-d64-lr3e-4",
        "mamba-d64-lr1e-3",
        "mamba-d64-lr3e-4",
    ]


def test_an_axis_the_preset_does_not_sweep_accepts_its_one_value_only() -> None:
    # tiny/quick: one width and one LR per run, no width or LR in the grid; seeds: 0 always.
    tiny = preset("tiny", "ar")
    _, spec = reproduce_spec(
        "ar",
        "tiny",
        "attention",
        widths=str(tiny["model"]["d_model"]),
        lrs=str(tiny["training"]["lr"]),
        seeds="0",
    )
    assert spec.grid == {"model.architecture": ["attention"]}  # run names unchanged
    # quick tunes the AR LR per architecture: one LR is fine where the chosen ones share it.
    _, spec = reproduce_spec("ar", "quick", "mamba,hyena", widths="64", lrs="3e-3")
    assert spec.grid == {"model.architecture": ["mamba", "hyena"]}
    # The seed is not swept at paper either: the runs' own seed changes nothing ...
    _, spec = reproduce_spec("atr", "paper", widths="32", seeds="0")
    assert spec.grid["model.d_model"] == [32]
    assert "training.seed" not in spec.grid


def test_more_seeds_add_a_seed_axis() -> None:
    # ... and more seeds add the axis, so each configuration trains once per seed; the runs'
    # own seed keeps the name it has without the axis, the other seeds carry theirs.
    _, spec = reproduce_spec("ar", "paper", "attention", widths="64", lrs="1e-3", seeds="0,1")
    assert spec.grid["training.seed"] == [0, 1]
    names = [run.name for run in expand(spec)]
    assert names == ["attention-d64-lr1e-3", "attention-d64-lr1e-3-s1"]
    alone = reproduce_spec("ar", "paper", "attention", widths="64", lrs="1e-3")[1]
    assert [run.name for run in expand(alone)] == names[:1]
    _, other = reproduce_spec("ar", "paper", "attention", widths="64", lrs="1e-3", seeds="1,2")
    assert [run.name for run in expand(other)] == [names[1], "attention-d64-lr1e-3-s2"]


BAD = [
    # (arguments, flag, text the one-line error must hold)
    (["ar", "--preset", "paper", "--widths", "64,65"], "--widths", "65 not in the grid"),
    (["ar", "--preset", "paper", "--widths", "64,65"], "--widths", "16, 32, 64, 128, 256"),
    (["ar", "--preset", "paper", "--widths", "6.4"], "--widths", "comma-separated integers"),
    (["ar", "--preset", "paper", "--lrs", "1e-3,5e-5"], "--lrs", "5e-5 not in the grid"),
    (["atr", "--preset", "paper", "--lrs", "3e-2"], "--lrs", "allowed: 3e-5, 1e-4"),
    (["ar", "--preset", "paper", "--lrs", "fast"], "--lrs", "comma-separated numbers"),
    (["ar", "--preset", "paper", "--seeds", "0,-1"], "--seeds", "expected seeds >= 0"),
    (["ar", "--preset", "paper", "--seeds", "a"], "--seeds", "comma-separated integers"),
    (["ar", "--preset", "quick", "--widths", "32"], "--widths", "allowed: 64"),
    (["ar", "--preset", "tiny", "--lrs", "1e-3"], "--lrs", "allowed: 3e-3"),
    (["ar", "--preset", "quick", "--lrs", "1e-3"], "--lrs", "mamba 3e-3"),
    (["mamba-conv-sites", "--preset", "quick", "--lrs", "3e-4"], "--lrs", "allowed: 1e-3, 3e-3"),
]


@pytest.mark.parametrize(("args", "flag", "text"), BAD)
def test_a_bad_value_is_a_one_line_error_and_writes_nothing(
    args, flag, text, tmp_path, monkeypatch
) -> None:
    def no_training(*_args, **_kwargs):  # a missed check fails here, not after a paper sweep
        raise AssertionError("reproduce went on to train")

    monkeypatch.setattr(experiments_cli, "_run", no_training)
    out = tmp_path / "runs"
    result = invoke("reproduce", *args, "--out", str(out), "-q")
    assert isinstance(result.exception, ConfigError), result.output
    message = str(result.exception)
    assert message.startswith(f"{flag}: ") and text in message
    assert "\n" not in message
    assert not out.exists()


def test_a_tiny_slice_runs_end_to_end_and_a_full_run_resumes_it(tmp_path) -> None:
    out = tmp_path / "runs"
    width, lr = preset("tiny", "ar")["model"]["d_model"], preset("tiny", "ar")["training"]["lr"]
    result = invoke(
        "reproduce",
        "ar",
        "--preset",
        "tiny",
        "--widths",
        str(width),
        "--lrs",
        str(lr),
        "--seeds",
        "0",
        "--archs",
        "attention",
        "--workers",
        "1",
        "-q",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert "ar-tiny: 1 done (0 already), 0 failed" in result.output
    assert (out / "ar-tiny" / "attention" / "model.safetensors").exists()
    assert (out / "ar-tiny" / "report" / "report.html").exists()
    assert "| attention" in result.output.split("Mechanisms")[1]
    # The same run the full grid names: the full run finds it finished.
    full = ("reproduce", "ar", "--preset", "tiny", "--archs", "attention", "-q", "--out", str(out))
    again = invoke(*full)
    assert again.exit_code == 0, again.output
    assert "ar-tiny: 1 done (1 already)" in again.output
    # More seeds find that run too: only the new seed trains, and each seed counts once.
    weights = (out / "ar-tiny" / "attention" / "model.safetensors").read_bytes()
    seeds = invoke(*full, "--seeds", "0,1")
    assert seeds.exit_code == 0, seeds.output
    assert "ar-tiny: 2 done (1 already)" in seeds.output
    assert sorted(p.name for p in (out / "ar-tiny").iterdir()) == [
        "attention",
        "attention-s1",
        "report",
    ]
    assert (out / "ar-tiny" / "attention" / "model.safetensors").read_bytes() == weights
    assert "s0: " in seeds.output and seeds.output.count("s0: ") == 1


def test_labels_over_seeds_count_their_agreement() -> None:
    from mecheval.experiments.store import seed_agreement

    summary = pd.DataFrame(
        {
            "run": ["mamba-s0", "mamba-s1", "mamba-s2", "h3", "based-s0", "based-s1", "x-s0"],
            "architecture": ["mamba"] * 3 + ["h3", "based", "based", "x"],
            "mechanism": ["induction", "unclear", "induction", "induction"]
            + ["induction", "unclear", None],
            "seed": [0, 1, 2, 0, 0, 1, 0],
        }
    )
    table = seed_agreement(summary)
    # No deciding role in this summary: no fraction over the seeds (tests/test_intervals.py).
    assert table.values.tolist() == [
        ["mamba", "mamba", "s0: induction · s1: unclear · s2: induction", "induction 2/3", ""],
        ["h3", "h3", "s0: induction", "induction (one seed)", ""],
        ["based", "based", "s0: induction · s1: unclear", "split (induction 1, unclear 1)", ""],
    ]


def test_reproduce_with_seeds_prints_each_seeds_label_and_their_agreement(tmp_path) -> None:
    out = tmp_path / "runs"
    args = ("reproduce", "ar", "--preset", "tiny", "--archs", "attention", "-q", "--out", str(out))
    one = invoke(*args)
    assert one.exit_code == 0, one.output
    assert "Each label is read from one seed" in one.output
    assert "Labels over seeds" not in one.output
    two = invoke(*args[:-1], str(tmp_path / "seeds"), "--seeds", "0,1")
    assert two.exit_code == 0, two.output
    agreement = two.output.split("Labels over seeds:")[1]
    row = next(line for line in agreement.splitlines() if line.startswith("| attention"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "attention" and cells[2].startswith("s0: ") and " · s1: " in cells[2]
    first, second = (part.split(": ", 1)[1] for part in cells[2].split(" · "))
    expected = f"{first} 2/2" if first == second else "split"
    assert cells[3].startswith(expected)
