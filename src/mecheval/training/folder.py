"""A run folder: its files, the life cycle its status records, and loading it back.

``runs/<name>/``::

    config.yaml           the fully resolved RunConfig
    model.safetensors     final weights (written when the run is done)
    metrics.csv           tidy behavioural metrics: step, split, metric, value (the Trainer's)
    status.json           {"state": "running" | "done" | "failed", "reason", "step", ...}
    provenance.json       where it came from: software, machine, settings per training
                          session; fingerprints of its documents and initial weights
                          (see provenance.py)
    checkpoint/           training state while the run is unfinished (see checkpoint.py)
    tensorboard/, wandb/  the trackers' files, where training.log names them (trackers.py)
    .lock                 while a process trains the run: its PID (see :meth:`RunFolder.locked`)

Life cycle (:class:`RunFolder`): prepared (config.yaml; a folder holding another config's run
is refused) -> running -> done (weights saved, checkpoint removed), or failed with a reason:
``diverged: ...`` (final: training again would only diverge again) or ``crashed: ...``
(resumable from the last checkpoint). Single runs (run.py) and stacked groups (group.py)
both go through it, so their folders cannot drift apart.

Every file is written atomically (mecheval.io); the temporary files a killed process leaves
are removed when the run trains again.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from mecheval.errors import ConfigError, DamagedFile, first_line
from mecheval.io import atomic_save_safetensors, atomic_write_json, atomic_write_text, read_json
from mecheval.models import LanguageModel, build_model
from mecheval.training import provenance
from mecheval.training.checkpoint import remove_checkpoint
from mecheval.training.config import (
    RunConfig,
    config_to_data,
    dump_yaml,
    load_config,
    total_steps,
)
from mecheval.training.reporter import print_warning
from mecheval.training.trackers import TENSORBOARD_DIR, WANDB_DIR  # noqa: F401 - names kept here

# Every file name of a run folder, here (the trackers' folders from trackers.py, imported
# above). Training writes these ...
CONFIG_FILE = "config.yaml"
MODEL_FILE = "model.safetensors"
METRICS_FILE = "metrics.csv"
STATUS_FILE = "status.json"
PROVENANCE_FILE = "provenance.json"
CHECKPOINT_DIR = "checkpoint"
LOCK_FILE = ".lock"
# ... the emergence callback during training, and the interventions after it
# (experiments/mechanisms.py), these.
EMERGENCE_FILE = "emergence.csv"
INTERVENTIONS_FILE = "interventions.csv"
MECHANISM_FILE = "mechanism.json"
ATTRIBUTION_FILE = "attribution.csv"
GRADES_FILE = "attribution.json"

try:  # POSIX; elsewhere run folders are not locked
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

#: Fields that may differ between the config a run was started with and the one it is resumed
#: or skipped with: they change how fast, not what, it computes (``precision`` is not one).
RUNTIME_FIELDS = ("threads", "device", "compile", "kernels", "log")


class RunLocked(ConfigError):
    """Another process is training this run folder."""


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """The run's status, None before it has one. Raises :class:`DamagedFile` for a
    ``status.json`` that is not a JSON object (see :meth:`RunFolder.status` for training,
    which trains such a run again)."""
    path = Path(run_dir) / STATUS_FILE
    if not path.is_file():
        return None
    try:
        status = read_json(path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DamagedFile(f"{path}: damaged, not JSON ({type(err).__name__})") from None
    if not isinstance(status, dict) or not isinstance(status.get("state"), str):
        raise DamagedFile(f"{path}: damaged, expected a JSON object with a state")
    return status


def peek_status(run_dir: Path) -> dict[str, Any] | None:
    """:func:`read_status` for deciding what to do with a run: a damaged status reads as none
    (the run trains again, and :meth:`RunFolder.status` says so when it does)."""
    try:
        return read_status(run_dir)
    except DamagedFile:
        return None


def is_finished(status: Mapping[str, Any] | None) -> bool:
    """Done, or failed by divergence (which would only diverge again): nothing to redo."""
    if status is None:
        return False
    return status.get("state") == "done" or (
        status.get("state") == "failed" and str(status.get("reason", "")).startswith("diverged")
    )


def _comparable(cfg: RunConfig) -> dict[str, Any]:
    data = config_to_data(cfg)
    for key in RUNTIME_FIELDS:
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


def finished_as(run_dir: Path, cfg: RunConfig) -> bool:
    """Whether ``run_dir`` holds a finished run of ``cfg`` (runtime fields aside)."""
    if not (Path(run_dir) / CONFIG_FILE).is_file() or not is_finished(peek_status(run_dir)):
        return False
    try:
        check_same_config(run_dir, cfg)
    except ConfigError:
        return False
    return True


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
        """As :func:`read_status`, but a damaged ``status.json`` reads as no status (the run
        then resumes from its checkpoint or trains again, which ends as the run did:
        training is deterministic), with a warning naming the file."""
        try:
            return read_status(self.path)
        except DamagedFile as err:
            print_warning(f"{err}; training the run again (from its checkpoint if it has one)")
            return None

    def holds_other_config(self) -> bool:
        """Whether the folder holds another config's run that never trained (which training
        replaces). Raises ConfigError where it holds another config's run that trained, done
        or not: that run is neither this config's result nor its to resume."""
        try:
            check_same_config(self.path, self.cfg)
        except ConfigError:
            if not self.never_trained():
                raise
            return True
        return False

    def check(self) -> dict[str, Any] | None:
        """The status of a finished run of this config (nothing to do), or None: the run is
        to train or resume. Raises ConfigError where the folder holds another config's run."""
        if self.holds_other_config():
            # Left by an attempt that failed before its first step (its data could not be
            # built, say): nothing of it is worth keeping, so it must not block the fix.
            print_warning(f"{self.path}: replacing the config of a run that never trained")
            for name in (STATUS_FILE, METRICS_FILE, EMERGENCE_FILE):
                (self.path / name).unlink(missing_ok=True)
        status = self.status()
        return status if is_finished(status) else None

    def never_trained(self) -> bool:
        """No weights, no checkpoint, and no step taken (the folder of a failed start)."""
        if (self.path / MODEL_FILE).exists() or self.checkpoint_dir.exists():
            return False
        return int((peek_status(self.path) or {}).get("step", 0)) == 0

    def prepare(self) -> dict[str, Any] | None:
        """:meth:`check`; where there is a run to train, create the folder, remove the
        temporary files a killed writer left, and write ``config.yaml`` (the config it is
        about to train). Call it holding :meth:`locked`."""
        status = self.check()
        if status is None:
            self.path.mkdir(parents=True, exist_ok=True)
            for folder in (self.path, self.checkpoint_dir):
                for stray in folder.glob(".*.tmp"):
                    stray.unlink(missing_ok=True)
            atomic_write_text(self.path / CONFIG_FILE, dump_yaml(self.cfg))
        return status

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the run folder for this process: another process that tries to train it
        meanwhile gets :class:`RunLocked` naming this one's PID. The lock is the kernel's
        (flock), so a killed holder releases it; its ``.lock`` file is removed on release."""
        if fcntl is None:  # pragma: no cover
            yield
            return
        self.path.mkdir(parents=True, exist_ok=True)
        path = self.path / LOCK_FILE
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise RunLocked(
                    f"{self.path}: being trained by process {holder}; wait for it to finish "
                    "or stop it"
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:  # the holder before us removed it as we opened it
                same = False
            if same:
                break
            os.close(fd)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            yield
        finally:
            # Unlinked before it is unlocked: a process that opened the old file retries.
            path.unlink(missing_ok=True)
            os.close(fd)

    def running(
        self, documents: str | None = None, initial_weights: str | None = None, **notes: Any
    ) -> dict[str, Any]:
        """Mark the run running and open a session in ``provenance.json``; ``documents`` and
        ``initial_weights`` are the run's fingerprints (kept from its first session)."""
        record = read_provenance(self.path) or {}
        for key, value in (("documents", documents), ("initial_weights", initial_weights)):
            if record.get(key) is None:
                record[key] = value
        record["sessions"] = [*record.get("sessions", []), provenance.session(self.cfg)]
        atomic_write_json(self.path / PROVENANCE_FILE, record)
        return write_status(self.path, state="running", step=0, total_steps=self.total, **notes)

    def _end_session(self, state: str, step: int) -> None:
        """Close the session :meth:`running` opened: when, how and at which step it ended."""
        record = read_provenance(self.path)
        if not record or not record.get("sessions"):
            return
        record["sessions"][-1].update(ended=provenance.now(), state=state, step=step)
        atomic_write_json(self.path / PROVENANCE_FILE, record)

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
        self._end_session("done", step)
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
        self._end_session("failed", step)
        return write_status(
            self.path,
            state="failed",
            reason=reason,
            step=step,
            total_steps=self.total,
            wall_time=wall_time,
            **notes,
        )


def is_held(run_dir: Path) -> bool:
    """Whether a process holds the run folder now (:meth:`RunFolder.locked`): a run whose
    status says running and that no process holds was cut off (killed, or its machine
    gone)."""
    path = Path(run_dir) / LOCK_FILE
    if fcntl is None or not path.exists():
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock this call took
    return False


#: The state of a run whose status says running while no process trains it.
CUT_OFF = "cut off"


def run_status(run_dir: Path) -> dict[str, Any]:
    """The run's status, "pending" before it started and "cut off" where it says running
    but no process holds its folder; never raises on a bad file."""
    try:
        status = read_status(run_dir) or {"state": "pending"}
    except DamagedFile:
        # Writes are atomic, so a broken file means someone else wrote it: say so, don't guess.
        return {"state": "unreadable", "reason": f"{run_dir / STATUS_FILE}: not valid JSON"}
    if status.get("state") == "running" and not is_held(run_dir):
        return {**status, "state": CUT_OFF}
    return status


def unfinished(run_dir: Path) -> str | None:
    """None for a run that is done; otherwise what it is, in words: ``still training (step
    120 of 400)``, ``cut off at step 120 of 400``, ``failed at step 12: diverged: ...``,
    ``not started``."""
    status = run_status(run_dir)
    state = status["state"]
    if state == "done":
        return None
    at = f"step {status.get('step', 0)}"
    if status.get("total_steps"):
        at += f" of {status['total_steps']}"
    if state == "running":
        return f"still training ({at})"
    if state == CUT_OFF:
        return f"cut off at {at}: no process trains it (run it again to resume)"
    if state == "failed":
        return f"failed at {at}: {status.get('reason')}"
    if state == "pending":
        return "not started"
    return f"{state}: {status.get('reason')}"


def read_provenance(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``provenance.json``, None where it has none (a run trained before it was
    recorded) or where it is damaged (it records, it does not decide anything)."""
    try:
        record = read_json(Path(run_dir) / PROVENANCE_FILE)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def load_run(
    run_dir: str | Path, device: str | torch.device = "cpu", cfg: RunConfig | None = None
) -> tuple[RunConfig, LanguageModel]:
    """Rebuild a finished run's model from ``config.yaml`` and ``model.safetensors`` (eval
    mode). ``cfg``: the resolved config the caller trained the run from (then
    ``config.yaml``, written from it, is not read again)."""
    run_dir = Path(run_dir)
    config_path, model_path = run_dir / CONFIG_FILE, run_dir / MODEL_FILE
    if not config_path.is_file():
        raise ConfigError(f"{run_dir}: not a run folder (no {CONFIG_FILE})")
    if not model_path.is_file():
        raise ConfigError(f"{run_dir}: {unfinished(run_dir) or 'done'}; no {MODEL_FILE} to read")
    cfg = load_config(config_path) if cfg is None else cfg
    model = build_model(cfg.model)
    try:
        weights = load_file(model_path, device=str(device))
    except (OSError, SafetensorError) as err:
        first = first_line(err)
        raise DamagedFile(f"{model_path}: damaged, not a safetensors file ({first})") from None
    mismatch = _weights_mismatch(model.state_dict(), weights)
    if mismatch:
        raise DamagedFile(f"{model_path}: does not match {config_path} ({mismatch})")
    model.load_state_dict(weights)
    return cfg, model.to(device).eval()


def _weights_mismatch(
    expected: Mapping[str, torch.Tensor], saved: Mapping[str, torch.Tensor]
) -> str | None:
    """The first difference between a model's state dict and saved weights, in words."""
    missing = sorted(expected.keys() - saved.keys())
    if missing:
        return f"no tensor {missing[0]}"
    extra = sorted(saved.keys() - expected.keys())
    if extra:
        return f"unexpected tensor {extra[0]}"
    for key, value in saved.items():
        if value.shape != expected[key].shape:
            want = tuple(expected[key].shape)
            return f"{key} is {tuple(value.shape)}, the config's model has {want}"
    return None
