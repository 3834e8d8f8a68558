"""Mechanistic metrics of a run folder: interchange interventions after (and during) training.

``intervene_run`` loads a finished run, builds its eval split, corrupts the key of each
document, runs the interchange engine and writes ``interventions.csv`` (tidy, in the results
store's schema) plus ``mechanism.json`` (the label and the numbers it was read from: the
restores at the label site, and on the original documents accuracy, in-context accuracy and
mass, the chance level of a guess among the in-context candidates and their mean count).
A plan with ``methods`` (interventions/attribution.py's ``METHODS``) also estimates the
same table from gradients, on the same documents, and grades each estimate against the
exact one (interventions/grading.py): ``attribution.csv`` holds the estimates (the
interventions' columns, ``source`` naming the estimator), ``attribution.json`` per method
its grade, its label and both engines' seconds. ``EmergenceCallback`` plugs into training
and records a small intervention set at every evaluation into ``emergence.csv``, so the
emergence of a mechanism can be plotted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import torch

from mecheval.errors import ConfigError
from mecheval.interventions import (
    CleanRuns,
    InterchangeResult,
    MechanismLabel,
    attribution_patching,
    clean_runs,
    grade,
    interchange,
    label_mechanism,
    label_sites,
    readable_sites,
)
from mecheval.interventions.attribution import DEFAULT_STEPS
from mecheval.interventions.intervals import interval_table
from mecheval.interventions.null import Null, measure_null, null_at_sites
from mecheval.io import atomic_write_text
from mecheval.models import LanguageModel
from mecheval.models.sites import (
    boundary_sites,
    last_layer_input,
    local_mixing_sites,
    parse_site,
    site_names,
    state_site_names,
)
from mecheval.schema import MEASUREMENT_COLUMNS
from mecheval.tasks import Batch, build_datasets, corrupt
from mecheval.tasks.scores import chance_level, n_candidates
from mecheval.training import load_run, read_status
from mecheval.training.folder import (
    ATTRIBUTION_FILE,
    EMERGENCE_FILE,
    GRADES_FILE,
    INTERVENTIONS_FILE,
    MECHANISM_FILE,
    unfinished,
)
from mecheval.training.resolved import ResolvedRun

#: Corruption seeds are offset from the data seed so the pair (o, c) is rebuilt exactly.
CORRUPTION_SEED_OFFSET = 7919


@dataclass(frozen=True)
class InterventionPlan:
    """Which interventions a sweep runs after training each model (None fields: all)."""

    sites: tuple[str, ...] | None = None
    #: Without ``sites``: "every site" of the model, or "boundaries": each block's input,
    #: ``final_norm.input`` and a parallel layer's branch outputs, all that the label and
    #: the layer that carries the retrieval are read from (interventions/carriers.py).
    scope: Literal["every site", "boundaries"] = "every site"
    roles: tuple[str, ...] | None = None
    split: str = "test"
    n_docs: int | None = None
    #: also record restores at the last layer's input at every evaluation (emergence.csv)
    during_training: bool = False
    #: "all" (the paper's way) or "key-dependent": leave out the documents the task says a
    #: model can answer without the key (the task config's ``key_free``; ATR: the answer is
    #: the root's head), which corrupting the key cannot move, so the restores have range to be read
    documents: Literal["all", "key-dependent"] = "all"
    #: estimators of the same table graded against it (interventions/attribution.py's
    #: METHODS); integrated gradients with ``steps`` points on its path
    methods: tuple[str, ...] = ()
    steps: int = DEFAULT_STEPS

    def check_tasks(self, tasks: Iterable[Any]) -> None:
        """ConfigError in one line where the plan asks for key-dependent documents of a task
        whose documents all need their key (AR): the choice would change nothing."""
        if self.documents != "key-dependent":
            return
        for task in tasks:
            if not task.has_key_free_documents:
                raise ConfigError(
                    f"--documents key-dependent: every document of the {task.kind} task "
                    "needs its key (none can be answered without it); use --documents all"
                )


def eval_batch(
    task: Any,
    split: str,
    n_docs: int | None,
    cache_dir: Path | None = None,
    documents: str = "all",
) -> tuple[Batch, Batch]:
    """The first ``n_docs`` documents of ``split`` (of its key-dependent ones, with
    ``documents="key-dependent"``) and their key-corrupted counterfactuals. With the dataset
    cache training used (``cache_dir``), they are read from it, not built again."""
    if split not in ("dev", "test"):
        raise ValueError(f"split: expected dev or test, got {split!r}")
    if cache_dir is not None:
        datasets = build_datasets(task, cache_dir=cache_dir)
    else:
        # The eval splits are drawn from their own seeded streams, so skipping the train
        # split leaves them byte-identical and saves building 100k documents.
        datasets = build_datasets(task.model_copy(update={"n_train": 0}))
    dataset = datasets[split]
    chosen = torch.arange(len(dataset))
    key_free = task.key_free(dataset.batch(chosen)) if documents == "key-dependent" else None
    if documents == "key-dependent" and key_free is None:
        InterventionPlan(documents="key-dependent").check_tasks([task])
    if key_free is not None:
        chosen = chosen[~key_free]
        if not len(chosen):
            raise ConfigError(
                f"documents: none of the {len(dataset)} {split} documents needs its key"
            )
    elif documents not in ("all", "key-dependent"):
        raise ValueError(f"documents: expected all or key-dependent, got {documents!r}")
    original = dataset.batch(chosen[:n_docs])
    return original, corrupt(original, task, seed=task.seed + CORRUPTION_SEED_OFFSET)


def tidy_rows(table: pd.DataFrame, split: str, step: int) -> pd.DataFrame:
    """The engine's table in the store's schema (condition/site/layer/component/io/role)."""
    rows = table.copy()
    rows["split"] = split
    rows["step"] = step
    parts = [parse_site(s) if s else (-1, "", "") for s in rows["site"]]
    rows["layer"] = [p[0] for p in parts]
    rows["component"] = [p[1] for p in parts]
    rows["io"] = [p[2] for p in parts]
    rows["source"] = "mechanistic"
    return rows[MEASUREMENT_COLUMNS]


def measure(
    model: LanguageModel,
    plan: InterventionPlan,
    step: int,
    pair: tuple[Batch, Batch],
    method: str = "exact",
    runs: CleanRuns | None = None,
) -> tuple[pd.DataFrame, InterchangeResult]:
    """The plan's interventions on ``model`` at training ``step``, on ``pair`` (original,
    corrupted: :func:`eval_batch`), by the exact engine (from ``runs``, the pair's clean
    runs, where :func:`exact_runs` made them) or estimated by ``method``."""
    original, corrupted = pair
    sites = list(plan.sites) if plan.sites else None
    roles = list(plan.roles) if plan.roles else None
    with _evaluating(model):
        if method == "exact":
            result = interchange(model, original, corrupted, sites=sites, roles=roles, runs=runs)
        else:
            result = attribution_patching(
                model, original, corrupted, sites, roles, method=method, steps=plan.steps
            )
    return tidy_rows(result.table, plan.split, step), result


def exact_runs(
    model: LanguageModel, plan: InterventionPlan, pair: tuple[Batch, Batch]
) -> CleanRuns:
    """The clean runs of ``pair`` the plan's exact restores start from, kept for the null's."""
    with _evaluating(model):
        return clean_runs(model, *pair, list(plan.sites) if plan.sites else None)


@contextmanager
def _evaluating(model: LanguageModel) -> Iterator[None]:
    """``model`` in eval mode inside, as it was after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@dataclass(frozen=True)
class Graded:
    """One estimator's run: its table (in the results store's schema), its grade against the
    exact engine and the seconds each took on the same documents."""

    method: str
    result: InterchangeResult
    rows: pd.DataFrame
    record: dict[str, Any]


def grade_methods(
    model: LanguageModel,
    plan: InterventionPlan,
    step: int,
    pair: tuple[Batch, Batch],
    exact: tuple[InterchangeResult, MechanismLabel | None, float],
    read_label: Callable[[pd.DataFrame], MechanismLabel | None],
) -> list[Graded]:
    """Every estimator of ``plan.methods`` on ``pair``, graded against ``exact`` (its result,
    its label and the seconds it took); ``read_label`` reads a label from a table as the
    exact one was read."""
    exact_result, exact_label, exact_seconds = exact
    graded = []
    for method in plan.methods:
        started = time.perf_counter()
        rows, result = measure(model, plan, step, pair, method=method)
        seconds = time.perf_counter() - started
        label = read_label(result.table)
        found = grade(
            method,
            exact_result,
            result,
            None if exact_label is None else str(exact_label.label),
            None if label is None else str(label.label),
        )
        record = {
            **asdict(found),
            "agrees": found.agrees,
            "gradable": found.gradable,
            "steps": plan.steps if method == "integrated-gradients" else None,
            "seconds": seconds,
            "exact_seconds": exact_seconds,
        }
        graded.append(Graded(method, result, rows.assign(source=method), record))
    return graded


def _measured_on(run_dir: Path) -> str | None:
    """The ``documents`` choice the run's written interventions used (None: unreadable)."""
    try:
        return json.loads((run_dir / MECHANISM_FILE).read_text()).get("documents", "all")
    except (OSError, ValueError, AttributeError):
        return None


def written_label(run_dir: Path) -> str | None:
    """The mechanism label written into the run folder (None: none, or unreadable)."""
    try:
        label = json.loads((run_dir / MECHANISM_FILE).read_text()).get("label")
    except (OSError, ValueError, AttributeError):
        return None
    return label if isinstance(label, str) else None


@dataclass(frozen=True)
class RunMechanism:
    """What :func:`intervene_run` measured: the engine's result (its own table, for views),
    the same numbers in the results store's schema (as written), and the label (None: the
    plan measured none of the sites it is read at, ``label_sites``)."""

    result: InterchangeResult
    rows: pd.DataFrame
    label: MechanismLabel | None
    n_docs: int  # the documents measured (after InterventionPlan.documents' choice)
    label_sites: tuple[str, ...]  # where a label can be read, in the order they are tried
    graded: tuple[Graded, ...] = ()  # the plan's estimators (InterventionPlan.methods)
    #: None for a done run; otherwise what the run is (folder.unfinished): its weights are
    #: not its final ones, and mechanism.json says so (``unfinished_run``).
    unfinished: str | None = None


def intervene_run(
    run_dir: str | Path,
    plan: InterventionPlan | None = None,
    skip_existing: bool = False,
    loaded: tuple[Any, LanguageModel] | None = None,
    cache_dir: Path | None = None,
    device: str = "cpu",
    run: ResolvedRun | None = None,
) -> RunMechanism | None:
    """Run the plan's interventions on a finished run and write them into its folder
    (None: ``skip_existing`` and they were there). ``loaded`` is the run's (config, model)
    when the caller has loaded it already; ``cache_dir`` the dataset cache it trained with;
    ``device`` where the model is loaded to run them. ``run``: the record the run trained
    from (a sweep's), which gives its config, dataset cache and device (where it trained).

    A plan whose sites carry no label (a recurrent state's alone) writes its restores and
    leaves ``mechanism.json`` as it was: the label, read from other sites of the same
    model, still holds."""
    run_dir = Path(run_dir)
    plan = plan or InterventionPlan()
    target = run_dir / INTERVENTIONS_FILE
    if skip_existing and measured_as_planned(run_dir, plan):
        return None
    if run is not None:
        cache_dir, device = run.cache_dir, run.device
    if loaded is None:
        loaded = load_run(run_dir, device, cfg=run.cfg if run is not None else None)
    cfg, model = loaded
    plan = _with_sites(plan, model, cfg.task.readings.in_state)
    step = int((read_status(run_dir) or {}).get("step", 0))
    not_done = unfinished(run_dir)
    pair = eval_batch(cfg.task, plan.split, plan.n_docs, cache_dir, plan.documents)
    started = time.perf_counter()
    runs = exact_runs(model, plan, pair)
    rows, result = measure(model, plan, step, pair, runs=runs)
    seconds = time.perf_counter() - started
    candidates = pair[0].candidates
    read_label, where = _label_reader(cfg, model, candidates)
    added, nulls = _null_and_intervals(model, pair, result, where, (plan.split, step), runs)
    rows = pd.concat([rows, added], ignore_index=True)
    label = read_label(result.table, result.per_example, nulls)
    graded: tuple[Graded, ...] = ()
    if plan.methods:
        graded = tuple(grade_methods(model, plan, step, pair, (result, label, seconds), read_label))
        _write_grades(run_dir, graded)
    if label is not None:
        _write_mechanism(run_dir, label, candidates, plan.documents, len(pair[0]), not_done)
    atomic_write_text(target, rows.to_csv(index=False))
    return RunMechanism(result, rows, label, len(pair[0]), where, graded, not_done)


def _with_sites(plan: InterventionPlan, model: LanguageModel, in_state: bool) -> InterventionPlan:
    """``plan`` with its sites named for ``model`` where it names none: the block boundaries
    (``scope="boundaries"``), or, for a task that reads recurrent states too (``in_state``),
    every module site and every state site; else as it is (every module site)."""
    if plan.sites is not None:
        return plan
    if plan.scope == "boundaries":
        return replace(plan, sites=tuple(boundary_sites(model)))
    if in_state:
        return replace(plan, sites=(*site_names(model), *state_site_names(model)))
    return plan


def measured_as_planned(run_dir: Path, plan: InterventionPlan) -> bool:
    """Whether the run's interventions.csv is there, on the plan's documents, and graded
    where the plan grades estimates."""
    was_graded = not plan.methods or (run_dir / GRADES_FILE).exists()
    on_documents = _measured_on(run_dir) == plan.documents
    return (run_dir / INTERVENTIONS_FILE).exists() and on_documents and was_graded


def _null_and_intervals(
    model: LanguageModel,
    pair: tuple[Batch, Batch],
    result: InterchangeResult,
    label_sites: Sequence[str],
    at: tuple[str, int],
    runs: CleanRuns,
) -> tuple[pd.DataFrame, dict[str, Null] | None]:
    """The null at the label sites ``result`` measured (interventions/null.py), from the
    clean runs ``runs`` its restores started from, and the rows the restores add to the
    run's table (split and step ``at``): the null's restores, and every restore's interval
    (the null's too)."""
    measured = set(result.table.site)
    sites = [site for site in label_sites if site in measured]
    null = measure_null(model, *pair, sites, runs=runs)
    examples = [result.per_example, *([] if null is None else [null.per_example])]
    added = [] if null is None else [null.table[null.table.condition == "restored"]]
    added.append(interval_table(pd.concat(examples)))
    rows = pd.concat([tidy_rows(table, *at) for table in added], ignore_index=True)
    return rows, None if null is None else null_at_sites(null.per_example)


def _label_reader(
    cfg: Any, model: LanguageModel, candidates: torch.Tensor | None
) -> tuple[Callable[[pd.DataFrame], MechanismLabel | None], tuple[str, ...]]:
    """The run's label from a table (None where the table has no restores at its label
    sites), and those sites."""
    readings = cfg.task.readings
    local_sites = local_mixing_sites(model, 0)
    n_layers = cfg.model.n_layers
    # A hybrid's retrieval label names the layer that carries it.
    names = [layer.name for layer, _ in cfg.model.layer_configs()] if cfg.model.is_hybrid else None
    chance = None if candidates is None else chance_level(candidates)

    def read_label(
        table: pd.DataFrame,
        per_example: pd.DataFrame | None = None,
        nulls: Mapping[str, Null] | None = None,
    ) -> MechanismLabel | None:
        if not readable_sites(table, n_layers, local_sites, readings):
            return None
        return label_mechanism(
            table,
            n_layers,
            chance=chance,
            local_sites=local_sites,
            readings=readings,
            per_example=per_example,
            nulls=nulls,
            layer_names=names,
        )

    return read_label, tuple(label_sites(n_layers, local_sites))


def _write_mechanism(
    run_dir: Path,
    label: MechanismLabel,
    candidates: torch.Tensor | None,
    documents: str,
    n_docs: int,
    not_done: str | None = None,
) -> None:
    """mechanism.json: the label with its restores, the intervals of their fractions and
    whether that makes the label fragile, range and the documents it was read on (and, read
    from a run that is not done, what the run was: ``unfinished_run``)."""
    record = {
        **{k: v for k, v in asdict(label).items() if k != "carrier" or v is not None},
        "fragile": label.fragile,
        "range": label.range,
        "mean_candidates": None
        if candidates is None
        else float(n_candidates(candidates).double().mean()),
        "documents": documents,
        "n_docs": n_docs,
    }
    if not_done is not None:
        record["unfinished_run"] = not_done
    atomic_write_text(run_dir / MECHANISM_FILE, json.dumps(record, indent=2) + "\n")


def _write_grades(run_dir: Path, graded: Sequence[Graded]) -> None:
    """The estimating methods' tables (attribution.csv) and grades (attribution.json)."""
    estimates = pd.concat([g.rows for g in graded], ignore_index=True)
    records = [g.record for g in graded]
    atomic_write_text(run_dir / ATTRIBUTION_FILE, estimates.to_csv(index=False))
    atomic_write_text(run_dir / GRADES_FILE, json.dumps(records, indent=2) + "\n")


class EmergenceCallback:
    """A training callback: at every evaluation, restore @ key/value/query at the last
    layer's input on a few documents, appended to ``emergence.csv``.

    Cheap enough to leave on: one clean and one batched patched forward over ``n_docs``
    documents per evaluation.
    """

    def __init__(
        self,
        task: Any,
        n_layers: int,
        n_docs: int = 64,
        split: str = "dev",
        cache_dir: Path | None = None,
        documents: Literal["all", "key-dependent"] = "all",
    ) -> None:
        self.task = task
        self.cache_dir = cache_dir
        self.plan = InterventionPlan(
            sites=(last_layer_input(n_layers),),
            roles=("key", "value", "query"),
            split=split,
            n_docs=n_docs,
            documents=documents,
        )
        self._pair: tuple[Batch, Batch] | None = None  # built at the first evaluation

    def __call__(self, step: int, model: LanguageModel, run_dir: Path) -> dict[str, float]:
        """Measure at ``step``, append to ``emergence.csv``, and return the likelihoods for
        the run's trackers: ``emergence/original``, ``emergence/corrupted`` and
        ``emergence/restore_<role>``."""
        if self._pair is None:
            self._pair = eval_batch(
                self.task, self.plan.split, self.plan.n_docs, self.cache_dir, self.plan.documents
            )
        rows, _ = measure(model, self.plan, step, self._pair)
        likelihoods = rows[rows["metric"] == "likelihood"]
        logged = {
            f"emergence/{'restore_' + row.role if row.role else row.condition}": float(row.value)
            for row in likelihoods.itertuples()
        }
        path = Path(run_dir) / EMERGENCE_FILE
        if path.exists():
            previous = pd.read_csv(path, keep_default_na=False)
            # A resumed run re-evaluates from its checkpoint: drop what it will write again.
            rows = pd.concat([previous[previous["step"] < step], rows], ignore_index=True)
        atomic_write_text(path, rows.to_csv(index=False))
        return logged
