"""The results store: one tidy table built from an experiment's run folders.

Each run writes only its own folder, so the table is assembled here by reading them all:
the run's resolved ``config.yaml`` (flattened into dotted config columns), ``status.json``,
``metrics.csv`` (behavioural), ``interventions.csv`` and ``emergence.csv`` (mechanistic),
``attribution.csv`` (the interventions estimated from gradients, where a plan asked).

Schema (one row per value)::

    run, status, reason, folder, ran_on, software, state_size,
    <config columns: task.*, model.*, training.*>,
    source (behavioural | mechanistic | an estimator of interventions/attribution.py), step,
    split, condition ("" | original | corrupted | restored), site, layer, component, io, role,
    metric (likelihood | accuracy | loss | in_context_mass | in_context_accuracy | ...), value

``status`` is done, failed, running (a process holds the run folder now), cut off (its
status says running, but no process holds it: killed, or trained on another machine and
copied mid-run) or pending. ``folder`` is the sweep folder the run was read from (of a grid
gathered from several: experiments/gather.py), ``ran_on`` the device it trained on (the CPU
model or the card) and ``software`` mecheval (and its commit) and torch, from its
provenance.json: empty for a run without one.

``state_size`` is the floats one sequence carries through the model at inference after the
task's longest document (``model.max_len`` tokens; ``models.state_size``), empty where it is
unknown (a plugin mixer that does not say, a model that cannot be built here).

The behavioural metrics are tasks/scores.py's SCORES, the mechanistic ones
interventions.RESTORE_METRICS; both include the binding scores (in-context mass and
accuracy) where the run was measured after they existed. A run's final restores also carry
their 95 % bootstrap intervals over the documents and the fraction each recovers
(interventions/intervals.py's INTERVAL_METRICS: likelihood_low, likelihood_high, recovered,
recovered_low, recovered_high), where it was measured after they existed.
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from mecheval.errors import ConfigError, DamagedFile, first_line
from mecheval.interventions.intervals import BOOTSTRAP
from mecheval.io import atomic_write_bytes, atomic_write_text, load_yaml
from mecheval.schema import MEASUREMENT_COLUMNS
from mecheval.training.folder import (
    ATTRIBUTION_FILE,
    CONFIG_FILE,
    EMERGENCE_FILE,
    GRADES_FILE,
    INTERVENTIONS_FILE,
    MECHANISM_FILE,
    METRICS_FILE,
    read_provenance,
    run_status,
)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"d_model": 64}}`` -> ``{"model.d_model": 64}``; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(flatten(value, path))
        elif isinstance(value, list):
            flat[path] = tuple(value)
        else:
            flat[path] = value
    return flat


def read_table(path: Path, required: Sequence[str], **options: Any) -> pd.DataFrame:
    """A CSV table a run wrote, holding the ``required`` columns; DamagedFile naming it
    otherwise."""
    try:
        table = pd.read_csv(path, **options)
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        first = first_line(err)
        raise DamagedFile(f"{path}: damaged, not a CSV table ({first})") from None
    missing = [c for c in required if c not in table.columns]
    if missing:
        raise DamagedFile(f"{path}: damaged, no column {missing[0]!r}")
    return table


def read_config_data(run_dir: Path) -> dict[str, Any]:
    """A run's config.yaml as a mapping ({} where there is none); DamagedFile otherwise."""
    path = run_dir / CONFIG_FILE
    if not path.exists():
        return {}
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise DamagedFile(f"{path}: damaged, not YAML ({type(err).__name__})") from None
    if not isinstance(data, dict):
        raise DamagedFile(f"{path}: damaged, expected a mapping")
    return data


#: The columns of metrics.csv (the Trainer's): the others are filled in here.
BEHAVIOURAL_COLUMNS = ("step", "split", "metric", "value")


def behavioural_rows(run_dir: Path) -> pd.DataFrame:
    path = run_dir / METRICS_FILE
    if not path.exists():
        return pd.DataFrame(columns=MEASUREMENT_COLUMNS)
    table = read_table(path, BEHAVIOURAL_COLUMNS)
    table["source"] = "behavioural"
    for column, default in (("condition", ""), ("site", ""), ("component", ""), ("io", "")):
        table[column] = default
    table["role"] = ""
    table["layer"] = -1
    return table[MEASUREMENT_COLUMNS]


def mechanistic_rows(run_dir: Path) -> pd.DataFrame:
    # interventions.csv: the full set after training; emergence.csv: the small set
    # recorded at every evaluation during training (both in the same schema).
    tables = [
        read_table(path, MEASUREMENT_COLUMNS[1:], keep_default_na=False)
        for path in (run_dir / INTERVENTIONS_FILE, run_dir / EMERGENCE_FILE)
        if path.exists()
    ]
    if not tables:
        return pd.DataFrame(columns=MEASUREMENT_COLUMNS)
    table = pd.concat(tables, ignore_index=True)
    table["source"] = "mechanistic"
    return table[MEASUREMENT_COLUMNS]


def estimated_rows(run_dir: Path) -> pd.DataFrame:
    """``attribution.csv``: the interventions estimated from gradients, ``source`` naming
    the estimator (interventions/attribution.py's ``METHODS``)."""
    path = run_dir / ATTRIBUTION_FILE
    if not path.exists():
        return pd.DataFrame(columns=MEASUREMENT_COLUMNS)
    return read_table(path, MEASUREMENT_COLUMNS, keep_default_na=False)[MEASUREMENT_COLUMNS]


#: A grade's numbers as results rows (condition ``graded``; ``agrees`` is 1 or 0, empty where
#: either label is missing; the seconds are the estimate's and the exact engine's).
GRADE_METRICS = ("pearson", "spearman", "recall", "error", "agrees", "seconds", "exact_seconds")


def graded_rows(run_dir: Path, estimated: pd.DataFrame) -> pd.DataFrame:
    """``attribution.json``: each estimator's grade against the exact table, as rows of
    condition ``graded`` with ``source`` the estimator, at the step and split of its
    estimates (``estimated``, the run's :func:`estimated_rows`)."""
    rows = []
    for record in read_grades(run_dir):
        method = record["method"]
        mine = estimated[estimated.source == method]
        step, split = (mine.step.iloc[0], mine.split.iloc[0]) if len(mine) else (None, None)
        for metric in GRADE_METRICS:
            value = record.get(metric)
            rows.append(
                {
                    "source": method,
                    "step": step,
                    "split": split,
                    "condition": "graded",
                    "metric": metric,
                    "value": float("nan") if value is None else float(value),
                }
            )
    return pd.DataFrame(rows, columns=MEASUREMENT_COLUMNS)


def read_grades(run_dir: Path) -> list[dict[str, Any]]:
    """The records of a run's ``attribution.json`` (none where it has not been graded)."""
    path = run_dir / GRADES_FILE
    if not path.exists():
        return []
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
        return [dict(record) for record in records]
    except (UnicodeDecodeError, json.JSONDecodeError, TypeError, ValueError) as err:
        raise DamagedFile(f"{path}: damaged ({type(err).__name__})") from None


def status_reason(status: dict[str, Any]) -> str:
    """Why a run ended where it did: a failed run's reason, an early stop's note
    (``training.stop_at_accuracy``), or ""."""
    return str(status.get("reason") or status.get("stopped_early") or "")


def run_table(run_dir: Path) -> pd.DataFrame:
    config = read_config_data(run_dir)
    status = run_status(run_dir)
    estimated = estimated_rows(run_dir)
    graded = graded_rows(run_dir, estimated)
    measurements = pd.concat(
        [
            t
            for t in (behavioural_rows(run_dir), mechanistic_rows(run_dir), estimated, graded)
            if len(t)
        ]
        or [pd.DataFrame(columns=MEASUREMENT_COLUMNS)],
        ignore_index=True,
    )
    if measurements.empty:
        measurements = pd.DataFrame([{c: None for c in MEASUREMENT_COLUMNS}])
    ran_on, software = _origin(run_dir)
    head = {
        "run": run_dir.name,
        "status": status.get("state"),
        "reason": status_reason(status),
        "folder": run_dir.parent.name,
        "ran_on": ran_on,
        "software": software,
        "state_size": model_state_size(json.dumps(config.get("model", {}), sort_keys=True)),
    }
    head.update(flatten({k: v for k, v in config.items() if k in ("task", "model", "training")}))
    rows = len(measurements)
    head_columns = pd.DataFrame({c: [v] * rows for c, v in head.items()}, index=measurements.index)
    return pd.concat([head_columns, measurements], axis=1)


def _origin(run_dir: Path) -> tuple[str, str]:
    """The device its last training session ran on, and mecheval and torch then ("" where
    the run has no provenance.json)."""
    sessions = (read_provenance(run_dir) or {}).get("sessions") or [{}]
    last = sessions[-1]
    if not last:
        return "", ""
    commit = last.get("commit")
    version = f"mecheval {last.get('mecheval')}"
    if commit:
        version += f" {str(commit)[:7]}{'+dirty' if last.get('dirty') else ''}"
    cuda = f", CUDA {last['cuda']}" if last.get("cuda") else ""
    return str(last.get("device_name") or ""), f"{version}, torch {last.get('torch')}{cuda}"


@functools.lru_cache(maxsize=256)
def model_state_size(model_json: str) -> int | None:
    """``models.state_size`` of a run's model (its config as JSON, so that runs of one shape
    build it once) after ``model.max_len`` tokens; None where it cannot be known."""
    from mecheval.models import ModelConfig, build_model, state_size

    try:
        config = ModelConfig(**json.loads(model_json))
        if config.max_len is None:
            return None
        return state_size(build_model(config), config.max_len)
    except Exception:  # an unknown plugin architecture, an old config: the column stays empty
        return None


def run_dirs(experiment_dir: Path) -> list[Path]:
    return sorted(p for p in experiment_dir.iterdir() if (p / CONFIG_FILE).exists())


def experiment_runs(experiment_dir: str | Path) -> list[Path]:
    """The experiment's run folders, in name order; ConfigError where there are none."""
    experiment_dir = Path(experiment_dir)
    if not experiment_dir.is_dir():
        raise ConfigError(f"{experiment_dir}: not an experiment folder")
    runs = run_dirs(experiment_dir)
    if not runs:
        raise ConfigError(f"{experiment_dir}: no run folders (with config.yaml) inside")
    return runs


def load_results(experiment_dir: str | Path) -> pd.DataFrame:
    """The experiment's tidy results table (see the module docstring for the schema)."""
    return results_table(experiment_runs(experiment_dir))


def results_table(runs: Sequence[Path]) -> pd.DataFrame:
    """The tidy results table of these run folders."""
    return pd.concat([run_table(r) for r in runs], ignore_index=True)


def read_label(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``mechanism.json`` (None: not written); DamagedFile if unreadable."""
    label_path = run_dir / MECHANISM_FILE
    if not label_path.exists():
        return None
    try:
        label = json.loads(label_path.read_text(encoding="utf-8"))
        for key in ("site", "label", "original", "corrupted", "restored"):
            label[key]  # noqa: B018 - a missing field is damage
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise DamagedFile(f"{label_path}: damaged ({type(err).__name__})") from None
    return label


def _dev_accuracy(status: dict[str, Any]) -> float | None:
    return _split_accuracy(status, "dev")


def _split_accuracy(status: dict[str, Any], split: str) -> float | None:
    return ((status.get("metrics") or {}).get(split) or {}).get("accuracy")


def mechanism_summary(experiment_dir: str | Path) -> pd.DataFrame:
    """One row per run: its final dev accuracy and the restore numbers its mechanism label
    was read from (``mechanism.json``, likelihood in %), the in-context accuracy and the
    chance level of a guess among the in-context candidates on the same documents (in %;
    empty for a mechanism.json written before they existed), with the label. ``seed`` is
    the run's training seed (:func:`seed_agreement` reads it; the printed table leaves it out).
    Where the runs trained on more than one device, ``ran on`` names each run's."""
    rows = []
    for run_dir in run_dirs(Path(experiment_dir)):
        config = read_config_data(run_dir)
        status = run_status(run_dir)
        dev = _dev_accuracy(status)
        row: dict[str, Any] = {
            "run": run_dir.name,
            "architecture": config["model"]["architecture"],
            "status": status.get("state"),
            "dev accuracy %": None if dev is None else round(100 * dev, 1),
            "seed": config["training"].get("seed", 0),
        }
        label = read_label(run_dir)
        if label is not None:
            row["site"] = label["site"]
            row["original"] = round(100 * label["original"], 1)
            row["corrupted"] = round(100 * label["corrupted"], 1)
            for role in ("key", "value", "query"):
                value = label["restored"].get(role)
                row[f"@ {role}"] = None if value is None else round(100 * value, 1)
            null = label.get("null")  # positions that play no role (interventions/null.py)
            if null is not None:
                row["@ null"] = round(100 * null["likelihood"], 1)
            # a task that reads recurrent states too (state tracking): the best state's restore
            states = {r: v for r, v in label["restored"].items() if r.endswith(" (state)")}
            row |= {f"@ {r}": round(100 * v, 1) for r, v in states.items()}
            binding = (("in-context acc %", "in_context_accuracy"), ("chance %", "chance"))
            for column, key in binding:
                value = label.get(key)
                row[column] = None if value is None else round(100 * value, 1)
            row["mechanism"] = label["label"]
            row["fragile"] = label.get("fragile")  # None: not fragile, or not measured
            # for the seed agreement, not printed: what decided the label
            row["role"], row["recovered"] = label.get("role"), label["recovered"]
        row["ran on"] = _origin(run_dir)[0]
        rows.append(row)
    summary = pd.DataFrame(rows)
    if summary.empty or summary["ran on"].nunique() <= 1:
        return summary.drop(columns="ran on", errors="ignore")
    return summary


def seed_agreement(summary: pd.DataFrame) -> pd.DataFrame:
    """Per cell (the runs of one setting: run names without their ``-sN`` seed part), each
    seed's label and how many seeds agree on the commonest one: "induction 2/3"; a cell of
    one seed says so ("induction (one seed)"), two labels equally common read "split"; fragile
    labels (``mechanism.json``'s ``fragile``) are counted apart ("induction 3/3 (1 of them
    fragile)"); ``over seeds``: the deciding fraction over the seeds, with its interval.
    ``summary`` is :func:`mechanism_summary`'s (its ``seed`` column: each run's training
    seed); runs without a label are left out."""
    columns = ["architecture", "cell", "labels", "agreement", "over seeds"]
    if "mechanism" not in summary.columns:
        return pd.DataFrame(columns=columns)
    labelled = summary[summary["mechanism"].notna()]
    rows = []
    cells = labelled["run"].str.replace(r"-s\d+$", "", regex=True)
    fragile = (
        labelled["fragile"] if "fragile" in labelled.columns else pd.Series(None, labelled.index)
    )
    for cell, runs in labelled.groupby(cells, sort=False):
        seeds = runs["seed"].tolist()
        labels = runs["mechanism"].tolist()
        weak = [isinstance(f, str) for f in fragile[runs.index]]
        counts = pd.Series(labels).value_counts()
        top, n = counts.index[0], int(counts.iloc[0])
        if len(labels) == 1:
            agreement = f"{top} (one seed{', fragile' if weak[0] else ''})"
        elif (counts == n).sum() > 1:
            agreement = f"split ({', '.join(f'{label} {c}' for label, c in counts.items())})"
        else:
            agreement = f"{top} {n}/{len(labels)}"
            # Fragile agreeing labels are counted apart: they might have read otherwise.
            k = sum(w for label, w in zip(labels, weak, strict=True) if label == top)
            agreement += f" ({k} of them fragile)" if k else ""
        by_seed = " · ".join(
            f"s{seed}: {label}{' (fragile)' if w else ''}"
            for seed, label, w in zip(seeds, labels, weak, strict=True)
        )
        # A tie has no commonest label, so no fraction that decides it.
        over_seeds = "" if agreement.startswith("split") else _fraction_over_seeds(runs, top)
        rows.append((runs["architecture"].iloc[0], cell, by_seed, agreement, over_seeds))
    return pd.DataFrame(rows, columns=columns)


def _fraction_over_seeds(runs: pd.DataFrame, top: str) -> str:
    """The fraction that decides the cell's commonest label, its mean over the seeds and its
    95 % bootstrap interval with the seeds resampled ("query 66 % [52, 80]"); "" where no
    role decides that label or fewer than two seeds measured it."""
    if "role" not in runs.columns:
        return ""
    roles = runs.loc[runs["mechanism"] == top, "role"].dropna()
    if roles.empty:
        return ""
    role = roles.iloc[0]
    values = np.array([r[role] for r in runs["recovered"] if isinstance(r, dict) and role in r])
    if len(values) < 2:
        return ""
    low, high = BOOTSTRAP.mean_bounds(values)
    return f"{role} {100 * values.mean():.0f} % [{100 * low:.0f}, {100 * high:.0f}]"


def label_records(experiment_dir: str | Path) -> pd.DataFrame:
    """One row per run for the mechanism matrices: run, task (kind), short conv (the switch's
    setting, None: the architecture's default), architecture, layers (the model's count),
    pairs (the task's key-value pairs, None where it has none), status, reason, dev and test
    accuracy (fractions), negative eigenvalues (the mixer's ``allow_neg_eigval``, None where
    it has none), and from ``mechanism.json`` the label, the accuracy on the documents it was
    read on (the plan's split), the role that recovers most with its fraction, and a hybrid's
    carrier (its layer, architecture and what it reads; empty where no label or carrier was
    written)."""
    rows = []
    for run_dir in run_dirs(Path(experiment_dir)):
        config = read_config_data(run_dir)
        status = run_status(run_dir)
        row: dict[str, Any] = {
            "run": run_dir.name,
            "task": config["task"]["kind"],
            "short conv": config["model"].get("short_conv"),
            "architecture": config["model"]["architecture"],
            "layers": config["model"].get("n_layers"),
            "pairs": config["task"].get("n_pairs"),
            "status": status.get("state"),
            "reason": status_reason(status),
            "dev accuracy": _dev_accuracy(status),
            "test accuracy": _split_accuracy(status, "test"),
            "negative eigenvalues": (config["model"].get("mixer") or {}).get("allow_neg_eigval"),
            "label": None,
            "accuracy": None,
            "best role": None,
            "recovered": None,
            "carrier layer": None,
            "carrier architecture": None,
            "reads": None,
        }
        label = read_label(run_dir)
        if label is not None:
            recovered = label.get("recovered") or {}
            best = max(recovered, key=recovered.__getitem__) if recovered else None
            carrier = label.get("carrier") or {}
            row |= {
                "label": label["label"],
                "accuracy": label.get("accuracy"),
                "best role": best,
                "recovered": None if best is None else recovered[best],
                "carrier layer": carrier.get("layer"),
                "carrier architecture": carrier.get("architecture"),
                "reads": carrier.get("reads"),
            }
        rows.append(row)
    return pd.DataFrame(rows)


def grading_records(experiment_dir: str | Path) -> pd.DataFrame:
    """One row per run and estimator of its ``attribution.json`` (interventions/grading.py's
    grade, both labels, the seconds of the estimate and of the exact engine), with the run's
    architecture, seed and dev accuracy; empty where no run was graded."""
    rows = []
    for run_dir in run_dirs(Path(experiment_dir)):
        records = read_grades(run_dir)
        if not records:
            continue
        config = read_config_data(run_dir)
        dev = _dev_accuracy(run_status(run_dir))
        for record in records:
            rows.append(
                {
                    "run": run_dir.name,
                    "architecture": config["model"]["architecture"],
                    "seed": config["training"].get("seed", 0),
                    "dev accuracy": dev,
                    **record,
                }
            )
    return pd.DataFrame(rows)


PARQUET_EXTRA = "--format parquet: needs pyarrow (pip install 'mecheval[parquet]')"


def require_pyarrow() -> None:
    """Raise a one-line ConfigError naming the ``parquet`` extra when pyarrow is missing."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ConfigError(PARQUET_EXTRA) from None


def _missing(value: Any) -> bool:
    """None, NaN or pd.NA (a container is a value, even an empty one)."""
    return not isinstance(value, dict | list | tuple | set) and bool(pd.isna(value))


def parquet_ready(table: pd.DataFrame) -> pd.DataFrame:
    """The table with every object column that Parquet cannot type written as CSV writes it.

    Config values that are containers (an empty ``model.mixer: {}`` options block, tuples
    such as ``training.betas``) and columns whose runs hold values of different kinds
    (``d_conv: 4`` in one run, ``"auto"`` in another) have no Parquet type: pyarrow refuses
    an empty struct and a column mixing ints and strings. Such a column keeps its missing
    values and holds ``str(value)`` otherwise, so a Parquet export reads back as the CSV
    export of the same table does.
    """
    import pyarrow as pa

    out = table.copy()
    for column in out.columns:
        series = out[column]
        if series.dtype != object:
            continue
        present = [v for v in series if not _missing(v)]
        containers = any(isinstance(v, dict | list | tuple | set) for v in present)
        if not containers:
            try:
                pa.array(series, from_pandas=True)
                continue
            except (pa.ArrowException, TypeError, ValueError):
                pass
        out[column] = series.map(lambda v: None if _missing(v) else str(v)).astype(object)
    return out


def write_results(table: pd.DataFrame, path: str | Path, fmt: str) -> Path:
    """Write the table atomically as csv, parquet (needs the ``parquet`` extra) or markdown."""
    if fmt == "csv":
        return atomic_write_text(path, table.to_csv(index=False))
    if fmt == "markdown":
        return atomic_write_text(path, table.to_markdown(index=False) + "\n")
    if fmt == "parquet":
        require_pyarrow()
        buffer = io.BytesIO()
        parquet_ready(table).to_parquet(buffer, index=False)
        return atomic_write_bytes(path, buffer.getvalue())
    raise ConfigError(f"--format: expected csv, parquet or markdown, got {fmt!r}")
