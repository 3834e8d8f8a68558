"""docs/sweeps.md and configs/sweep-example.yaml: the example is loaded by the real loader
and planned into the runs the page names, and the page shows the file as it is, so neither
can drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

from mecheval.experiments.grid import load_sweep
from mecheval.experiments.plan import plan_runs

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "configs" / "sweep-example.yaml"
PAGE = ROOT / "docs" / "sweeps.md"


def test_the_example_plans_the_runs_the_page_names() -> None:
    spec = load_sweep(EXAMPLE)
    planned = {run.name: run.cfg for run in plan_runs(spec)}
    assert list(planned) == ["attention-s0", "attention-s1", "mamba-s0", "mamba-s1"]
    page = PAGE.read_text()
    assert "It makes four runs: " + ", ".join(f"`{n}`" for n in planned) + "." in page
    # Each layer of the spec reached the configs: base preset and section, set, per-architecture.
    assert {cfg.task.n_pairs for cfg in planned.values()} == {4}
    assert {cfg.training.eval_every for cfg in planned.values()} == {10}
    assert planned["mamba-s1"].training.lr == 1e-2
    assert planned["attention-s1"].training.lr != 1e-2
    assert planned["attention-s1"].training.seed == 1


def test_the_page_shows_the_example_file_verbatim() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    assert blocks and blocks[0] == EXAMPLE.read_text()


def test_the_page_documents_every_key_of_a_spec() -> None:
    from mecheval.experiments.grid import SweepSpec

    page = PAGE.read_text()
    for key in SweepSpec.model_fields:
        assert f"| `{key}` |" in page, key
