"""A run folder: its files, the life cycle its status records, and loading it back.

``runs/<name>/``::

    config.yaml           the fully resolved RunConfig
    model.safetensors     final weights (written when the run is done)
    metrics.csv           tidy behavioural metrics: step, split, metric, value (the Trainer's)
    status.json           {"state": "running" | "done" | "failed", "reason", "step", ...}
    checkpoint/           training state while the run is unfinished (see checkpoint.py)

Life cycle (:class:`RunFolder`): prepared (config.yaml; a folder holding another config's run
is refused) -> running -> done (weights saved, checkpoint removed), or failed with a reason:
``diverged: ...`` (final: training again would only diverge again) or ``crashed: ...``
(resumable from the last checkpoint). Single runs (run.py) and stacked groups (group.py)
both go through it, so their folders cannot drift apart.

Every file is written atomically (mecheval.io).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from mecheval.errors import ConfigError
from mecheval.io import atomic_save_safetensors, atomic_write_json, atomic_write_text, read_json
from mecheval.models import LanguageModel, build_model
from mecheval.training.checkpoint import remove_checkpoint
from mecheval.training.config import (
    RunConfig,
    config_to_data,
    dump_yaml,
    load_config,
    total_steps,
)

CONFIG_FILE = "config.yaml"
MODEL_FILE = "model.safetensors"
METRICS_FILE = "metrics.csv"
STATUS_FILE = "status.json"
CHECKPOINT_DIR = "checkpoint"

#: Fields that may differ between the config a run was started with and the one it is resumed
#: or skipped with: they change how fast, not what, it computes (``precision`` is not one).
_RUNTIME_FIELDS = ("threads", "device", "compile", "kernels")


def read_status(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / STATUS_FILE
    return read_json(path) if path.is_file() else None


def is_finished(status: Mapping[str, Any] | None) -> bool:
    """Done, or failed by divergence (which would only diverge again): nothing to redo."""
    if status is None:
        return False
    return status.get("state") == "done" or (
        status.get("state") == "failed" and str(status.get("reason", "")).startswith("diverged")
    )


def _comparable(cfg: RunConfig) -> dict[str, Any]:
    data = config_to_data(cfg)
    for key in _RUNTIME_FIELDS:
        data["training"].pop(key, None)
    return data


def check_same_config(run_dir: Path, cfg: RunConfig) -> None:
    """Raise ConfigError if ``run_dir`` already holds a run of another config (runtime fields
    such as threads and device may differ): resuming it would mix two runs."""
    config_path = Path(run_dir) / CONFIG_FILE
    if config_path.is_file() and _comparable(load_config(config_path)) != _comparable(cfg):
        raise ConfigError(
            f"{run_dir}: holds a run with a different config; choose another name or "
            "remove the folder"
        )


def write_status(run_dir: Path, **fields: Any) -> dict[str, Any]:
    status = {
        "state": fields.pop("state"),
        "reason": fields.pop("reason", None),
        **fields,
        "updated": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    atomic_write_json(Path(run_dir) / STATUS_FILE, status)
    return status


class RunFolder:
    """The folder of one run of ``cfg`` (resolved) and the statuses it goes through.

    Each state method writes ``status.json`` and returns what it wrote. ``notes`` are extra
    status fields (e.g. why a checkpoint was discarded) a caller keeps across its statuses.
    """

    def __init__(self, path: str | Path, cfg: RunConfig) -> None:
        self.path = Path(path)
        self.cfg = cfg
        self.total = total_steps(cfg)

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / CHECKPOINT_DIR

    def status(self) -> dict[str, Any] | None:
        return read_status(self.path)

    def check(self) -> dict[str, Any] | None:
        """The status of a finished run of this config (nothing to do), or None: the run is
        to train or resume. Raises ConfigError where the folder holds another config's run."""
        check_same_config(self.path, self.cfg)
        status = self.status()
        return status if is_finished(status) else None

    def prepare(self) -> dict[str, Any] | None:
        """:meth:`check`; where there is a run to train, create the folder and write
        ``config.yaml`` (the config it is about to train)."""
        status = self.check()
        if status is None:
            self.path.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path / CONFIG_FILE, dump_yaml(self.cfg))
        return status

    def running(self, **notes: Any) -> dict[str, Any]:
        return write_status(self.path, state="running", step=0, total_steps=self.total, **notes)

    def done(
        self,
        weights: Mapping[str, torch.Tensor],
        *,
        step: int,
        wall_time: float,
        metrics: Mapping[str, Any],
        **notes: Any,
    ) -> dict[str, Any]:
        """Save the final ``weights`` and mark the run done; its checkpoint is then only
        kept with ``training.keep_checkpoint``."""
        atomic_save_safetensors(self.path / MODEL_FILE, weights)
        status = write_status(
            self.path,
            state="done",
            step=step,
            total_steps=self.total,
            wall_time=wall_time,
            metrics=metrics,
            **notes,
        )
        if not self.cfg.training.keep_checkpoint:
            remove_checkpoint(self.checkpoint_dir)
        return status

    def failed(self, reason: str, *, step: int, wall_time: float, **notes: Any) -> dict[str, Any]:
        """Mark the run failed: for good when ``reason`` starts with "diverged" (its metrics in
        ``notes``), resumable from its last checkpoint when it starts with "crashed"."""
        return write_status(
            self.path,
            state="failed",
            reason=reason,
            step=step,
            total_steps=self.total,
            wall_time=wall_time,
            **notes,
        )


def load_run(
    run_dir: str | Path, device: str | torch.device = "cpu"
) -> tuple[RunConfig, LanguageModel]:
    """Rebuild a finished run's model from ``config.yaml`` and ``model.safetensors`` (eval mode)."""
    run_dir = Path(run_dir)
    config_path, model_path = run_dir / CONFIG_FILE, run_dir / MODEL_FILE
    if not config_path.is_file():
        raise ConfigError(f"{run_dir}: not a run folder (no {CONFIG_FILE})")
    if not model_path.is_file():
        raise ConfigError(f"{run_dir}: the run has no {MODEL_FILE} yet (not finished?)")
    cfg = load_config(config_path)
    model = build_model(cfg.model)
    model.load_state_dict(load_file(model_path, device=str(device)))
    return cfg, model.to(device).eval()
