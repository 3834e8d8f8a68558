"""The two-layer hybrids' matrix (report/layer_matrix.py): layer 0 by layer 1 per task, each
cell the best run's label and accuracy, coloured by the architecture that carries it."""

from __future__ import annotations

import pandas as pd
import pytest

from mecheval.report.layer_matrix import (
    NO_CARRIER,
    carried_by,
    deeper_models,
    layer_cells,
    render_layer_matrix,
    two_layers,
)


def record(
    arch: str, label: str | None, dev: float, task: str = "ar", layers: int = 2, **carrier
) -> dict:
    return {
        "run": f"{arch}-{task}-{dev}",
        "task": task,
        "short conv": None,
        "architecture": arch,
        "layers": layers,
        "pairs": 8 if layers == 4 else 4,
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
            record("mamba+mamba+attention+mamba", "induction in layer 2 (attention)", 1.0,
                   layers=4),
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
    assert "**MQAR**" in lines and "| **Mamba** | `mamba+mamba" not in result.markdown
    panels = result.figure.axes
    assert [ax.get_title() for ax in panels] == ["AR", "MQAR", "4 layers, AR, 8 pairs"]
    two_only = render_layer_matrix(records[records["layers"] == 2], "hybrids")
    assert [ax.get_title() for ax in two_only.figure.axes] == ["AR", "MQAR"]
    assert "4 layers" not in two_only.markdown
    colours = {patch.get_facecolor() for patch in panels[0].patches}
    assert len(colours) == 3  # Mamba carries, attention carries, nobody (and no run)
    from matplotlib.colors import to_rgba

    assert to_rgba(NO_CARRIER) in colours


def test_deeper_models_follow_a_row_each_their_carrying_layer_coloured() -> None:
    """Models of other than two layers (the pure four-layer Mamba too, though its name is
    one architecture's) are kept apart from the two-layer matrix: a table and a panel per
    depth, task and pairs, each model's best run, the carrying layer in its colour."""
    carried = {"layer": 2, "architecture": "attention", "reads": "induction"}
    records = pd.DataFrame(
        [
            record("mamba", "direct retrieval, layer 0", 0.9, task="mqar"),
            record("mamba", "not learned", 0.2, task="mqar", layers=4),
            record("mamba+mamba+attention+mamba", "induction in layer 2 (attention)", 1.0,
                   task="mqar", layers=4, **carried),
            record("mamba+mamba+attention+mamba", "unclear", 0.4, task="mqar", layers=4),
            record("mamba+attention~mamba+mamba+mamba", "induction in layer 1 "
                   "(attention~mamba: attention)", 1.0, task="mqar", layers=4, layer=1,
                   architecture="attention~mamba", reads="induction"),
        ]
    )  # fmt: skip
    cells = layer_cells(records)
    assert list(cells["architecture"]) == ["mamba"] and cells["layers"].tolist() == [2]
    deeper = deeper_models(records)
    assert deeper["model"].tolist() == [
        "mamba+mamba+mamba+mamba",
        "mamba+mamba+attention+mamba",
        "mamba+attention~mamba+mamba+mamba",
    ]
    assert deeper["label"].tolist()[1] == "induction in layer 2 (attention)"  # the best run
    result = render_layer_matrix(records, "hybrids")
    lines = result.markdown.splitlines()
    at = lines.index("**4 layers, MQAR, 8 pairs**")
    assert lines[at + 2 : at + 6] == [
        "| model | label; test accuracy % |",
        "|---|---|",
        "| `mamba+mamba+mamba+mamba` | not learned; 19.0 |",
        "| `mamba+mamba+attention+mamba` | induction in layer 2 (attention); 99.0 |",
    ]
    panel = result.figure.axes[-1]
    assert panel.get_title() == "4 layers, MQAR, 8 pairs"
    from matplotlib.colors import to_rgba

    fills = [patch.get_facecolor() for patch in panel.patches]
    white = to_rgba("white")
    assert fills[:4] == [white] * 4  # not learned: no layer carries it
    assert [f != white for f in fills[4:8]] == [False, False, True, False]
    assert [f != white for f in fills[8:12]] == [False, True, False, False]
    assert fills[6] != fills[9]  # attention and the parallel layer carry in their colours
    texts = [t.get_text() for t in panel.texts]
    assert "Attention\n~ Mamba" in texts and "100%" not in texts and "99%" in texts
