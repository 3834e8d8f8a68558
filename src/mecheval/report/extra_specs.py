"""The figures beyond the paper's numbered ones, registered after them (report/specs.py), in
this order: mechanistic metrics over training, the AR family's tasks, and zoology's accuracy
against state size. Each is a decorated spec as in report/specs.py."""

from __future__ import annotations

import pandas as pd

from mecheval.report.curves import Curves
from mecheval.report.registry import figure
from mecheval.report.render import Heatmaps, StateScatter
from mecheval.report.results import D_MODEL, run_info
from mecheval.report.select import (
    ARCH_LABEL,
    QUERY,
    TASK_SPLIT,
    NoData,
    arch_key,
    standard,
    task_labels,
)
from mecheval.report.specs import restore_heatmaps, site_title
from mecheval.report.tables import (
    RESTORE_SITE,
    _run_scores,
    best_lr,
    measure_values,
    restore_measures,
    seed_summary,
)

# ---------------------------------------------------------------------------- training


@figure(
    "emergence",
    "When the mechanism forms during training: the restore that rises to the original "
    "curve is the mechanism's role; markers tell apart lines that coincide (equal "
    "values are drawn on top of each other).",
)
def emergence(df: pd.DataFrame) -> Curves:
    """Mechanistic metrics over training: original, corrupted and restored likelihood @ key,
    value, query at layers.{last}.input against the step, per task x architecture (rows) and
    d_model (columns), for runs with interventions at two or more steps; LR-tuned."""
    # Task knobs are kept apart by the task label below rather than filtered to defaults.
    rel = standard(df, keep={QUERY, TASK_SPLIT})
    mech = rel[rel["source"] == "mechanistic"]
    steps = mech.groupby("run")["step"].nunique()
    multi = set(steps[steps >= 2].index)
    if not multi:
        raise NoData(
            "no runs with interventions at two or more training steps in this results table"
        )
    info = run_info(rel)
    # Failed runs stay, so the summary counts them.
    keep = set(info.loc[info["status"] == "failed", "run"]) | multi
    rel = rel[rel["run"].isin(keep)]
    rel = rel.assign(_task=rel["run"].map(task_labels(rel)))
    selected = best_lr(rel, by=["_task", ARCH_LABEL, D_MODEL], choose=None)
    measures = restore_measures()
    values = measure_values(selected, measures, all_steps=True)
    values = values.merge(run_info(selected)[["run", "status", "_task", ARCH_LABEL, D_MODEL]])
    data = seed_summary(values, by=["_task", ARCH_LABEL, D_MODEL, "measure", "step"])
    data = data.rename(columns={"_task": "task", ARCH_LABEL: "architecture", D_MODEL: "d_model"})
    panels = sorted(
        {(t, a) for t, a in zip(data["task"], data["architecture"], strict=True)},
        key=lambda p: (p[0], arch_key(p[1])),
    )
    return Curves(
        title="mechanistic metrics over training",
        plot_title=f"restored likelihood at {site_title(rel, RESTORE_SITE)} over training",
        data=data,
        panels=panels,
        measures=[m.label for m in measures],
        runs=rel,
    )


# ---------------------------------------------------------------------------- task family
@figure(
    "noisy-ar-restore",
    "As ar-restore on noisy AR: which role's restore brings the answer back despite the "
    "noise tokens.",
)
def noisy_ar_restore(df: pd.DataFrame) -> Heatmaps:
    """Noisy AR: as Fig. 3, restored @ key, value, query."""
    return restore_heatmaps(df, "noisy_ar", "Noisy AR")


@figure(
    "overwrite-ar-restore",
    "As ar-restore on overwrite AR: whether the answer comes from the latest occurrence "
    "(@ key, value) or the overwritten one (@ stale key, stale value).",
)
def overwrite_ar_restore(df: pd.DataFrame) -> Heatmaps:
    """Overwrite AR: as Fig. 3, restored @ key, value, query (the latest
    occurrence) and @ stale key, stale value (the overwritten one)."""
    roles = ("key", "value", "query", "stale_key", "stale_value")
    return restore_heatmaps(df, "overwrite_ar", "Overwrite AR", roles)


@figure(
    "reassign-ar-restore",
    "As ar-restore on reassign AR: whether the answer comes from the query key's latest "
    "binding (@ key, value) or the one before it (@ stale key, stale value).",
)
def reassign_ar_restore(df: pd.DataFrame) -> Heatmaps:
    """Reassign AR: as Fig. 3, restored @ key, value, query (the latest binding) and
    @ stale key, stale value (the binding before it)."""
    roles = ("key", "value", "query", "stale_key", "stale_value")
    return restore_heatmaps(df, "reassign_ar", "Reassign AR", roles)


@figure(
    "mqar-restore",
    "As ar-restore on MQAR, one probe per query: which role's restore brings each answer back.",
)
def mqar_restore(df: pd.DataFrame) -> Heatmaps:
    """MQAR: as Fig. 3, one probe per query, restored @ key, value, query."""
    return restore_heatmaps(df, "mqar", "MQAR")


@figure(
    "compositional-mqar-restore",
    "Where a two-token key is composed: a restore at the second key token but not the "
    "first means the model binds the key only once both tokens are read.",
)
def compositional_mqar_restore(df: pd.DataFrame) -> Heatmaps:
    """Compositional MQAR: restored @ each key token, the value and each query
    token, to show where the two-token key is composed."""
    roles = ("key_first", "key_last", "value", "query_first", "query")
    return restore_heatmaps(df, "compositional_mqar", "Compositional MQAR", roles)


@figure(
    "reverse-ar-restore",
    "How reverse AR is solved: a restore @ value (before its key, where a causal model "
    "cannot have read the key) near original means the model stores it there; @ after "
    "key or @ query means it retrieves later.",
)
def reverse_ar_restore(df: pd.DataFrame) -> Heatmaps:
    """Reverse AR: restored @ value (before its key: a causal model cannot have moved the
    key there), key, the token after the key, query."""
    roles = ("value", "key", "next_key", "query")
    return restore_heatmaps(df, "reverse_ar", "Reverse AR", roles)


@figure(
    "stacked-mqar-restore",
    "The protocol's control (key and value in one token, nothing to shift): the restore "
    "@ key should carry the answer for induction-like models, @ query for direct "
    "retrieval.",
)
def stacked_mqar_restore(df: pd.DataFrame) -> Heatmaps:
    """Stacked MQAR, the protocol's control: restored @ key (the key and its value's one
    position), the position after it, query."""
    roles = ("key", "next_key", "query")
    return restore_heatmaps(df, "stacked_mqar", "Stacked MQAR", roles)


# ---------------------------------------------------------------------------- state size
@figure(
    "state-size",
    "Accuracy against the floats each model carries per sequence: which architectures "
    "recall more with less state (zoology's Pareto view).",
)
def state_size(df: pd.DataFrame) -> StateScatter:
    """Zoology's accuracy against state size: each finished run's final test
    accuracy against the floats its model carries per sequence (results column state_size),
    for any experiment."""
    if "state_size" not in df.columns or df["state_size"].isna().all():
        raise NoData("no run with a known state size in this results table")
    accuracy = _run_scores(df, "test", "accuracy")
    if accuracy.empty:
        raise NoData("no finished run with a test accuracy in this results table")
    info = run_info(df).set_index("run")
    data = pd.DataFrame(
        {
            "run": accuracy.index,
            "architecture": info.loc[accuracy.index, ARCH_LABEL].to_numpy(),
            "state_size": info.loc[accuracy.index, "state_size"].to_numpy(),
            "accuracy": 100 * accuracy.to_numpy(),
        }
    ).dropna(subset=["state_size"])
    if data.empty:
        raise NoData("no finished run with a known state size in this results table")
    data = data.sort_values(["architecture", "state_size"], key=_arch_then_value)
    return StateScatter("test accuracy against state size", data.reset_index(drop=True), df)


def _arch_then_value(column: pd.Series) -> pd.Series:
    return column.map(arch_key) if column.name == "architecture" else column
