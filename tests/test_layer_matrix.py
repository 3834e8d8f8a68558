"""The two-layer hybrids' matrix (report/layer_matrix.py): layer 0 by layer 1 per task, each
cell the best run's label and accuracy, coloured by the architecture that carries it."""

from __future__ import annotations

import pandas as pd
import pytest

from mecheval.report.layer_matrix import (
    NO_CARRIER,
    carried_by,
    layer_cells,
    render_layer_matrix,
    two_layers,
)


def record(arch: str, label: str | None, dev: float, task: str = "ar", **carrier) -> dict:
    return {
        "run": f"{arch}-{task}-{dev}",
        "task": task,
        "short conv": None,
        "architecture": arch,
        "status": "done" if label else "failed",
        "reason": None,
        "dev accuracy": dev,
        "test accuracy": dev - 0.01,
        "negative eigenvalues": None,
        "label": label,
        "accuracy": dev,
        "best role": "value",
        "recovered": 0.9,
        "carrier layer": carrier.get("layer"),
        "carrier architecture": carrier.get("architecture"),
        "reads": carrier.get("reads"),
    }


def test_a_models_two_layers_from_its_name() -> None:
    assert two_layers("mamba+attention") == ("mamba", "attention")
    assert two_layers("mamba") == ("mamba", "mamba")
    assert two_layers("mamba+attention+mamba+mamba") is None


@pytest.mark.parametrize(
    ("row", "carries"),
    [
        (record("mamba+attention", "induction in layer 1 (attention)", 0.9, layer=1,
                architecture="attention", reads="induction"), "attention"),
        (record("mamba", "direct retrieval, layer 0", 0.9), "mamba"),
        (record("deltanet", "direct retrieval, layer 0; held in the state before the query "
                "(layer 0)", 0.9), "deltanet"),
        (record("attention", "candidates only (no binding)", 0.3), None),
        (record("attention+mamba", "unclear", 0.9), None),
        (record("hyena", None, 0.0), None),
    ],
)  # fmt: skip
def test_the_carrying_architecture(row: dict, carries: str | None) -> None:
    assert carried_by(pd.Series(row)) == carries


def test_the_matrix_keeps_two_layer_models_and_each_cells_best_run() -> None:
    records = pd.DataFrame(
        [
            record("mamba+attention", "induction in layer 1 (attention)", 0.95, layer=1,
                   architecture="attention", reads="induction"),
            record("mamba+attention", "unclear", 0.5),  # a worse LR of the same cell
            record("attention+mamba", "candidates only (no binding)", 0.3),
            record("mamba", "direct retrieval, layer 0", 0.9),
            record("attention", "induction", 1.0, task="mqar"),
            record("mamba+mamba+attention+mamba", "induction in layer 2 (attention)", 1.0),
        ]
    )  # fmt: skip
    cells = layer_cells(records)
    assert len(cells) == 4  # the four-layer model and the worse run left out
    best = cells.set_index(["task", "layer 0", "layer 1"])
    assert best.loc[("ar", "mamba", "attention"), "label"].startswith("induction in layer 1")
    assert best.loc[("ar", "mamba", "mamba"), "carried by"] == "mamba"
    result = render_layer_matrix(records, "hybrids")
    lines = result.markdown.splitlines()
    ar = lines.index("**AR**")
    assert lines[ar + 2] == "| layer 0 ↓ / layer 1 → | Mamba | Attention |"
    assert lines[ar + 4] == (
        "| **Mamba** | direct retrieval, layer 0; 89.0 | induction in layer 1 (attention); 94.0 |"
    )
    assert lines[ar + 5] == "| **Attention** | candidates only (no binding); 29.0 |  |"
    assert "**MQAR**" in lines and "mamba+mamba" not in result.markdown
    panels = result.figure.axes
    assert [ax.get_title() for ax in panels] == ["AR", "MQAR"]
    colours = {patch.get_facecolor() for patch in panels[0].patches}
    assert len(colours) == 3  # Mamba carries, attention carries, nobody (and no run)
    from matplotlib.colors import to_rgba

    assert to_rgba(NO_CARRIER) in colours
