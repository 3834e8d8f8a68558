"""Where an experiment's runs came from: one row per run folder, read from its
``provenance.json`` (training/provenance.py), for ``mecheval results --provenance``.

A run trained in several sessions (interrupted, then resumed, perhaps on another machine)
shows its first start, its last end and, in ``changed``, the fields its sessions differ in.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from mecheval.experiments.gather import folder_runs
from mecheval.training.folder import read_provenance, run_status

#: A session's fields that say on what, and with what, it ran (``changed`` compares them).
SESSION_FIELDS = (
    "mecheval",
    "commit",
    "dirty",
    "python",
    "torch",
    "cuda",
    "cudnn",
    "triton",
    "host",
    "device",
    "device_name",
    "threads",
    "precision",
    "compile",
    "kernels",
)

COLUMNS = (
    "run",
    "status",
    "sessions",
    "started",
    "ended",
    *SESSION_FIELDS,
    "changed",
    "documents",
    "initial_weights",
)


def provenance_row(run_dir: Path) -> dict[str, Any]:
    """The run's provenance in one row (its last session's software and machine); the
    fields empty where the run has no ``provenance.json``."""
    record = read_provenance(run_dir) or {}
    sessions = record.get("sessions") or [{}]
    last = sessions[-1]
    changed = [
        field for field in SESSION_FIELDS if len({_text(s.get(field)) for s in sessions}) > 1
    ]
    return {
        "run": run_dir.name,
        "status": run_status(run_dir).get("state"),
        "sessions": len(record.get("sessions") or []),
        "started": sessions[0].get("started"),
        "ended": last.get("ended"),
        **{field: _text(last.get(field)) for field in SESSION_FIELDS},
        "changed": ", ".join(changed),
        "documents": record.get("documents"),
        "initial_weights": record.get("initial_weights"),
    }


def provenance_table(experiment_dirs: Sequence[str | Path]) -> pd.DataFrame:
    """One row per run folder of the experiment (or of several folders gathered into one
    grid: experiments/gather.py), in run order."""
    rows = [provenance_row(run) for run in folder_runs(experiment_dirs)]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _text(value: Any) -> Any:
    """A field as a table cell: mappings (the kernels) as ``key=value`` text."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items()))
    return value
