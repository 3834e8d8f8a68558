"""The paper's figures, one decorated spec each: ``@figure(name)``, prepared results table in,
layout out (see :mod:`mecheval.report.registry`). Registration order is the report's order.

Each spec picks the runs its figure is about (:mod:`mecheval.report.select`), LR-tunes them
per cell as the paper does (best mean final dev likelihood over seeds, unless said otherwise)
and lays them out in the paper's layout (:mod:`mecheval.report.render`) -- heatmaps with
architecture (or LR, or conv size) rows and d_model columns, one panel per condition.
A table without the runs a figure needs raises :class:`NoData`, which says what is missing.
The figures the paper does not number are in :mod:`mecheval.report.extra_specs`, registered
after these.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import pandas as pd

from mecheval.models.sites import LAST, describe_site, layer_site
from mecheval.report.registry import figure
from mecheval.report.render import Heatmaps, dev_test_scatter
from mecheval.report.results import ARCH, D_MODEL, LR, N_LAYERS, is_missing, run_info
from mecheval.report.select import (
    ARCH_LABEL,
    D_CONV,
    LONG_CONV,
    PE,
    QUERY,
    ROW,
    TASK_SPLIT,
    NoData,
    arch_key,
    by_arch,
    distinct,
    has_mechanistic,
    of_kind,
    section,
    standard,
    task_labels,
    value_label,
)
from mecheval.report.tables import (
    RESTORE_SITE,
    Measure,
    behaviour,
    best_lr,
    corrupted,
    has_site,
    measure_values,
    original,
    restore_measures,
    restored,
    site_names,
)

#: Where Based's short-conv kernel size may live in its mixer options.
BASED_KERNEL_COLUMNS = (
    "model.mixer.kernel_size",
    "model.mixer.conv_kernel_size",
    "model.mixer.short_conv_size",
    "model.mixer.d_conv",
)


def site_title(df: pd.DataFrame, site: str) -> str:
    """``site`` as a title names it: the runs' actual sites, then the template in prose
    (``layers.1.input (the last layer's input)``), so a reader can find them in the table."""
    names = site_names(df, site)
    prose = describe_site(site)
    return f"{', '.join(names)} ({prose})" if names and names != [prose] else prose


def restore_heatmaps(
    df: pd.DataFrame,
    kind: str,
    figure_label: str,
    roles: tuple[str, ...] = ("key", "value", "query"),
) -> Heatmaps:
    rel = standard(of_kind(df, kind))
    if rel.empty or not has_site(rel, RESTORE_SITE):
        raise NoData(
            f"no {kind.upper()} runs with interventions at {describe_site(RESTORE_SITE)} in "
            "this results table"
        )
    title = (
        f"{figure_label}: likelihood of the answer, original, key corrupted, and restored at "
        f"{site_title(rel, RESTORE_SITE)}"
    )
    return Heatmaps(title, [by_arch([(rel, restore_measures(roles=roles))])], rel)


@figure(
    "ar-restore",
    "Where restoring one role at the last layer's input brings the answer back: high @ "
    "value means induction (the answer stored at the value), high @ query means direct "
    "retrieval; compare each restore with original (the ceiling) and corrupted (the "
    "floor).",
)
def ar_restore(df: pd.DataFrame) -> Heatmaps:
    """Fig. 3: AR, original / corrupted key / restored at layers.{last}.input @ key, value,
    query; architecture x d_model; LR-tuned."""
    return restore_heatmaps(df, "ar", "Fig. 3, AR")


# ---------------------------------------------------------------------------- convolutions


def _conv_label(value: Any) -> str:
    return "none" if is_missing(value) else str(int(float(value)))


def _conv_key(label: Any) -> tuple[int, float]:
    return (0, 0.0) if label == "none" else (1, float(label))


def _mamba_by_conv(rel: pd.DataFrame) -> pd.DataFrame:
    mamba = rel[rel[ARCH].astype(str) == "mamba"]
    if mamba.empty or D_CONV not in mamba.columns:
        return mamba.iloc[0:0]
    mamba = mamba.assign(**{ROW: mamba[D_CONV].map(_conv_label)})
    return mamba if mamba[ROW].nunique() >= 2 else mamba.iloc[0:0]


def _based_variant(row: pd.Series, kernel: str | None) -> str:
    if LONG_CONV in row.index and not is_missing(row[LONG_CONV]) and bool(row[LONG_CONV]):
        return "long conv"
    if kernel is not None and not is_missing(row[kernel]):
        return f"short, k={value_label(row[kernel])}"
    return "short conv"


def _based_key(label: Any) -> tuple[int, float]:
    if label == "long conv":
        return (2, 0.0)
    text = str(label)
    return (1, float(text.split("=")[1])) if "=" in text else (0, 0.0)


@figure(
    "conv-ablation",
    "How the short convolution's size changes Mamba's accuracy and which role's restore "
    "brings the answer back (a), and whether Based needs its short conv or its implicit "
    "long conv (b).",
)
def conv_ablation(df: pd.DataFrame) -> Heatmaps:
    """Fig. 4: (a) AR Mamba by ``model.mixer.d_conv`` (none, 1..4) x d_model: accuracy and
    original / corrupted / restored @ key, value, query at layers.{last}.input; (b) AR Based
    accuracy, short conv (by kernel size) vs implicit long conv (``model.mixer.long_conv``)."""
    rel = standard(of_kind(df, "ar"), keep={D_CONV, LONG_CONV, *BASED_KERNEL_COLUMNS})
    sections, used_parts = [], []
    mamba = _mamba_by_conv(rel)
    if not mamba.empty:
        used_parts.append(mamba)
        sections.append(
            section(
                [(mamba, [behaviour("Accuracy"), *restore_measures()])],
                ROW,
                "(a) Mamba, by short-conv size d_conv",
                "d_conv",
                row_key=_conv_key,
            )
        )
    based = rel[rel[ARCH].astype(str) == "based"]
    if not based.empty:
        kernel = next(
            (c for c in BASED_KERNEL_COLUMNS if c in based.columns and based[c].notna().any()),
            None,
        )
        labels = {r["run"]: _based_variant(r, kernel) for _, r in run_info(based).iterrows()}
        based = based.assign(**{ROW: based["run"].map(labels)})
        if based[ROW].nunique() >= 2:
            used_parts.append(based)
            sections.append(
                section(
                    [(based, [behaviour("Accuracy")])],
                    ROW,
                    "(b) Based, short conv vs implicit long conv",
                    "conv",
                    row_key=_based_key,
                )
            )
    if not sections:
        raise NoData(
            f"no AR Mamba runs with several {D_CONV} values, nor Based runs "
            f"with several conv settings, in this results table"
        )
    title = "Fig. 4, ablating short convolutions in Mamba and Based"
    return Heatmaps(title, sections, pd.concat(used_parts))


@figure(
    "mamba-conv-sites",
    "Whether Mamba's short convolutions carry the answer: a restore at a conv output "
    "near original means the conv moves what the answer needs, near corrupted that it "
    "does not; every LR, no tuning.",
)
def mamba_conv_sites(df: pd.DataFrame) -> Heatmaps:
    """Fig. 5: AR Mamba, every LR x d_model (no tuning): original, corrupted, restored at
    layers.0.mixer.conv.output @ value and @ next_key, and layers.1.mixer.conv.output @ value."""
    rel = standard(of_kind(df, "ar"))
    rel = rel[rel[ARCH].astype(str) == "mamba"]
    site0, site1 = layer_site(0, "mixer.conv.output"), layer_site(1, "mixer.conv.output")
    if rel.empty or not has_site(rel, site0) or LR not in rel.columns:
        raise NoData(f"no AR Mamba runs with interventions at {site0} in this results table")
    measures = [
        original(),
        corrupted(),
        restored("value", site0, "Restored @ 0, value"),
        restored("next_key", site0, "Restored @ 0, next key"),
        restored("value", site1, "Restored @ 1, value"),
    ]
    return Heatmaps(
        "Fig. 5, AR Mamba: restoring the key at the short-conv outputs",
        [section([(rel, measures)], LR, "", "LR", tune=False, reverse=True)],
        rel,
        tuned="every LR shown (no tuning)",
    )


@figure(
    "atr-restore",
    "As ar-restore on ATR: which role's restore at the last layer's input brings the "
    "parent back (@ value: induction, @ query: direct retrieval).",
)
def atr_restore(df: pd.DataFrame) -> Heatmaps:
    """Fig. 7: as Fig. 3 on ATR (parent queries, no train/test split)."""
    return restore_heatmaps(df, "atr", "Fig. 7, ATR")


@figure(
    "atr-mamba-conv",
    "As conv-ablation on ATR: Mamba's accuracy and restores by short-conv size.",
)
def atr_mamba_conv(df: pd.DataFrame) -> Heatmaps:
    """Fig. 8: ATR Mamba by ``model.mixer.d_conv`` x d_model: original / corrupted /
    restored @ query, key, value at layers.{last}.input; LR-tuned."""
    mamba = _mamba_by_conv(standard(of_kind(df, "atr"), keep={D_CONV}))
    if mamba.empty or not has_site(mamba, RESTORE_SITE):
        raise NoData(
            f"no ATR Mamba runs with several {D_CONV} values and interventions "
            "in this results table"
        )
    measures = restore_measures(roles=("query", "key", "value"))
    sections = [section([(mamba, measures)], ROW, "", "d_conv", row_key=_conv_key)]
    return Heatmaps("Fig. 8, ATR Mamba by short-conv size", sections, mamba)


# ---------------------------------------------------------------------------- ablations


@figure(
    "pos-emb",
    "Whether position embeddings matter: each architecture's dev accuracy with against "
    "without them, one section per task setting.",
)
def pos_emb(df: pd.DataFrame) -> Heatmaps:
    """Fig. 9: final dev accuracy with vs without ``model.position_embedding``, architecture
    x d_model, one section per task setting (kind plus varying task knobs); LR-tuned."""
    if len(distinct(df, PE)) < 2:
        raise NoData(f"needs runs with and without position embeddings ({PE})")
    rel = standard(df, keep={PE, QUERY, TASK_SPLIT})
    rel = rel.assign(
        _pe=rel[PE].map(lambda v: "PE" if is_missing(v) or bool(v) else "NoPE"),
        _task=rel["run"].map(task_labels(rel)),
    )
    sections = []
    for task in sorted(rel["_task"].unique()):
        sub = rel[rel["_task"] == task]
        parts = [(sub[sub["_pe"] == pe], [behaviour(f"{pe}, accuracy")]) for pe in ("PE", "NoPE")]
        sections.append(by_arch(parts, task))
    return Heatmaps("Fig. 9, accuracy with and without position embeddings", sections, rel)


@figure(
    "generalisation",
    "Whether ATR generalises to held-out query-answer pairs: dev against test accuracy "
    "per run (far below the diagonal: memorised), and the restores on both splits.",
)
def generalisation(df: pd.DataFrame) -> Heatmaps:
    """Fig. 10: ATR with a query-answer train/test split (``task.split`` set): dev and test
    accuracy of the best-by-dev-accuracy checkpoint per architecture x d_model, restores on
    both splits when present, and dev vs test accuracy of every run (best ones ringed)."""
    atr = of_kind(df, "atr")
    if TASK_SPLIT not in atr.columns:
        raise NoData(f"no ATR runs with {TASK_SPLIT} in this results table")
    atr = atr[atr[TASK_SPLIT].map(lambda v: not is_missing(v) and float(v) > 0)]
    rel = standard(atr, keep={TASK_SPLIT})
    if rel.empty:
        raise NoData(f"no ATR runs with a train/test split ({TASK_SPLIT}) in this results table")
    accuracy = [
        behaviour("Dev accuracy", split="dev"),
        behaviour("Test accuracy", "accuracy", "test"),
    ]
    sections = [by_arch([(rel, accuracy)], "(a) best-by-dev checkpoints", tune_metric="accuracy")]
    if has_mechanistic(rel):
        measures = [
            restored(role, label=f"Restored @ {role} ({split})", split=split)
            for split in ("dev", "test")
            for role in ("key", "value", "query")
        ]
        title = f"(c) interventions at {site_title(rel, RESTORE_SITE)}"
        sections.append(by_arch([(rel, measures)], title, tune_metric="accuracy"))
    # (b): every run's final dev vs test accuracy, the best-by-dev ones ringed.
    acc = measure_values(
        rel, [behaviour("dev", split="dev"), behaviour("test", "accuracy", "test")]
    )
    points = acc.pivot_table(index="run", columns="measure", values="value").reset_index()
    points = points.merge(run_info(rel)[["run", "status", ARCH_LABEL, D_MODEL]], on="run")
    points = points[points["status"] != "failed"]
    best = best_lr(rel, by=[ARCH_LABEL, D_MODEL], metric="accuracy", choose=None)
    points["best"] = points["run"].isin(set(best["run"]))
    groups = sorted(points[ARCH_LABEL].unique(), key=arch_key)
    return Heatmaps(
        "Fig. 10, ATR generalisation to held-out query-answer pairs",
        sections,
        rel,
        tuned="best checkpoint per cell by final dev accuracy",
        extra=partial(dev_test_scatter, points=points, by=ARCH_LABEL, groups=groups),
    )


# ---------------------------------------------------------------------------- depth


def _layers(n: int) -> str:
    return f"{n} layer" + ("s" if n != 1 else "")


@figure(
    "one-layer",
    "What a 1-layer model can do: its accuracy beside the 2-layer runs, and whether "
    "restoring the query at its mixer output brings the answer back (the only place it "
    "can write it).",
)
def one_layer(df: pd.DataFrame) -> Heatmaps:
    """Fig. 11: 1-layer models (``model.n_layers`` == 1) per task (AR, ATR): accuracy next to
    the 2-layer runs when present, and the 1-layer models' interventions -- original,
    corrupted, restored @ query at the mixer output (the only place a 1-layer model can write
    the answer)."""
    rel = standard(df, keep={N_LAYERS})
    if N_LAYERS not in rel.columns or not (rel[N_LAYERS] == 1).any():
        raise NoData(f"no 1-layer runs ({N_LAYERS} = 1) in this results table")
    rel = rel[rel[N_LAYERS].isin([1, 2])]
    rel = rel.assign(_task=rel["run"].map(task_labels(rel)))
    tasks = sorted(rel.loc[rel[N_LAYERS] == 1, "_task"].unique())
    sections = []
    for task in tasks:
        sub = rel[rel["_task"] == task]
        one, two = sub[sub[N_LAYERS] == 1], sub[sub[N_LAYERS] == 2]
        parts: list[tuple[pd.DataFrame, Sequence[Measure]]] = [
            (one, [behaviour("Accuracy, 1 layer")])
        ]
        if not two.empty:
            parts.append((two, [behaviour("Accuracy, 2 layers")]))
        if has_mechanistic(one):
            mixer = restored(
                "query",
                layer_site(LAST, "mixer.output"),
                "Restored @ query, mixer output, 1 layer",
            )
            parts.append(
                (one, [original("Original, 1 layer"), corrupted("Corrupted, 1 layer"), mixer])
            )
        sections.append(by_arch(parts, task))
    used = rel[rel["_task"].isin(set(tasks))]
    return Heatmaps("Fig. 11, 1-layer models on AR and ATR", sections, used)


@figure(
    "layer-count",
    "Which layer writes the answer: the restore @ query at each layer's mixer output, "
    "per layer count.",
)
def layer_count(df: pd.DataFrame) -> Heatmaps:
    """Fig. 12: AR models with 1-3 layers (several ``model.n_layers`` values): one section
    per layer count, accuracy and restored likelihood @ query at each layer's mixer output
    (which layer writes the answer)."""
    rel = standard(of_kind(df, "ar"), keep={N_LAYERS})
    counts = [n for n in distinct(rel, N_LAYERS) if n is not None]
    if len(counts) < 2:
        raise NoData(f"needs AR runs with several layer counts ({N_LAYERS})")
    sections = []
    for n in counts:
        sub = rel[rel[N_LAYERS] == n]
        measures = [behaviour("Accuracy")]
        if has_mechanistic(sub):
            measures += [
                restored(
                    "query", layer_site(i, "mixer.output"), f"Restored @ query, layer {i} mixer"
                )
                for i in range(int(n))
            ]
        sections.append(by_arch([(sub, measures)], _layers(int(n))))
    return Heatmaps("Fig. 12, AR with 1-3 layers", sections, rel)


@figure(
    "sibling",
    "Whether models answer sibling queries on ATR: accuracy per layer count, with the "
    "restores where measured.",
)
def sibling(df: pd.DataFrame) -> Heatmaps:
    """Fig. 13: ATR with sibling queries (``task.query`` == "sibling"): accuracy per layer
    count, architecture x d_model; interventions at layers.{last}.input when present."""
    atr = of_kind(df, "atr")
    if QUERY not in atr.columns or not (atr[QUERY].astype(str) == "sibling").any():
        raise NoData(f"no ATR runs with {QUERY} = sibling in this results table")
    rel = standard(atr[atr[QUERY].astype(str) == "sibling"], keep={QUERY, N_LAYERS})
    # None: the table has no layer count, so all runs form one group.
    counts = distinct(rel, N_LAYERS) or [None]

    def at(n: Any) -> pd.DataFrame:
        return rel if n is None else rel[rel[N_LAYERS] == n]

    def layers(n: Any) -> str:
        return "" if n is None else f", {_layers(int(n))}"

    parts = [(at(n), [behaviour(f"Accuracy{layers(n)}")]) for n in counts]
    sections = [by_arch(parts, "accuracy")]
    for n in counts:
        sub = at(n)
        if (n is None or n > 1) and has_site(sub, RESTORE_SITE):
            sections.append(by_arch([(sub, restore_measures())], f"interventions{layers(n)}"))
    return Heatmaps("Fig. 13, ATR sibling queries", sections, rel)
