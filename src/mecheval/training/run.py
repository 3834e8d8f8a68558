"""A run folder: train into it, resume it, skip it when done, and load it back.

``runs/<name>/``::

    config.yaml           the fully resolved RunConfig
    model.safetensors     final weights (written when the run is done)
    metrics.csv           tidy behavioural metrics: step, split, metric, value
    status.json           {"state": "running" | "done" | "failed", "reason", "step", ...}
    checkpoint/           training state while the run is unfinished (see checkpoint.py)

Every file is written atomically (mecheval.io).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from mecheval.errors import ConfigError
from mecheval.io import atomic_save_safetensors, atomic_write_json, atomic_write_text, read_json
from mecheval.models import LanguageModel, build_model
from mecheval.training.checkpoint import (
    CorruptCheckpoint,
    has_checkpoint,
    read_checkpoint,
    remove_checkpoint,
)
from mecheval.training.config import (
    RunConfig,
    config_to_data,
    dump_yaml,
    load_config,
    resolve,
    total_steps,
)
from mecheval.training.reporter import Reporter
from mecheval.training.threads import torch_threads
from mecheval.training.trainer import CHECKPOINT_DIR, Callback, Diverged, Trainer

CONFIG_FILE = "config.yaml"
MODEL_FILE = "model.safetensors"
STATUS_FILE = "status.json"

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


class Terminated(KeyboardInterrupt):
    """Raised by a termination signal (SIGTERM) where Ctrl-C raises KeyboardInterrupt, so that
    a run so stopped records a resumable status too (see :func:`stop_on_sigterm`)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    def __reduce__(self) -> tuple[type, tuple[int]]:  # sent back from sweep workers
        return Terminated, (self.signum,)


def raise_interrupt(signum: int, frame: object = None) -> None:
    """A signal handler: KeyboardInterrupt for SIGINT, :class:`Terminated` for others."""
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """While active, SIGTERM raises :class:`Terminated` (in the main thread; elsewhere this
    does nothing) instead of ending the process on the spot with status.json left at
    "running"."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def crash_reason(err: BaseException) -> str:
    """The status reason of a run stopped by ``err`` (not a divergence: resumable)."""
    if isinstance(err, Terminated):
        what = f"interrupted ({err})"
    elif isinstance(err, KeyboardInterrupt):
        what = "interrupted"
    else:
        what = f"{type(err).__name__}: {err}"
    return f"crashed: {what}"


def write_status(run_dir: Path, **fields: Any) -> dict[str, Any]:
    status = {
        "state": fields.pop("state"),
        "reason": fields.pop("reason", None),
        **fields,
        "updated": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    atomic_write_json(run_dir / STATUS_FILE, status)
    return status


def train(
    cfg: RunConfig,
    run_dir: str | Path,
    callbacks: Sequence[Callback] = (),
    *,
    datasets: Mapping[str, Any] | None = None,
    cache_dir: Path | None = None,
    reporter: Reporter | None = None,
) -> dict[str, Any]:
    """Train ``cfg`` into ``run_dir`` and return its status.

    A finished run is skipped (its status is returned); an unfinished one resumes from its
    last checkpoint and ends exactly as an uninterrupted run would. A diverged run (non-finite
    loss) is marked failed and its status returned, not raised. ``datasets`` may be passed to
    share one build between runs of the same task; by default they are built from ``cfg.task``.
    ``reporter`` is told the progress and any warning (default: no progress display).
    """
    cfg = resolve(cfg)
    run_dir = Path(run_dir)
    config_path = run_dir / CONFIG_FILE
    check_same_config(run_dir, cfg)
    status = read_status(run_dir)
    if is_finished(status):
        assert status is not None
        return status
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(config_path, dump_yaml(cfg))

    with torch_threads(cfg.training.threads):
        total = total_steps(cfg)
        start = time.perf_counter()
        trainer: Trainer | None = None
        notes: dict[str, str] = {}  # kept in every status this call writes
        try:
            if datasets is None:
                from mecheval.tasks import build_datasets

                datasets = build_datasets(cfg.task, cache_dir=cache_dir)
            trainer = Trainer(cfg, datasets, run_dir, callbacks, reporter)
            discarded = discard_corrupt_checkpoint(trainer)
            if discarded:
                notes["discarded_checkpoint"] = discarded
            write_status(run_dir, state="running", step=0, total_steps=total, **notes)
            results = trainer.run()
            atomic_save_safetensors(run_dir / MODEL_FILE, trainer.model.state_dict())
            status = write_status(
                run_dir,
                state="done",
                step=trainer.step,
                total_steps=total,
                wall_time=trainer.wall_time(start),
                metrics=results,
                **notes,
            )
            if not cfg.training.keep_checkpoint:
                remove_checkpoint(run_dir / CHECKPOINT_DIR)
            return status
        except Diverged as err:
            assert trainer is not None
            return write_status(
                run_dir,
                state="failed",
                reason=err.reason,
                step=err.step,
                total_steps=total,
                wall_time=trainer.wall_time(start),
                metrics=trainer.last_results,
                **notes,
            )
        except BaseException as err:
            # Not a property of the config: a later call resumes from the last checkpoint.
            write_status(
                run_dir,
                state="failed",
                reason=crash_reason(err),
                step=trainer.step if trainer is not None else 0,
                total_steps=total,
                wall_time=trainer.wall_time(start)
                if trainer is not None
                else time.perf_counter() - start,
            )
            raise


def discard_corrupt_checkpoint(trainer: Trainer) -> str | None:
    """If the run's checkpoint cannot be restored (a truncated, garbage or foreign file),
    remove it, warn through the trainer's reporter in one line naming the file, and return
    why; the run then trains again from step 0, which ends exactly as the interrupted run
    would have (training is deterministic). A finished run never gets here, and a readable
    checkpoint is kept."""
    folder = trainer.checkpoint_dir
    if not has_checkpoint(folder):
        return None
    try:
        meta, _ = read_checkpoint(folder, trainer.model, trainer.optimizer)
        scalars = meta["trainer"]
        missing = sorted(trainer.scalars(0.0).keys() - scalars.keys())
        if missing:
            raise CorruptCheckpoint(f"{folder / 'state.json'}: no trainer field {missing[0]!r}")
        if list(divmod(meta["step"], trainer.per_epoch)) != [scalars["epoch"], scalars["position"]]:
            raise CorruptCheckpoint(f"{folder / 'state.json'}: data position does not match step")
    except CorruptCheckpoint as err:
        why = f"{err}; discarded it, training from step 0"
        trainer.reporter.warn(why)
        # state.json goes first: a crash midway leaves no checkpoint, not half of one.
        remove_checkpoint(folder)
        return why
    return None


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
