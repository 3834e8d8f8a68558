"""Every registered experiment runs end to end as a user starts it.

This is the whole pipeline at the ``tiny`` preset (seconds per experiment): sweep,
interventions, report (the figures `reproduce --list` names), the mechanism table. The ATR
experiments hold that no document is longer than Hyena's implicit filter takes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from mecheval.cli import _register, app
from mecheval.experiments.catalog import get_experiment, list_experiments
from mecheval.experiments.known import NAME as KNOWN
from mecheval.experiments.reproduce import listed_figures
from mecheval.training.folder import read_status

EXPERIMENTS = [e.name for e in list_experiments()]


def test_the_catalog_is_what_reproduce_lists() -> None:
    _register()
    result = CliRunner().invoke(app, ["reproduce", "--list"])
    assert result.exit_code == 0, result.output
    listed = [line.split()[0] for line in result.output.splitlines()]
    # and, last, the models built by hand (experiments/known.py), which are not a sweep
    assert listed == [*EXPERIMENTS, KNOWN]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_runs_end_to_end_at_tiny(name: str, tiny_experiments) -> None:
    """``mecheval reproduce NAME --preset tiny`` (run once per session by the
    ``tiny_experiments`` fixture, tests/conftest.py, which the pages' commands start from)."""
    result = tiny_experiments[name]
    assert result.exit_code == 0, result.output
    folder = result.folder
    runs = [p for p in folder.iterdir() if (p / "config.yaml").exists()]
    assert runs
    assert all(read_status(run)["state"] == "done" for run in runs), [
        (run.name, read_status(run)) for run in runs
    ]
    assert (folder / "report" / "report.html").exists()
    assert "Mechanisms" in result.output
    printed = assert_report_is_what_was_printed(folder / "report", result.output)
    # What `reproduce --list` says it draws, in its order (a figure without data at tiny,
    # such as grandparent's, is left out).
    listed = listed_figures(get_experiment(name))
    assert printed == [figure for figure in listed if figure in printed], (printed, listed)
    assert set(printed) <= set(listed)
    if name == "ar":  # some experiments make no figure at tiny (grandparent); this one two
        assert printed == ["ar-restore", "emergence"]
    if name == "task-matrix":  # the matrix first, then each of its tasks' restore figure
        assert printed[0] == "task-matrix" and {"mqar-restore", "ar-restore"} <= set(printed)
        assert "pos-emb" not in printed
    if name == "state-tracking":  # the matrix by task and eigenvalue range, accuracies beside
        assert printed == ["state-tracking"]
        assert "Accuracy in %: final dev (the trained lengths) / test" in result.output
        for run in runs:  # the task reads recurrent states: every state site was restored
            sites = set(pd.read_csv(run / "interventions.csv").site.dropna())
            assert {"layers.0.mixer.state", "layers.1.mixer.state", "layers.1.input"} <= sites


def assert_report_is_what_was_printed(report_dir: Path, output: str) -> list[str]:
    """report.html holds the figures printed and saved, no other, and the mechanism table;
    the figures printed, in order."""
    page = (report_dir / "report.html").read_text()
    printed = re.findall(r"^## ([\w-]+): ", output, flags=re.MULTILINE)
    saved = [p.stem for p in report_dir.glob("*.png")]
    in_page = re.findall(r'<section id="([^"]+)"', page)
    assert sorted(in_page) == sorted(printed) == sorted(saved)
    # The page opens with a contents list, and every figure has its one-line caption.
    contents = re.findall(r'<li><a href="#([^"]+)">', page)
    assert contents == in_page
    captions = re.findall(
        r'<section id="[^"]+">\s*<h2>[^<]+</h2>\s*<img [^>]+>\s*<p class="caption">([^<]+)</p>',
        page,
    )
    assert len(captions) == len(in_page) and all(len(c) > 40 for c in captions)
    # The figures it could not make: the experiment's own, as printed, not every other one.
    not_made = re.findall(r"^\(figure ([\w-]+) not made", output, flags=re.MULTILINE)
    assert re.findall(r"<li><code>([\w-]+)</code>: ", page) == not_made
    assert "<p>Mechanisms (likelihood of the answer %" in page
    return printed
