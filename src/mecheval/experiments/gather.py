"""One grid from several sweep folders: the pieces of an experiment run on different
machines, days or cards (each its own ``--out``), read as one.

A run is known by its folder's name, which the plan derives from its config: the same name
in two folders is the same run, unless their configs differ, which is an error naming both
and the first field they differ in (runtime fields aside: threads, device, compile and
kernels change how fast a run computes, not what). Of a run in several folders, the one that
finished is read (a piece cut off on one machine and run again on another); a run finished
in two folders is an error (two results for one cell: keep one). Only a run's small files
are read (config, status, metrics, interventions, mechanism, provenance): weights need not
travel.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from mecheval.errors import ConfigError
from mecheval.experiments.store import (
    experiment_runs,
    flatten,
    read_config_data,
    results_table,
)
from mecheval.training.folder import RUNTIME_FIELDS, is_finished, run_status


def folder_runs(folders: Sequence[str | Path]) -> list[Path]:
    """The run folders of one sweep folder, or of several gathered (:func:`gather_runs`)."""
    if len(folders) == 1:
        return experiment_runs(folders[0])
    return gather_runs(folders)


def load_folders(folders: Sequence[str | Path]) -> pd.DataFrame:
    """The results table (experiments/store.py) of one sweep folder or of several as one."""
    return results_table(folder_runs(folders))


def gather_runs(folders: Sequence[str | Path]) -> list[Path]:
    """The run folders of every sweep folder in ``folders``, one per run name, in name order
    (ConfigError on a clash, before anything is read further)."""
    by_name: dict[str, list[Path]] = {}
    seen: set[Path] = set()
    for folder in folders:
        if Path(folder).resolve() in seen:
            raise ConfigError(f"{folder}: given twice")
        seen.add(Path(folder).resolve())
        for run in experiment_runs(folder):
            by_name.setdefault(run.name, []).append(run)
    return [_one_of(name, runs) for name, runs in sorted(by_name.items())]


def _one_of(name: str, runs: list[Path]) -> Path:
    first = runs[0]
    for other in runs[1:]:
        difference = _config_difference(first, other)
        if difference:
            raise ConfigError(
                f"{first} and {other}: run {name!r} has two configs ({difference}); "
                "a merged grid takes one config per run name"
            )
    finished = [run for run in runs if is_finished(run_status(run))]
    if len(finished) > 1:
        raise ConfigError(
            f"{finished[0]} and {finished[1]}: run {name!r} finished in both; "
            "keep the one the grid should show"
        )
    return finished[0] if finished else first


def _config_difference(a: Path, b: Path) -> str:
    """The first field two runs' configs differ in, as ``field: A vs B`` ("" where equal)."""
    left, right = _comparable(a), _comparable(b)
    for key in sorted(left.keys() | right.keys()):
        if left.get(key) != right.get(key):
            return f"{key}: {left.get(key)!r} vs {right.get(key)!r}"
    return ""


def _comparable(run: Path) -> dict[str, Any]:
    data = read_config_data(run)
    runtime = {f"training.{field}" for field in RUNTIME_FIELDS}
    return {k: v for k, v in flatten(data).items() if k not in runtime}
