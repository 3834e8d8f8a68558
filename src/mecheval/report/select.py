"""Which runs a figure shows, and the cells it summarises them into.

The ablation knobs have *default* values (2 layers, position embeddings on, Mamba ``d_conv``
4, Based short conv, parent queries, no train/test split). A figure that is not about a knob
keeps only runs at its default: strictly for the task knobs (``task.query``, ``task.split``),
and per architecture only where the default occurs for the model knobs (so a sweep of 3-layer
models still has an ``ar-restore``). If several settings still share a cell, the best one by
dev likelihood is shown, like the LR.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from mecheval.errors import ConfigError
from mecheval.models.registry import ARCHITECTURES, architecture_label
from mecheval.report.results import (
    ARCH,
    D_MODEL,
    N_LAYERS,
    grouping_key,
    is_missing,
    normalise,
    run_info,
    setting_columns,
)
from mecheval.report.tables import Measure, cell_summary
from mecheval.tasks import task_label

KIND = "task.kind"
QUERY = "task.query"
TASK_SPLIT = "task.split"
PE = "model.position_embedding"
D_CONV = "model.mixer.d_conv"
LONG_CONV = "model.mixer.long_conv"
#: Derived columns, added per figure. Not config columns, so LR tuning never treats them as
#: a setting to choose between.
ARCH_LABEL = "_arch"
ROW = "_row"


class NoData(ConfigError):
    """The results table has nothing a figure can show; the registry names the figure."""


@dataclass
class Section:
    """One row of panels sharing rows and columns (one sub-figure of a paper figure)."""

    title: str
    data: pd.DataFrame  # cell_summary output
    panels: list[str]
    rows: list[Any]
    cols: list[Any]
    row_label: str
    col_label: str = "d_model"
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- runs


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """The normalised table with each run's architecture label, or NoData."""
    df = normalise(df)
    if df.empty:
        raise NoData("the results table is empty")
    for column in (ARCH, D_MODEL):
        if column not in df.columns:
            raise NoData(f"the results table has no {column} column")
    return df.assign(**{ARCH_LABEL: df[ARCH].map(lambda a: architecture_label(str(a)))})


def of_kind(df: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The rows of runs on task ``kind`` ("ar", "atr")."""
    if KIND not in df.columns:
        raise NoData(f"the results table has no {KIND} column")
    return df[df[KIND].astype(str).str.lower() == kind]


def _runs_where(df: pd.DataFrame, keep: pd.Series) -> pd.DataFrame:
    info = run_info(df)
    return df[df["run"].isin(set(info.loc[keep.to_numpy(), "run"]))]


def _is(values: pd.Series, test: Callable[[Any], bool]) -> pd.Series:
    return values.map(lambda v: bool(test(v)))


def standard(df: pd.DataFrame, keep: Iterable[str] = ()) -> pd.DataFrame:
    """Runs at the default of every ablation knob not in ``keep`` (see the module doc)."""
    keep = set(keep)
    if df.empty:
        return df
    info = run_info(df)
    mask = pd.Series(True, index=info.index)
    strict = {
        QUERY: lambda v: is_missing(v) or str(v) == "parent",
        TASK_SPLIT: lambda v: is_missing(v) or float(v) == 0.0,
    }
    for column, test in strict.items():
        if column in info.columns and column not in keep:
            mask &= _is(info[column], test)
    arch = info[ARCH].astype(str)
    # Each test sees (value, architecture): the paper's figures train attention with position
    # embeddings and the other mixers without (the registry's default per architecture).
    prefer: dict[str, tuple[Callable[[Any, str], bool], set[str] | None]] = {
        N_LAYERS: (lambda v, a: is_missing(v) or int(v) == 2, None),
        PE: (lambda v, a: is_missing(v) or bool(v) == default_position_embedding(a), None),
        D_CONV: (lambda v, a: not is_missing(v) and float(v) == 4.0, {"mamba"}),
        LONG_CONV: (lambda v, a: is_missing(v) or not bool(v), {"based"}),
    }
    for column, (test, archs) in prefer.items():
        if column not in info.columns or column in keep:
            continue
        # Per architecture: prefer the default where it was trained, else keep what there is.
        for name in arch.unique():
            if archs is not None and name not in archs:
                continue
            ok = _is(info[column], lambda v, name=name, test=test: test(v, name))
            here = (arch == name) & mask
            if (here & ok).any():
                mask &= ~here | ok
    return _runs_where(df, mask)


def default_position_embedding(architecture: str) -> bool:
    """The architecture's default (an unknown one: on, as runs before the default was per
    architecture were trained); a hybrid's (``mamba+attention``): on where every layer's is."""
    parts = re.split(r"[+~]", architecture)
    if len(parts) > 1:
        return all(default_position_embedding(part) for part in parts)
    known = ARCHITECTURES.get(architecture)
    return True if known is None else known.position_embedding


def distinct(df: pd.DataFrame, column: str) -> list[Any]:
    """The values ``column`` takes over the runs, sorted, missing as None."""
    if column not in df.columns:
        return []
    return sorted({grouping_key(v) for v in run_info(df)[column]}, key=sort_key)


def has_mechanistic(df: pd.DataFrame) -> bool:
    return bool((df["source"] == "mechanistic").any())


def task_labels(df: pd.DataFrame) -> dict[str, str]:
    """run -> "AR" / "ATR" / "ATR (query=sibling)": the kind plus any task knob that varies
    among the runs of that kind."""
    info = run_info(df)
    if KIND not in info.columns:
        return dict.fromkeys(info["run"], "")
    kinds = info[KIND].astype(str).map(task_label)
    columns = [c for c in setting_columns(df) if c.startswith("task.") and c != KIND]
    out: dict[str, str] = {}
    for kind in kinds.unique():
        runs = info[kinds == kind]
        varying = [c for c in columns if len({grouping_key(v) for v in runs[c]}) > 1]
        for _, row in runs.iterrows():
            extra = ", ".join(f"{c[5:]}={value_label(row[c])}" for c in varying)
            out[row["run"]] = f"{kind} ({extra})" if extra else kind
    return out


# ---------------------------------------------------------------------------- order, labels


def sort_key(value: Any) -> tuple[int, Any]:
    """Missing first, then numbers by size, then text: config values of mixed types sort."""
    if value is None:
        return (0, 0)
    if isinstance(value, int | float | np.number) and not isinstance(value, bool):
        return (1, float(value))
    return (2, str(value))


def arch_key(label: Any) -> tuple[int, str]:
    """Architecture labels in the registry's order; unknown (custom) ones after, by name."""
    order = [architecture_label(a) for a in ARCHITECTURES]
    return (order.index(label), "") if label in order else (len(order), str(label))


def value_label(value: Any) -> str:
    """A config value as a row, column or task label: 1e-3 not 0.001, 64 not 64.0."""
    if is_missing(value):
        return "none"
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, float | np.floating):
        return str(int(value)) if float(value).is_integer() else f"{value:.0e}"
    return str(value)


# ---------------------------------------------------------------------------- sections


def section(
    parts: Sequence[tuple[pd.DataFrame, Sequence[Measure]]],
    row: str,
    title: str,
    row_label: str,
    *,
    tune: bool = True,
    tune_metric: str = "likelihood",
    row_key: Callable[[Any], Any] = sort_key,
    reverse: bool = False,
) -> Section:
    """Summaries of each part's measures over its runs on a ``row`` x d_model grid, LR-tuned
    per cell unless ``tune`` is off."""
    frames, panels, rows, cols = [], [], set(), set()
    for subset, measures in parts:
        panels.extend(m.label for m in measures)
        if subset.empty:
            continue
        frames.append(
            cell_summary(subset, measures, row, D_MODEL, tune=tune, tune_metric=tune_metric)
        )
        info = run_info(subset)
        rows |= {grouping_key(v) for v in info[row]}
        cols |= {grouping_key(v) for v in info[D_MODEL]}
    data = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return Section(
        title=title,
        data=data,
        panels=panels,
        rows=sorted(rows, key=row_key, reverse=reverse),
        cols=sorted(cols, key=sort_key),
        row_label=row_label,
    )


def by_arch(
    parts: Sequence[tuple[pd.DataFrame, Sequence[Measure]]], title: str = "", **kw: Any
) -> Section:
    """A section with architecture rows in the registry's order: most figures' layout."""
    return section(parts, ARCH_LABEL, title, "architecture", row_key=arch_key, **kw)
