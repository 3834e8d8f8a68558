"""The registered experiments of `mecheval reproduce`: one per paper figure.

Each experiment is a sweep (base preset + grid), the interventions to run after training,
and the report figures that show it. ``quick`` shrinks every grid to what a 2-core laptop
finishes in minutes (one width, the preset's tuned LR per architecture, one seed);
``paper`` is the paper's grid (App. A/C, §4.1, §5); ``tiny`` runs the quick grid with
seconds-long trainings, to check that an experiment runs end to end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mecheval.errors import ConfigError
from mecheval.experiments.grid import SweepSpec
from mecheval.experiments.runners import InterventionPlan
from mecheval.models import ARCHITECTURES, get_architecture

PRESETS = ("quick", "paper", "tiny")
PAPER_WIDTHS = [16, 32, 64, 128, 256]
#: The paper's AR grid: {3e-5 … 3e-3} plus the follow-up {1e-2, 3e-2} (text: [3e-5, 3e-2]).
PAPER_AR_LRS = [3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2]
PAPER_ATR_LRS = [3e-5, 1e-4, 3e-4, 1e-3, 3e-3]
#: The paper's order of architectures in its figures.
ARCH_ORDER = ["mamba", "hyena", "h3", "deltanet", "based", "baseconv", "attention"]


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    task: str
    grid: dict[str, list[Any]]
    figures: tuple[str, ...]
    plan: InterventionPlan = InterventionPlan()
    fixed: dict[str, Any] | None = None  # dotted overrides for every run
    quick_grid: dict[str, list[Any]] | None = None

    def sweep(self, preset: str, archs: list[str] | None = None) -> SweepSpec:
        """The sweep of this experiment at ``preset``; ``archs`` replaces its architectures
        (custom ones included) where the experiment compares architectures."""
        if preset not in PRESETS:
            raise ConfigError(f"--preset: expected one of {', '.join(PRESETS)}, got {preset!r}")
        paper = preset == "paper"
        lrs = PAPER_AR_LRS if self.task == "ar" else PAPER_ATR_LRS
        grid = dict(self.grid)
        if archs is not None:
            if grid.get("model.architecture") != _archs():
                raise ConfigError(
                    f"--archs: experiment {self.name!r} studies "
                    f"{', '.join(grid.get('model.architecture', []))} only"
                )
            for arch in archs:
                get_architecture(arch)  # fail now, not in every worker
            grid["model.architecture"] = list(archs)
        if paper:
            grid.setdefault("model.d_model", PAPER_WIDTHS)
            grid.setdefault("training.lr", lrs)
        else:
            grid.update(self.quick_grid or {})
        return SweepSpec(
            name=f"{self.name}-{preset}",
            base={"preset": preset, "task": self.task},
            set=dict(self.fixed or {}),
            grid=grid,
        )


def _archs() -> list[str]:
    return [a for a in ARCH_ORDER if a in ARCHITECTURES]


def _catalog() -> dict[str, Experiment]:
    archs = _archs()
    experiments = [
        Experiment(
            "ar",
            "AR main comparison (Fig. 3)",
            "ar",
            {"model.architecture": archs},
            ("ar-restore", "emergence"),
            plan=InterventionPlan(during_training=True),
        ),
        Experiment(
            "atr",
            "ATR main comparison (Fig. 7)",
            "atr",
            {"model.architecture": archs},
            ("atr-restore",),
        ),
        Experiment(
            "mamba-conv",
            "Mamba short-conv ablation on AR (Fig. 4a)",
            "ar",
            {"model.architecture": ["mamba"], "model.mixer.d_conv": [None, 1, 2, 3, 4]},
            ("conv-ablation",),
        ),
        Experiment(
            "based-conv",
            "Based short conv vs implicit long conv on AR (Fig. 4b)",
            "ar",
            {"model.architecture": ["based"], "model.mixer.long_conv": [False, True]},
            ("conv-ablation",),
        ),
        Experiment(
            "mamba-conv-sites",
            "Interventions on Mamba's short convolutions over LR x width (Fig. 5)",
            "ar",
            {"model.architecture": ["mamba"]},
            ("mamba-conv-sites",),
            quick_grid={"training.lr": [1e-3, 3e-3]},
        ),
        Experiment(
            "atr-mamba-conv",
            "Mamba short-conv ablation on ATR (Fig. 8)",
            "atr",
            {"model.architecture": ["mamba"], "model.mixer.d_conv": [None, 1, 2, 3, 4]},
            ("atr-mamba-conv",),
        ),
        Experiment(
            "pos-emb",
            "Position embeddings on/off (Fig. 9)",
            "ar",
            {"model.architecture": archs, "model.position_embedding": [True, False]},
            ("pos-emb",),
        ),
        Experiment(
            "generalisation",
            "ATR with a held-out query-answer split (Fig. 10)",
            "atr",
            {"model.architecture": archs},
            ("generalisation",),
            fixed={"task.split": 0.2},
        ),
        Experiment(
            "one-layer",
            "1-layer models on AR (Fig. 11)",
            "ar",
            {"model.architecture": archs, "model.n_layers": [1]},
            ("one-layer",),
        ),
        Experiment(
            "layer-count",
            "1-3 layers on AR (Fig. 12)",
            "ar",
            {"model.architecture": archs, "model.n_layers": [1, 2, 3]},
            ("layer-count",),
        ),
        Experiment(
            "sibling",
            "Rightmost-sibling queries on ATR (Fig. 13)",
            "atr",
            {"model.architecture": archs},
            ("sibling",),
            fixed={"task.query": "sibling"},
        ),
        Experiment(
            "grandparent",
            "Grandparent (two-hop) queries on ATR (new)",
            "atr",
            {"model.architecture": archs},
            ("atr-restore",),
            fixed={"task.query": "grandparent"},
        ),
    ]
    return {e.name: e for e in experiments}


def get_experiment(name: str) -> Experiment:
    catalog = _catalog()
    if name not in catalog:
        raise ConfigError(f"experiment: unknown {name!r} (expected one of: {', '.join(catalog)})")
    return catalog[name]


def list_experiments() -> list[Experiment]:
    return list(_catalog().values())
