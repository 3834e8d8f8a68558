"""The figure registry: names written once, in a fixed order, that the experiments can use."""

from __future__ import annotations

import pandas as pd
import pytest

from mecheval.errors import ConfigError
from mecheval.experiments.catalog import list_experiments
from mecheval.report import FIGURES, FigureResult, registry
from mecheval.report.render import Heatmaps
from mecheval.report.select import NoData, by_arch
from mecheval.report.tables import behaviour

# The report's order: `mecheval report` writes and lists the figures in this order.
NAMES = [
    "ar-restore",
    "conv-ablation",
    "mamba-conv-sites",
    "atr-restore",
    "atr-mamba-conv",
    "pos-emb",
    "generalisation",
    "one-layer",
    "layer-count",
    "sibling",
    "emergence",
    "noisy-ar-restore",
    "overwrite-ar-restore",
    "reassign-ar-restore",
    "mqar-restore",
    "compositional-mqar-restore",
    "reverse-ar-restore",
    "stacked-mqar-restore",
    "state-size",
]


def test_registered_names_and_order():
    assert list(FIGURES) == NAMES


def test_every_experiment_figure_is_registered():
    missing = {
        (e.name, name) for e in list_experiments() for name in e.figures if name not in FIGURES
    }
    assert not missing, f"experiments list figures that are not registered: {sorted(missing)}"


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="'ar-restore' is registered twice"):
        registry.figure("ar-restore", "again")(lambda df: None)


TABLE = pd.DataFrame(
    [
        {
            "run": "r",
            "model.architecture": "attention",
            "model.d_model": 16,
            "source": "behavioural",
            "split": "dev",
            "metric": "accuracy",
            "step": 10,
            "value": 0.5,
        }
    ]
)


def test_one_decorated_function_makes_a_figure(monkeypatch):
    monkeypatch.setattr(registry, "FIGURES", {})

    @registry.figure("accuracy", "Which architecture is most accurate.")
    def accuracy(df: pd.DataFrame) -> Heatmaps:
        """Accuracy per architecture."""
        return Heatmaps("accuracy", [by_arch([(df, [behaviour("Accuracy")])])], df)

    @registry.figure("nothing", "Nothing.")
    def nothing(df: pd.DataFrame) -> Heatmaps:
        raise NoData("no such runs in this results table")

    result = registry.FIGURES["accuracy"](TABLE)
    assert isinstance(result, FigureResult) and result.name == "accuracy"
    assert result.caption == "Which architecture is most accurate."
    assert result.markdown.startswith("## accuracy: accuracy\n")
    assert "| Attention | 50.0 |" in result.markdown
    assert registry.FIGURES["accuracy"].__doc__ == "Accuracy per architecture."
    with pytest.raises(ConfigError, match="^figure nothing: no such runs in this results table$"):
        registry.FIGURES["nothing"](TABLE)
    with pytest.raises(ConfigError, match="^figure nothing: the results table is empty$"):
        registry.FIGURES["nothing"](TABLE.iloc[0:0])
    results, skipped = registry.available_figures(TABLE)
    assert [r.name for r in results] == ["accuracy"]
    assert skipped == {"nothing": "figure nothing: no such runs in this results table"}
