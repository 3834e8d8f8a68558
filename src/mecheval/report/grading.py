"""The grading of attribution patching against exact interchange, per run and estimator
(interventions/grading.py; the records: ``experiments.store.grading_records``): a table and
a figure of each estimator's correlation with the exact table, its top-k recall and whether
the mechanism label it gives is the exact one."""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure

from mecheval.interventions.labels import LABELS
from mecheval.models.registry import architecture_label, architecture_rank
from mecheval.report.render import FigureResult, md_table

NAME = "attribution-grading"
CAPTION = (
    "Whether a gradient estimate can stand in for exact interchange: per run, its Pearson r "
    "with the exact restores and its top-k recall of the cells that matter (1 is as exact), "
    "and beside them whether the label it gives is the exact one."
)


def _number(value: object, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def _agrees(value: object) -> str:
    return {True: "yes", False: "no"}.get(value, "-")  # type: ignore[arg-type]


def _gradable(record: dict) -> bool:
    """A record's ``gradable``; a record without it (or with it empty) counts as gradable."""
    value = record.get("gradable", True)
    missing = value is None or (isinstance(value, float) and math.isnan(value))
    return True if missing else bool(value)


def ordered(records: pd.DataFrame) -> pd.DataFrame:
    """The records by architecture (the registry's order), then run and estimator."""
    return records.sort_values(
        ["architecture", "run"],
        key=lambda c: c.map(architecture_rank) if c.name == "architecture" else c,
        kind="stable",
    ).reset_index(drop=True)


def grading_markdown(records: pd.DataFrame) -> str:
    header = [
        "run",
        "method",
        "exact label",
        "estimated label",
        "agree",
        "Pearson r",
        "Spearman rho",
        "top-k recall (k)",
        "mean error (points)",
        "seconds",
        "exact seconds",
    ]
    rows = []
    for record in records.itertuples(index=False):
        k = int(record.k)
        graded = [
            _agrees(record.agrees),
            _number(record.pearson),
            _number(record.spearman),
            f"{_number(record.recall)} ({k})",
            _number(100 * record.error, 1),
        ]
        if not _gradable(record._asdict()):
            graded = ["nothing to grade", "-", "-", "-", "-"]
        rows.append(
            [
                record.run,
                record.method,
                record.exact_label or "-",
                record.label or "-",
                *graded,
                _number(record.seconds),
                _number(record.exact_seconds),
            ]
        )
    title = f"## {NAME}: attribution patching graded against exact interchange"
    note = (
        "Over the restored likelihood of every site x role cell; top-k recall: of the k cells "
        "that recover at least half the corruption's range exactly, those among the "
        "estimate's k highest; nothing to grade: the corruption's effect on the answer's "
        "likelihood is inside its 95 % interval over the documents."
    )
    lines = [title, "", note, "", *md_table(header, rows), "", *summary_lines(records)]
    return "\n".join(lines)


#: The labels a restore decides (the others, "not learned", "inconclusive", "candidates
#: only", are read from the original and corrupted rows, which an estimate keeps exact).
RESTORE_LABELS = (*LABELS.values(), "unclear")


def summary_lines(records: pd.DataFrame) -> list[str]:
    """Per run, each estimator's label (and whether it is the exact one) and correlation;
    then, per estimator, on how many runs whose exact label a restore decides it agrees."""
    methods = list(dict.fromkeys(records["method"]))
    rows = []
    for run, group in records.groupby("run", sort=False):
        by_method = group.set_index("method")
        cells = [str(run), str(group["exact_label"].iloc[0] or "-")]
        for method in methods:
            if method not in by_method.index:
                cells.append("-")
                continue
            record = by_method.loc[method]
            if not _gradable(record.to_dict()):
                cells.append(f"{record['label'] or '-'}, nothing to grade")
                continue
            mark = {"yes": "(same)", "no": "(differs)", "-": ""}[_agrees(record["agrees"])]
            cells.append(f"{record['label'] or '-'} {mark}, r {_number(record['pearson'])}")
        rows.append(cells)
    marks = [_gradable(record) for record in records.to_dict("records")]
    gradable = pd.Series(marks, index=records.index, dtype=bool)
    restored = records["exact_label"].isin(RESTORE_LABELS)
    decided = records[restored & gradable]
    counts = []
    for method in methods:
        mine = decided[decided["method"] == method]
        same = int(sum(_agrees(a) == "yes" for a in mine["agrees"]))
        left = int((restored & ~gradable & (records["method"] == method)).sum())
        counts.append(
            f"{method} {same} of {len(mine)}" + (f" ({left} with nothing to grade)" if left else "")
        )
    return [
        "Per run, each estimate's label and its Pearson r with the exact table:",
        "",
        *md_table(["run", "exact label", *methods], rows),
        "",
        "Same label as exact where a restore decides it (exact label "
        f"{', '.join(RESTORE_LABELS)}): {'; '.join(counts)}.",
    ]


def grading_figure(records: pd.DataFrame) -> Figure:
    """Per run (rows) and estimator (bars): Pearson r with the exact table and top-k
    recall; beside each correlation, whether the estimate's label is the exact one."""
    methods = list(dict.fromkeys(records["method"]))
    runs = list(dict.fromkeys(records["run"]))
    fig = Figure(figsize=(9, 0.3 * len(runs) * len(methods) + 1.5))
    panels = fig.subplots(1, 2, sharey=True)
    height = 0.8 / len(methods)
    mark = {"yes": "label ok", "no": "label differs", "-": ""}
    for panel, column, title in (
        (panels[0], "pearson", "Pearson r with exact"),
        (panels[1], "recall", "top-k recall"),
    ):
        for m, method in enumerate(methods):
            rows = records[records["method"] == method].set_index("run").reindex(runs)
            ys = [i + m * height for i in range(len(runs))]
            panel.barh(ys, rows[column].astype(float).fillna(0.0), height=height, label=method)
            if column == "pearson":
                for y, agrees in zip(ys, rows["agrees"], strict=True):
                    panel.text(1.02, y, mark[_agrees(agrees)], va="center", fontsize=7)
        low = records[column].astype(float).min()
        panel.set_xlim(min(0.0, 0.0 if math.isnan(low) else float(low)), 1.0)
        panel.set_title(title, fontsize=9)
    architectures = records.drop_duplicates("run").set_index("run")["architecture"]
    panels[0].set_yticks([i + 0.4 - height / 2 for i in range(len(runs))])
    panels[0].set_yticklabels(
        [f"{architecture_label(architectures[run])}\n{run}" for run in runs], fontsize=7
    )
    panels[0].invert_yaxis()
    panels[1].legend(fontsize=7, loc="lower right")
    fig.suptitle("Attribution patching against exact interchange", fontsize=10)
    fig.tight_layout()
    return fig


def render_grading(records: pd.DataFrame) -> FigureResult:
    records = ordered(records)
    return FigureResult(NAME, grading_markdown(records), grading_figure(records), records, CAPTION)
