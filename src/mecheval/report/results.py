"""The results table as the report reads it: a saved one loaded, its blanks made uniform
(:func:`normalise`), its column names, the config columns that make a setting, and one row per
run. The table is the long one built by :func:`mecheval.experiments.store.load_results`."""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mecheval.errors import ConfigError, first_line
from mecheval.schema import MEASUREMENT_COLUMNS

CONFIG_PREFIXES = ("task.", "model.", "training.")
ARCH = "model.architecture"
D_MODEL = "model.d_model"
N_LAYERS = "model.n_layers"
LR = "training.lr"
#: Replicate seeds: runs differing only here are averaged over.
SEED_COLUMNS = ("training.seed", "task.seed")
#: Config fields that say how a run was executed, not what was trained; a sweep run on two
#: machines must still average its seeds.
OPERATIONAL_COLUMNS = frozenset(
    {
        "training.threads",
        "training.device",
        "training.keep_checkpoint",
        "training.checkpoint_every",
        "training.eval_batch_size",
        "training.eval_splits",
        "training.eval_at_end",
        "training.eval_every",
    }
)
STRING_COLUMNS = (
    "status",
    "reason",
    "source",
    "split",
    "condition",
    "site",
    "component",
    "io",
    "role",
    "metric",
)


def load_table(path: str | Path) -> pd.DataFrame:
    """Read a saved results table (csv or parquet) and normalise it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--table: {path} is not a file")
    if path.suffix not in (".parquet", ".csv", ".gz"):
        raise ConfigError(f"--table: expected a .csv or .parquet file, got {path.name}")
    unreadable: tuple[type[BaseException], ...] = (OSError, ValueError)
    if path.suffix == ".parquet":
        try:
            import pyarrow
        except ImportError:
            raise ConfigError(
                "--table: reading a .parquet table needs pyarrow (pip install 'mecheval[parquet]')"
            ) from None
        unreadable += (pyarrow.ArrowException,)
    try:
        if path.suffix == ".parquet":
            table = pd.read_parquet(path)
        else:
            table = pd.read_csv(path, low_memory=False)
    except unreadable as err:
        # A truncated or foreign file: say which, in one line, rather than a reader's traceback.
        why = first_line(err)
        raise ConfigError(f"--table: {path} is not a readable results table ({why})") from None
    if "run" not in table.columns:
        raise ConfigError(f"--table: {path} has no 'run' column; is it a results table?")
    return normalise(table)


def is_missing(value: Any) -> bool:
    """None, pandas' NA or a float NaN: a value a table shows as missing."""
    if value is None or value is pd.NA:
        return True
    return isinstance(value, float | np.floating) and math.isnan(value)


def grouping_key(value: Any) -> Hashable:
    """A grouping key where every flavour of missing is the same ``None``."""
    if is_missing(value):
        return None
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        # An empty options block ({}) is flattened to a value, not to columns.
        return tuple(sorted((str(k), grouping_key(v)) for k, v in value.items()))
    if isinstance(value, list | tuple | set):
        return tuple(grouping_key(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def normalise(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with the schema's blanks made uniform: "" in string columns, NaN for a missing
    config value, numeric step/layer/value. CSV round trips and hand-made tables both differ
    from the store's output in exactly these ways."""
    if df.attrs.get("mecheval_normalised"):
        return df
    out = df.copy()
    if "run" not in out.columns:
        raise ConfigError("results table: no 'run' column")
    for column in STRING_COLUMNS:
        if column not in out.columns:
            out[column] = "done" if column == "status" else ""
        out[column] = out[column].astype(object).where(out[column].notna(), "").astype(str)
    out.loc[out["status"] == "", "status"] = "done"
    for column in ("step", "layer", "value"):
        if column not in out.columns:
            out[column] = np.nan
        out[column] = pd.to_numeric(out[column], errors="coerce")
    out["run"] = out["run"].astype(str)
    for column in config_columns(out):
        series = out[column]
        if series.dtype == object or str(series.dtype) in ("str", "string"):
            out[column] = series.astype(object).where(series.notna(), None)
    out.attrs["mecheval_normalised"] = True
    return out


def config_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if str(c).startswith(CONFIG_PREFIXES)]


def setting_columns(df: pd.DataFrame, exclude: Iterable[str] = ()) -> list[str]:
    """Config columns that define a setting (no seeds, no operational fields)."""
    skip = set(exclude) | set(SEED_COLUMNS) | OPERATIONAL_COLUMNS
    return [
        c
        for c in config_columns(df)
        if c not in skip and not c.endswith(".seed") and not c.startswith("training.eval_")
    ]


def run_info(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run: run, status, reason and its config (plus any derived columns)."""
    keep = [c for c in df.columns if c not in MEASUREMENT_COLUMNS]
    return df.drop_duplicates("run")[keep].reset_index(drop=True)
