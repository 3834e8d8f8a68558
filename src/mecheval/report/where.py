"""Where a table's runs came from, where that differs: the sweep folders gathered into it, the
devices and the software their runs trained with (the results store's ``folder``, ``ran_on``
and ``software`` columns, read from each run's provenance.json)."""

from __future__ import annotations

import pandas as pd

from mecheval.report.render import md_table
from mecheval.report.results import run_info

ORIGIN_COLUMNS = ("folder", "ran_on", "software")
#: Run names listed per origin before the rest is counted.
NAMES_SHOWN = 6


def where_runs_ran(df: pd.DataFrame) -> str:
    """A markdown section, one row per (folder, device, software) with its runs, where the
    table's runs came from more than one of them; "" where they all share one (or the table
    does not say)."""
    columns = [c for c in ORIGIN_COLUMNS if c in df.columns]
    if not columns:
        return ""
    info = run_info(df)[["run", "status", *columns]].fillna("")
    groups = list(info.groupby(columns, sort=True))
    if len(groups) <= 1:
        return ""
    body = []
    for key, runs in groups:
        names = sorted(runs["run"])
        shown = ", ".join(f"`{n}`" for n in names[:NAMES_SHOWN])
        more = f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
        body.append([*(v or "—" for v in key), str(len(names)), shown + more])
    header = [c.replace("_", " ") for c in columns]
    lines = [
        "## Where the runs ran",
        "",
        "The runs of this report come from more than one folder, machine or software version:",
        "",
        *md_table([*header, "runs", "which"], body),
    ]
    return "\n".join(lines) + "\n"
