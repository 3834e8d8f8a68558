"""Summary tables over an experiment's tidy results table.

The input is the long table built by :func:`mecheval.experiments.store.load_results` (one row
per value; config columns ``task.*``, ``model.*``, ``training.*`` broadcast to every row of a
run). Everything here is pure pandas, so it can be checked on hand-made tables.

Conventions, following the paper (§4.2):

* A *setting* is a run's config without its seeds and without fields that only say how the
  run was executed (threads, device, ...). Runs that share a setting are replicates.
* *LR tuning* keeps, per group, the setting (usually: the learning rate) with the best mean
  final dev likelihood over its seeds, and drops the others.
* Values of failed runs are never averaged in (a crashed run's last eval is not a result),
  but failed runs are counted, so every table can say how many are missing.
* Likelihoods and accuracies are shown in percent, as in the paper's figures.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from mecheval.errors import ConfigError
from mecheval.models.sites import LAST, layer_site
from mecheval.report.results import (
    ARCH,
    D_MODEL,
    LR,
    N_LAYERS,
    grouping_key,
    is_missing,
    normalise,
    run_info,
    setting_columns,
)

PERCENT_METRICS = frozenset({"likelihood", "accuracy", "in_context_mass", "in_context_accuracy"})
RESTORE_SITE = layer_site(LAST, "input")

_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(dof: int) -> float:
    """Two-sided 95 % Student-t quantile (no scipy needed at run time)."""
    if dof < 1:
        return math.nan
    if dof <= len(_T975):
        return _T975[dof - 1]
    # First Cornish-Fisher term; within 0.002 of the exact value for dof > 30.
    return 1.959964 + 2.37 / dof


# ---------------------------------------------------------------------------- final values


def final_behaviour(df: pd.DataFrame) -> pd.DataFrame:
    """Behavioural rows at each run's last evaluated step (per run, split and metric)."""
    df = normalise(df)
    rows = df[(df["source"] == "behavioural") & df["step"].notna()]
    last = rows.groupby(["run", "split", "metric"])["step"].transform("max")
    return rows[rows["step"] == last].reset_index(drop=True)


def _run_scores(df: pd.DataFrame, split: str, metric: str) -> pd.Series:
    rows = final_behaviour(df)
    rows = rows[(rows["split"] == split) & (rows["metric"] == metric)]
    rows = rows[rows["status"] == "done"]  # not a failed run's, nor one still training
    return rows.groupby("run")["value"].mean()


def best_lr(
    df: pd.DataFrame,
    by: Sequence[str] | None = None,
    split: str = "dev",
    metric: str = "likelihood",
    choose: Sequence[str] | None = (LR,),
) -> pd.DataFrame:
    """The LR-tuned runs, as the paper reports them: all rows of the chosen runs.

    Runs are grouped by ``by`` (default: every setting column except ``training.lr``). Within
    a group, each value of ``choose`` (default: the learning rate; None: every setting column
    not in ``by``, i.e. the best whole setting) is scored by the mean over its runs (seeds)
    of the final ``split`` ``metric``; the best one's runs are kept, failed ones included so
    that they can be counted. A group in which nothing has a score (all runs failed) keeps
    all its runs, so it shows as an empty cell rather than vanishing.
    """
    df = normalise(df)
    info = run_info(df)
    by = list(setting_columns(df, exclude=(LR,)) if by is None else by)
    missing = [c for c in by if c not in info.columns]
    if missing:
        raise ConfigError(f"best_lr: no column {missing[0]!r} in the results table")
    if choose is None:
        choice = [c for c in setting_columns(df) if c not in by]
    else:
        choice = [c for c in choose if c in info.columns and c not in by]
    scores = _run_scores(df, split, metric)
    # Only runs with a score vote, so a half-failed LR is judged on its surviving seeds.
    groups: dict[Hashable, dict[Hashable, list[str]]] = {}
    for _, row in info.iterrows():
        group = tuple(grouping_key(row[c]) for c in by)
        setting = tuple(grouping_key(row[c]) for c in choice)
        groups.setdefault(group, {}).setdefault(setting, []).append(row["run"])
    keep: list[str] = []
    for settings in groups.values():
        best, best_score = None, -math.inf
        for setting, runs in settings.items():
            values = scores.reindex(runs).dropna()
            if len(values) and float(values.mean()) > best_score:
                best, best_score = setting, float(values.mean())
        if best is None:
            for runs in settings.values():
                keep.extend(runs)
        else:
            keep.extend(settings[best])
    out = df[df["run"].isin(set(keep))].reset_index(drop=True)
    out.attrs["mecheval_normalised"] = True
    return out


def seed_summary(df: pd.DataFrame, by: Sequence[str], value: str = "value") -> pd.DataFrame:
    """Mean and 95 % t-interval across runs (seeds) per group of ``by``.

    Each run contributes one number (its rows in a group are averaged first). Columns: ``by``,
    ``mean``, ``ci`` (half-width; NaN for n < 2), ``lo``, ``hi``, ``sd``, ``n`` (runs with a
    value), ``runs`` (all runs in the group) and ``failed`` (failed runs in the group). Only
    finished runs are averaged: not a failed one's values, nor those of a run still training
    or cut off.
    """
    by = list(by)
    status = df["status"] if "status" in df.columns else pd.Series("done", index=df.index)
    rows = list(df[by].itertuples(index=False, name=None))
    keys = [tuple(grouping_key(v) for v in row) for row in rows]
    firsts = dict(zip(keys, rows, strict=True))  # a group's columns as its last row has them
    # Groups numbered in order of first appearance; each statistic comes from one grouping of
    # the whole frame (a filter per group took seconds for a report's few hundred groups).
    number = {key: i for i, key in enumerate(firsts)}
    frame = pd.DataFrame(
        {
            "_g": [number[key] for key in keys],
            "run": df["run"].astype(str).to_numpy(),
            "status": status.astype(str).to_numpy(),
            "_v": df[value].to_numpy(),
        }
    )
    runs = frame.drop_duplicates(["_g", "run"])
    run_counts = runs.groupby("_g")["run"].size()
    failed_counts = (runs["status"] == "failed").groupby(runs["_g"]).sum()
    ok = frame[frame["status"] == "done"]  # a running or cut-off run's values are no result
    # Each run's mean, a group's runs in the order of their names.
    per_run = ok.groupby(["_g", "run"])["_v"].mean().dropna()
    per_group = dict(iter(per_run.groupby(level="_g")))
    records = []
    for key, group in number.items():
        values = per_group.get(group)
        n = 0 if values is None else len(values)
        mean = float(values.mean()) if n else math.nan
        sd = float(values.std(ddof=1)) if n > 1 else math.nan
        ci = t975(n - 1) * sd / math.sqrt(n) if n > 1 else math.nan
        record = dict(zip(by, firsts[key], strict=True))
        record.update(
            mean=mean,
            ci=ci,
            lo=mean - ci,
            hi=mean + ci,
            sd=sd,
            n=n,
            runs=int(run_counts[group]),
            failed=int(failed_counts[group]),
        )
        records.append(record)
    columns = [*by, "mean", "ci", "lo", "hi", "sd", "n", "runs", "failed"]
    return pd.DataFrame.from_records(records, columns=columns)


# ---------------------------------------------------------------------------- measures


@dataclass(frozen=True)
class Measure:
    """One number per run: a behavioural metric, or one mechanistic condition at one site.

    ``site`` may contain ``{last}`` (the run's last layer index). ``split`` None means: the
    dev split when the table has one for this source, otherwise whatever split it has.
    """

    label: str
    source: str = "mechanistic"
    condition: str = ""
    site: str = ""
    role: str = ""
    metric: str = "likelihood"
    split: str | None = None


def original(label: str = "Original", metric: str = "likelihood") -> Measure:
    return Measure(label, condition="original", metric=metric)


def corrupted(label: str = "Corrupted", metric: str = "likelihood") -> Measure:
    return Measure(label, condition="corrupted", metric=metric)


def restored(role: str, site: str = RESTORE_SITE, label: str | None = None, **kw: Any) -> Measure:
    return Measure(
        label or f"Restored @ {role.replace('_', ' ')}",
        condition="restored",
        site=site,
        role=role,
        **kw,
    )


def behaviour(label: str, metric: str = "accuracy", split: str | None = None) -> Measure:
    return Measure(label, source="behavioural", metric=metric, split=split)


def restore_measures(
    site: str = RESTORE_SITE, roles: Sequence[str] = ("key", "value", "query")
) -> list[Measure]:
    return [original(), corrupted(), *(restored(r, site) for r in roles)]


def last_layers(df: pd.DataFrame) -> dict[str, int]:
    """Each run's last layer index, from ``model.n_layers`` or else from its sites."""
    df = normalise(df)
    info = run_info(df)
    out: dict[str, int] = {}
    seen = df[df["layer"].notna() & (df["layer"] >= 0)].groupby("run")["layer"].max()
    for _, row in info.iterrows():
        n = row.get(N_LAYERS)
        if not is_missing(n):
            out[row["run"]] = int(n) - 1
        elif row["run"] in seen.index:
            out[row["run"]] = int(seen[row["run"]])
    return out


def site_names(df: pd.DataFrame, site: str) -> list[str]:
    """The sites that ``site`` names in the runs' restored rows (``{last}`` resolved per run),
    sorted: ``layers.{last}.input`` -> ``["layers.1.input"]`` for 2-layer runs."""
    df = normalise(df)
    rows = df[df["condition"] == "restored"]
    if rows.empty:
        return []
    last = last_layers(df)
    want = rows["run"].map(lambda r: site.format(last=last.get(r, -1)))
    return sorted(set(rows.loc[rows["site"] == want, "site"]))


def has_site(df: pd.DataFrame, site: str) -> bool:
    """Whether any run has restored rows at ``site`` (``{last}`` resolved per run)."""
    return bool(site_names(df, site))


def measure_values(
    df: pd.DataFrame, measures: Sequence[Measure], all_steps: bool = False
) -> pd.DataFrame:
    """Long frame ``run, measure, value`` (plus ``step`` if ``all_steps``), in percent for
    likelihood and accuracy. Without ``all_steps`` every run gets a row for every measure
    (NaN where the run has no such value), so empty cells still count their runs."""
    df = normalise(df)
    last = last_layers(df)
    runs = list(df["run"].drop_duplicates())
    mech = df[df["source"] == "mechanistic"]
    mech_last = mech.groupby("run")["step"].transform("max")
    frames = []
    for m in measures:
        if m.source == "behavioural":
            rows = df[(df["source"] == "behavioural") & (df["metric"] == m.metric)]
            rows = _pick_split(rows, m.split)
            if not all_steps:
                # Last step per run *of this split and metric*: a run evaluated on test only
                # at the end still has its final test value.
                rows = rows[rows["step"] == rows.groupby("run")["step"].transform("max")]
        else:
            keep = (mech["metric"] == m.metric) & (mech["condition"] == m.condition)
            if not all_steps:
                # The run's last intervention step overall: a measure missing there is
                # missing, not silently taken from an earlier checkpoint.
                keep &= mech["step"] == mech_last
            # At the end, the full post-training set (interventions.csv, test by default)
            # rather than the small emergence sample taken at the same step.
            rows = _pick_split(mech[keep], m.split, prefer="dev" if all_steps else "test")
            if m.condition == "restored":
                want = rows["run"].map(lambda r, s=m.site: s.format(last=last.get(r, -1)))
                rows = rows[(rows["site"] == want) & (rows["role"] == m.role)]
        keys = ["run", "step"] if all_steps else ["run"]
        values = rows.groupby(keys)["value"].mean()
        if m.metric in PERCENT_METRICS:
            values = values * 100.0
        if not all_steps:
            values = values.reindex(pd.Index(runs, name="run"))
        frame = values.rename("value").reset_index()
        frame.insert(1, "measure", m.label)
        frames.append(frame)
    columns = ["run", "measure", *(["step"] if all_steps else []), "value"]
    if not frames:
        return pd.DataFrame(columns=columns)
    return pd.concat(frames, ignore_index=True)[columns]


def _pick_split(rows: pd.DataFrame, split: str | None, prefer: str = "dev") -> pd.DataFrame:
    if split is not None:
        return rows[rows["split"] == split]
    if (rows["split"] == prefer).any():
        return rows[rows["split"] == prefer]
    return rows


# ---------------------------------------------------------------------------- cells


def cell_summary(
    df: pd.DataFrame,
    measures: Sequence[Measure],
    rows: str,
    cols: str,
    *,
    tune: bool = True,
    tune_split: str = "dev",
    tune_metric: str = "likelihood",
) -> pd.DataFrame:
    """Seed summaries of ``measures`` on a ``rows`` x ``cols`` grid.

    With ``tune`` the runs are first LR-tuned per cell (see :func:`best_lr`). Returns a long
    frame: ``measure``, ``row``, ``col``, ``mean``, ``ci``, ``lo``, ``hi``, ``sd``, ``n``,
    ``runs``, ``failed``; every (measure, cell) that has runs appears, NaN where no value.
    """
    df = normalise(df)
    if tune:
        # choose=None: a knob the caller did not filter on is tuned like the LR, so one cell
        # never averages two different settings.
        df = best_lr(df, by=[rows, cols], split=tune_split, metric=tune_metric, choose=None)
    values = measure_values(df, measures)
    info = run_info(df)[["run", "status", rows, cols]]
    merged = values.merge(info, on="run", how="left")
    merged = merged.rename(columns={rows: "row", cols: "col"})
    return seed_summary(merged, by=["measure", "row", "col"])


def restore_table(
    df: pd.DataFrame,
    site: str = RESTORE_SITE,
    roles: Sequence[str] = ("key", "value", "query"),
    *,
    metric: str = "likelihood",
    tune: bool = True,
    text: bool = False,
) -> pd.DataFrame:
    """The Fig. 3 table: rows (architecture, d_model), columns Original / Corrupted /
    Restored @ each role at ``site`` (``{last}`` = each run's last layer), in percent, on
    LR-tuned runs. Cells are means over seeds; with ``text`` they are strings
    ``"92.3 ± 1.2"`` (interval only when there are several seeds)."""
    df = normalise(df)
    for column in (ARCH, D_MODEL):
        if column not in df.columns:
            raise ConfigError(f"restore_table: no {column} column in the results table")
    measures = [
        original(metric=metric),
        corrupted(metric=metric),
        *(restored(r, site, metric=metric) for r in roles),
    ]
    summary = cell_summary(df, measures, ARCH, D_MODEL, tune=tune, tune_metric="likelihood")
    summary["cell"] = (
        [format_cell(m, c) for m, c in zip(summary["mean"], summary["ci"], strict=True)]
        if text
        else summary["mean"]
    )
    table = summary.pivot_table(
        index=["row", "col"], columns="measure", values="cell", aggfunc="first", dropna=False
    )
    table = table.reindex(columns=[m.label for m in measures])
    table.index = table.index.set_names([ARCH, D_MODEL])
    table.columns.name = None
    return table


def format_cell(mean: float, ci: float, digits: int = 1) -> str:
    if is_missing(mean):
        return ""
    if is_missing(ci):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {ci:.{digits}f}"
