"""The registered experiments of `mecheval reproduce`: one per paper figure.

Each experiment is a sweep (base preset + grid), the interventions to run after training,
and the report figures that show it. ``quick`` shrinks every grid to what a 2-core laptop
finishes in minutes (one width, the preset's tuned LR per architecture, one seed);
``paper`` is the paper's grid (App. A/C, §4.1, §5); ``tiny`` runs the quick grid with
seconds-long trainings, to check that an experiment runs end to end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mecheval.errors import ConfigError
from mecheval.experiments.grid import TASK_AXIS, GridPart, SweepSpec
from mecheval.experiments.mechanisms import InterventionPlan
from mecheval.interventions.attribution import METHODS
from mecheval.models import get_architecture
from mecheval.models.registry import (
    BUILTIN_ARCHITECTURES,
    PAPER_ARCHITECTURES,
    available_architectures,
)
from mecheval.tasks import get_task
from mecheval.training.presets import QUICK_EPOCHS, check_preset

PAPER_WIDTHS = [16, 32, 64, 128, 256]


ARCHITECTURE = "model.architecture"


@dataclass(frozen=True)
class Part:
    """A further grid of an experiment, with its own values for every run of it (``fixed``,
    then ``fixed_at`` the preset's) and its own quick and tiny grid values (as the
    experiment's)."""

    grid: dict[str, list[Any]]
    fixed: dict[str, Any] | None = None
    fixed_at: dict[str, dict[str, Any]] | None = None
    quick_grid: dict[str, list[Any]] | None = None
    tiny_grid: dict[str, list[Any]] | None = None


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    task: str
    grid: dict[str, list[Any]]
    figures: tuple[str, ...]
    plan: InterventionPlan = InterventionPlan()
    fixed: dict[str, Any] | None = None  # dotted overrides for every run
    #: preset -> dotted overrides for every run at that preset (after ``fixed``)
    fixed_at: dict[str, dict[str, Any]] | None = None
    #: preset -> architecture -> dotted overrides for that architecture's runs at that preset
    #: (after ``fixed_at``; where the sweep runs that architecture)
    per_architecture_at: dict[str, dict[str, dict[str, Any]]] | None = None
    quick_grid: dict[str, list[Any]] | None = None
    #: at tiny, these grid values instead (after ``quick_grid``; the architectures and tasks
    #: a user chose stand): a large grid's end-to-end check on a few of its points
    tiny_grid: dict[str, list[Any]] | None = None
    #: the report adds a mechanism matrix (report/matrix.py's MATRICES): architectures by
    #: "task", by "short conv" setting or by task and "eigenvalues" range; or LAYERS_MATRIX,
    #: two-layer models' layer 0 by layer 1 (report/layer_matrix.py); "" none
    matrix: str = ""
    #: which architectures the experiment can train (None: any); its default and
    #: ``--archs all`` keep these only
    accepts: Callable[[str], bool] | None = None
    #: further grids, run and reported with the experiment's own (SweepSpec.also): models
    #: too unlike its own to share one product
    also: tuple[Part, ...] = ()

    def sweep(
        self, preset: str, archs: list[str] | None = None, tasks: list[str] | None = None
    ) -> SweepSpec:
        """The sweep of this experiment at ``preset``; ``archs`` replaces its architectures
        (custom ones included) where the experiment compares architectures, or picks among
        them where it studies named ones (``mamba-conv``, ``mamba3-conv``), ``tasks`` its
        tasks where it has a task axis (any registered task). A slice of its grid (``--widths``
        and the like) is cut where runs are planned (experiments/plan.py)."""
        check_preset(preset)
        if archs == ["all"]:
            archs = [
                a for a in available_architectures() if self.accepts is None or self.accepts(a)
            ]
        grid = self._grid_at(self.grid, preset, archs, tasks)
        also = []
        for part in self.also:
            if tasks is not None and not set(part.grid.get(TASK_AXIS, [self.task])) & set(tasks):
                continue  # a part runs where the user chose one of its tasks
            values = {**(part.fixed or {}), **(part.fixed_at or {}).get(preset, {})}
            also.append(
                GridPart(set=values, grid=self._grid_at(part.grid, preset, archs, tasks, part))
            )
        running = {a for g in (grid, *(p.grid for p in also)) for a in g.get(ARCHITECTURE, [])}
        per_architecture = (self.per_architecture_at or {}).get(preset, {})
        return SweepSpec(
            name=f"{self.name}-{preset}",
            base={"preset": preset, "task": self.task},
            set={**(self.fixed or {}), **(self.fixed_at or {}).get(preset, {})},
            grid=grid,
            per_architecture={a: o for a, o in per_architecture.items() if a in running},
            also=also,
        )

    def _grid_at(
        self,
        grid: dict[str, list[Any]],
        preset: str,
        archs: list[str] | None,
        tasks: list[str] | None,
        part: Part | None = None,
    ) -> dict[str, list[Any]]:
        """One of the experiment's grids (its own, or ``part``'s) at ``preset``, with the
        user's ``tasks`` (a part keeps those of its own) and ``archs``: the paper's widths and
        LRs where it sets none at ``paper``, else the quick grid's values, and at ``tiny`` the
        tiny grid's (the user's archs and tasks stand)."""
        own = part or self
        grid = dict(grid)
        if tasks is not None and part is None:
            grid[TASK_AXIS] = self._task_axis(grid, tasks)
        elif tasks is not None and TASK_AXIS in grid:
            grid[TASK_AXIS] = [t for t in grid[TASK_AXIS] if t in tasks]
        if archs is not None:
            grid[ARCHITECTURE] = self._architectures(grid, archs)
        if preset == "paper":
            grid.setdefault("model.d_model", PAPER_WIDTHS)
            grid.setdefault("training.lr", list(get_task(self.task).paper_lrs))
        else:
            grid.update(own.quick_grid or {})
        if preset == "tiny":  # the user's --archs and --tasks stand
            chosen = {ARCHITECTURE: archs, TASK_AXIS: tasks}
            grid.update({k: v for k, v in (own.tiny_grid or {}).items() if chosen.get(k) is None})
        return grid

    def _task_axis(self, grid: dict[str, list[Any]], tasks: list[str]) -> list[str]:
        """``--tasks``, checked: the experiment has a task axis, and every kind is known."""
        if TASK_AXIS not in grid:
            raise ConfigError(f"--tasks: experiment {self.name!r} studies {self.task} only")
        for kind in tasks:
            get_task(kind)  # an unknown kind fails now, naming the known ones
        return list(dict.fromkeys(tasks))

    def _architectures(self, grid: dict[str, list[Any]], archs: list[str]) -> list[str]:
        """``--archs``, checked against what the experiment studies."""
        self._check_takes_archs(grid)
        own = list(grid.get("model.architecture", []))
        if self.accepts is None and own != _archs():
            # An experiment about named architectures runs a subset of them, under the
            # full grid's run names (as --widths and --lrs slice), and no others.
            if not set(archs) <= set(own):
                raise ConfigError(
                    f"--archs: experiment {self.name!r} studies {', '.join(own)} only "
                    "(choose among them)"
                )
            archs = [a for a in own if a in archs]
        for arch in archs:
            get_architecture(arch)  # fail now, not in every worker
        return list(archs)

    def _check_takes_archs(self, grid: dict[str, list[Any]]) -> None:
        if "model.layers" in grid:
            raise ConfigError(
                f"--archs: experiment {self.name!r} sets each layer's architecture "
                "(model.layers); it takes no --archs"
            )


def _archs() -> list[str]:
    """The architectures an experiment compares by default: the paper's seven."""
    return list(PAPER_ARCHITECTURES)


#: The tasks of the task x architecture matrix by default: the AR family, the protocol's control
#: (stacked MQAR), reverse AR and state tracking, whose quick presets train in seconds to
#: minutes each (ATR's take far longer: add it with --tasks).
MATRIX_TASKS = [
    "ar",
    "noisy_ar",
    "overwrite_ar",
    "mqar",
    "compositional_mqar",
    "reverse_ar",
    "stacked_mqar",
    "parity",
    "s3",
]
#: the matrix's runs stop at this dev accuracy (zoology's ``early_stopping_threshold``)
MATRIX_STOP_AT = 0.99
#: ``reproduce ar --preset quick``: zoology's early stopping for every architecture but those
#: the quick preset trains longer (training/presets.py's QUICK_EPOCHS: Mamba). Over seeds 0-2,
#: Attention, Based and DeltaNet read the labels of their full epoch at the stop (at steps
#: 500-1,500 of 3,126), while Mamba stopped at 99 % dev accuracy reads `unclear` in 2 of 3
#: (trained on, direct retrieval in 4 of 5): docs/quick-preset.md.
AR_QUICK_STOP_AT = {"training.stop_at_accuracy": MATRIX_STOP_AT}


def switchable(arch: str) -> bool:
    """Whether ``model.short_conv`` applies to the architecture (Based and BaseConv refuse)."""
    return not get_architecture(arch).no_conv_switch


def any_architecture(arch: str) -> bool:
    return True


def takes_neg_eigval(arch: str) -> bool:
    """Whether the architecture has ``model.mixer.allow_neg_eigval`` (Mamba, Mamba-2, DeltaNet,
    Gated DeltaNet)."""
    return "allow_neg_eigval" in get_architecture(arch).options.model_fields


#: The state-tracking experiment's test documents: longer than any trained (the presets'
#: max_elements 16, 6 and 40), for length generalisation as Grazzi et al. test it (trained up
#: to 40 elements, tested on 40 to 256); the labels are read on dev, at the trained lengths.
STATE_TEST_LENGTHS = {"quick": (17, 64), "tiny": (7, 12), "paper": (40, 256)}


def conv_experiment(
    name: str,
    description: str,
    task: str,
    archs: list[str],
    taps: tuple[int, ...],
    figures: tuple[str, ...] = (),
    accepts: Callable[[str], bool] | None = None,
) -> Experiment:
    """An experiment of ``archs`` without a short conv and with one of each of ``taps``, its
    labels drawn as a matrix over the conv setting."""
    grid = {"model.architecture": archs, "model.short_conv": ["none", *taps]}
    return Experiment(name, description, task, grid, figures, matrix="short conv", accepts=accepts)


def _paper_main(archs: list[str]) -> list[Experiment]:
    """The paper's main comparisons: AR (Fig. 3) and ATR (Fig. 7)."""
    return [
        Experiment(
            "ar",
            "AR main comparison (Fig. 3)",
            "ar",
            {"model.architecture": archs},
            ("ar-restore", "emergence"),
            plan=InterventionPlan(during_training=True),
            fixed_at={"quick": AR_QUICK_STOP_AT},
            per_architecture_at={
                "quick": {arch: {"training.stop_at_accuracy": None} for arch in QUICK_EPOCHS["ar"]}
            },
        ),
        Experiment(
            "atr",
            "ATR main comparison (Fig. 7)",
            "atr",
            {"model.architecture": archs},
            ("atr-restore",),
        ),
    ]


def _paper_conv_ablations() -> list[Experiment]:
    """The paper's short-convolution ablations (Figs. 4, 5 and 8)."""
    return [
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
    ]


def _paper_appendix(archs: list[str]) -> list[Experiment]:
    """The paper's appendix experiments (Figs. 9-13)."""
    return [
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
            # one-layer and ar train every architecture at 1 and 2 layers at tiny already
            tiny_grid={"model.architecture": ["attention", "based", "mamba"]},
        ),
        Experiment(
            "sibling",
            "Rightmost-sibling queries on ATR (Fig. 13)",
            "atr",
            {"model.architecture": archs},
            ("sibling",),
            fixed={"task.query": "sibling"},
        ),
    ]


def _recall_variants(archs: list[str]) -> list[Experiment]:
    """Recall tasks beyond the paper: two-hop ATR and the AR family of MAD and zoology."""
    return [
        Experiment(
            "grandparent",
            "Grandparent (two-hop) queries on ATR (new)",
            "atr",
            {"model.architecture": archs},
            ("atr-restore",),
            fixed={"task.query": "grandparent"},
        ),
        Experiment(
            "noisy-ar",
            "Noisy AR, MAD's noisy recall",
            "noisy_ar",
            {"model.architecture": archs},
            ("noisy-ar-restore",),
        ),
        Experiment(
            "overwrite-ar",
            "Overwrite AR, latest wins: zoology's forgetting MQAR with one query",
            "overwrite_ar",
            {"model.architecture": archs},
            ("overwrite-ar-restore",),
        ),
        Experiment(
            "mqar",
            "MQAR, zoology's multi-query AR; each query its own probe",
            "mqar",
            {"model.architecture": archs},
            ("mqar-restore",),
        ),
        Experiment(
            "compositional-mqar",
            "Two-token keys: zoology's compositional MQAR",
            "compositional_mqar",
            {"model.architecture": archs},
            ("compositional-mqar-restore",),
        ),
    ]


def _conv_probes(conv_archs: list[str]) -> list[Experiment]:
    """Tasks and mixers that ask what a short convolution does."""
    return [
        conv_experiment(
            "reverse-ar",
            "Reverse AR, the value before its key: which architectures learn it, and how, "
            "without and with a 4-tap short conv",
            "reverse_ar",
            conv_archs,
            (4,),
            ("reverse-ar-restore",),
            accepts=switchable,
        ),
        conv_experiment(
            "stacked-mqar",
            "The protocol's control: stacked MQAR, key and value in one token, so no shift is "
            "needed; without and with a 4-tap short conv",
            "stacked_mqar",
            conv_archs,
            (4,),
            ("stacked-mqar-restore",),
            accepts=switchable,
        ),
        conv_experiment(
            "mamba3-conv",
            "Mamba-3 (its trapezoid a built-in size-2 conv) beside Mamba, without and with a "
            "4-tap short conv, on AR",
            "ar",
            ["mamba", "mamba3"],
            (4,),
        ),
        conv_experiment(
            "atr-mamba3-conv",
            "Mamba-3 beside Mamba, without and with a 4-tap short conv, on ATR",
            "atr",
            ["mamba", "mamba3"],
            (4,),
        ),
    ]


def _state_tracking() -> Experiment:
    """Parity and S3 with and without negative eigenvalues, as Grazzi et al. compare them."""
    return Experiment(
        "state-tracking",
        "State tracking: parity and S3 with transition eigenvalues in [0, 1] and in "
        "[-1, 1] (Grazzi et al.'s Fig. 1); labels on trained lengths, accuracy also on "
        "longer documents",
        "parity",
        {
            TASK_AXIS: ["parity", "s3"],
            "model.architecture": [a for a in BUILTIN_ARCHITECTURES if takes_neg_eigval(a)],
            "model.mixer.allow_neg_eigval": [False, True],
        },
        (),
        plan=InterventionPlan(split="dev"),
        # the matrix's early stopping: a run that tracks the state stops there
        fixed={"training.stop_at_accuracy": MATRIX_STOP_AT},
        fixed_at={
            preset: {"task.test_min_elements": lo, "task.test_max_elements": hi}
            for preset, (lo, hi) in STATE_TEST_LENGTHS.items()
        },
        matrix="eigenvalues",
        accepts=takes_neg_eigval,
    )


def _matrices(archs: list[str], conv_archs: list[str]) -> list[Experiment]:
    """Matrices over tasks, conv settings and methods."""
    return [
        Experiment(
            "task-matrix",
            "Mechanism matrix: every architecture on the AR family, stacked MQAR, reverse AR, "
            "parity and S3",
            "ar",
            {TASK_AXIS: MATRIX_TASKS, "model.architecture": archs},
            (),
            # zoology's early stopping (its MQAR recipe): a cell that has learned its task
            # stops there instead of training on; `--set training.stop_at_accuracy=null`
            # trains every step
            fixed={"training.stop_at_accuracy": MATRIX_STOP_AT},
            matrix="task",
            # every task on three architectures: each task's own experiment (ar, mqar,
            # reverse-ar, state-tracking, ...) runs it on its architectures at tiny already
            tiny_grid={"model.architecture": ["attention", "based", "mamba"]},
        ),
        conv_experiment(
            "conv-switch",
            "Short convolution as a switch: every architecture without, with a 2- and a 4-tap "
            "short conv on AR",
            "ar",
            conv_archs,
            (2, 4),
            (),
            accepts=switchable,
        ),
        Experiment(
            "attribution",
            "Attribution patching (of p, of log p, with AtP*'s attention fix and GradDrop) "
            "and integrated gradients graded against exact interchange, every built-in "
            "architecture on AR",
            "ar",
            {"model.architecture": list(BUILTIN_ARCHITECTURES)},
            (),
            plan=InterventionPlan(methods=METHODS),
            accepts=any_architecture,  # plugins too: any mixer with gradients is graded
        ),
    ]


#: ``Experiment.matrix`` of the two-layer hybrids: layer 0 by layer 1, per task.
LAYERS_MATRIX = "layers"

#: The architectures ``reproduce hybrids`` pairs: attention and four recurrent or
#: convolutional mixers (a selective SSM, the two delta rules, a long convolution).
HYBRID_PARTS = ["attention", "mamba", "deltanet", "gated_deltanet", "hyena"]


def _two_layers() -> list[list[str]]:
    """Every ordered pair of HYBRID_PARTS as a two-layer model (the pure forms among them)."""
    return [[first, second] for first in HYBRID_PARTS for second in HYBRID_PARTS]


def _hybrids() -> Experiment:
    """Every ordered pair of HYBRID_PARTS as a two-layer model (the pure forms among them),
    on AR and MQAR, and four-layer models on MQAR with more pairs (:func:`_deep_hybrids`), one
    recipe for all: which layer, of which architecture, carries the retrieval (a hybrid's
    label names it)."""
    # At quick and tiny: the LR that suits the recurrent mixers (AR's quick LRs) for every
    # model, two epochs, stopped at 99 % dev accuracy as the task matrix is; the test split
    # evaluated at the last evaluation only (the dev split decides the stop; the table reads
    # the final test metrics), which trains the same models in less time.
    recipe = {
        "training.lr": 3e-3,
        "training.epochs": 2,
        "training.eval_splits": ["dev"],
        "training.eval_at_end": ["test"],
    }
    return Experiment(
        "hybrids",
        "Hybrids: every ordered pair of attention, Mamba, DeltaNet, Gated DeltaNet and Hyena "
        "as two layers (pure forms included) on AR and MQAR, and one attention (or parallel "
        "attention + Mamba) layer at each depth of four on MQAR with more pairs: which layer "
        "carries the retrieval",
        "ar",
        {TASK_AXIS: ["ar", "mqar"], "model.layers": _two_layers(), "model.d_model": [64]},
        ("ar-restore", "mqar-restore"),
        fixed={"training.stop_at_accuracy": MATRIX_STOP_AT},
        fixed_at={"quick": recipe, "tiny": {"training.lr": 3e-3}},
        matrix=LAYERS_MATRIX,
        tiny_grid={
            "model.layers": [["mamba", "attention"], ["attention", "mamba"], ["hyena"] * 2],
            "model.d_model": [16],
        },
        # Which layer carries the retrieval is read at the block boundaries (and a parallel
        # layer's branch outputs): the other sites' restores would take most of the time.
        plan=InterventionPlan(scope="boundaries"),
        also=(_deep_hybrids(),),
    )


def _reassign_hybrids() -> Experiment:
    """The two-layer models of ``hybrids`` on reassign AR, a task that needs both kinds of
    memory: where the latest binding comes back, and whether a recurrent layer's state holds
    the answer when the query comes."""
    return Experiment(
        "reassign-hybrids",
        "The two-layer hybrids and their pure forms on reassign AR (the query key's value "
        "changes twice): where the latest binding comes back, and whether a state holds it",
        "reassign_ar",
        {"model.layers": _two_layers(), "model.d_model": [64]},
        ("reassign-ar-restore",),
        fixed={"training.stop_at_accuracy": MATRIX_STOP_AT},
        fixed_at={"quick": {"training.lr": 3e-3}, "tiny": {"training.lr": 3e-3}},
        matrix=LAYERS_MATRIX,
        tiny_grid={
            "model.layers": [["mamba", "attention"], ["attention", "mamba"]],
            "model.d_model": [16],
        },
    )


def _deep_hybrids() -> Part:
    """Four-layer models on MQAR with twice the preset's pairs (more than a small state
    holds): one attention layer at each depth among Mamba or Gated DeltaNet layers, one
    parallel attention + Mamba layer at each depth among Mamba layers, and the pure forms:
    where does attention take over? Their pairs name their runs apart from the two-layer
    models' (``mqar-mamba-d64-pairs8``)."""
    layers: list[list[Any]] = [["attention"] * 4]
    for other in ("mamba", "gated_deltanet"):
        layers.append([other] * 4)
        layers += [[other] * k + ["attention"] + [other] * (3 - k) for k in range(4)]
    parallel = {"parallel": ["attention", "mamba"]}
    layers += [["mamba"] * k + [parallel] + ["mamba"] * (3 - k) for k in range(4)]
    return Part(
        {TASK_AXIS: ["mqar"], "model.layers": layers, "model.d_model": [64], "task.n_pairs": [16]},
        fixed_at={
            # One epoch: every model that learns stops by step 1,500 of its 3,126 at 99 %
            # dev accuracy, and the 15 labels equal two epochs' (docs/hybrids.md). Half the
            # test documents (1,280 queries): their restores were most of these runs' time.
            "quick": {"training.epochs": 1, "task.seq_len": 32, "task.n_test": 160},
        },
        quick_grid={"task.n_pairs": [8]},
        tiny_grid={
            "model.layers": [layers[0], layers[3], layers[-1]],
            "model.d_model": [16],
            "task.n_pairs": [2],
        },
    )


def _catalog() -> dict[str, Experiment]:
    archs = _archs()
    conv_archs = [a for a in archs if switchable(a)]
    experiments = [
        *_paper_main(archs),
        *_paper_conv_ablations(),
        *_paper_appendix(archs),
        *_recall_variants(archs),
        *_conv_probes(conv_archs),
        _state_tracking(),
        *_matrices(archs, conv_archs),
        _hybrids(),
        _reassign_hybrids(),
    ]
    return {e.name: e for e in experiments}


def get_experiment(name: str) -> Experiment:
    catalog = _catalog()
    if name not in catalog:
        raise ConfigError(f"experiment: unknown {name!r} (expected one of: {', '.join(catalog)})")
    return catalog[name]


def list_experiments() -> list[Experiment]:
    return list(_catalog().values())
