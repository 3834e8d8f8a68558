"""Train one run into its folder (see folder.py): resume it, skip it when done, record why it
stopped; and the interrupts (Ctrl-C, SIGTERM) that stop a run resumably.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mecheval.training.checkpoint import (
    CorruptCheckpoint,
    has_checkpoint,
    read_checkpoint,
    remove_checkpoint,
)
from mecheval.training.config import RunConfig
from mecheval.training.folder import RunFolder, peek_status
from mecheval.training.provenance import documents_fingerprint, fingerprint
from mecheval.training.reporter import Reporter
from mecheval.training.resolved import ResolvedRun
from mecheval.training.threads import torch_threads
from mecheval.training.trainer import Callback, Diverged, Trainer

__all__ = [
    "Terminated",
    "crash_reason",
    "discard_corrupt_checkpoint",
    "raise_interrupt",
    "stop_on_sigterm",
    "train",
    "train_run",
]


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


def train(
    cfg: RunConfig,
    run_dir: str | Path,
    callbacks: Sequence[Callback] = (),
    *,
    datasets: Mapping[str, Any] | None = None,
    cache_dir: Path | None = None,
    reporter: Reporter | None = None,
) -> dict[str, Any]:
    """Train ``cfg`` into ``run_dir`` and return its status: :func:`train_run` of the
    config resolved."""
    run = ResolvedRun.of(cfg, run_dir, cache_dir)
    return train_run(run, callbacks, datasets=datasets, reporter=reporter)


def train_run(
    run: ResolvedRun,
    callbacks: Sequence[Callback] = (),
    *,
    datasets: Mapping[str, Any] | None = None,
    reporter: Reporter | None = None,
) -> dict[str, Any]:
    """Train ``run`` into its folder and return its status.

    A finished run is skipped (its status is returned); an unfinished one resumes from its
    last checkpoint and ends exactly as an uninterrupted run would. A diverged run (non-finite
    loss) is marked failed and its status returned, not raised. ``datasets`` may be passed to
    share one build between runs of the same task; by default they are built from the run's
    task (through its dataset cache). ``reporter`` is told the progress and any warning
    (default: no progress display).
    """
    run.check_machine()
    folder = run.folder()
    with folder.locked():
        return _train(folder, callbacks, datasets, run.cache_dir, reporter)


def _train(
    folder: RunFolder,
    callbacks: Sequence[Callback],
    datasets: Mapping[str, Any] | None,
    cache_dir: Path | None,
    reporter: Reporter | None,
) -> dict[str, Any]:
    cfg = folder.cfg
    finished = folder.prepare()
    if finished is not None:
        return finished
    reached = int((peek_status(folder.path) or {}).get("step") or 0)
    with torch_threads(cfg.training.threads):
        start = time.perf_counter()
        trainer: Trainer | None = None
        notes: dict[str, str] = {}  # kept in the running, done and diverged statuses
        try:
            if datasets is None:
                datasets = _build_datasets(cfg, cache_dir)
            trainer = Trainer(cfg, datasets, folder.path, callbacks, reporter)
            notes.update(_check_checkpoint(trainer, folder.path, reached))
            folder.running(*_fingerprints(datasets, trainer.model), **notes)
            results = trainer.run()
            return folder.done(
                trainer.model.state_dict(),
                step=trainer.step,
                wall_time=trainer.wall_time(start),
                metrics=results,
                **trainer.stop_note(),
                **notes,
            )
        except Diverged as err:
            assert trainer is not None
            return folder.failed(
                err.reason,
                step=err.step,
                wall_time=trainer.wall_time(start),
                metrics=trainer.last_results,
                **notes,
            )
        except BaseException as err:
            # Not a property of the config: a later call resumes from the last checkpoint.
            folder.failed(
                crash_reason(err),
                step=trainer.step if trainer is not None else 0,
                wall_time=trainer.wall_time(start)
                if trainer is not None
                else time.perf_counter() - start,
            )
            raise


def _fingerprints(datasets: Mapping[str, Any], model: Any) -> tuple[str, str]:
    """The run's documents and its model's weights, as :func:`provenance.fingerprint` reads
    them (the weights as initialised: a checkpoint is restored when training starts)."""
    return documents_fingerprint(datasets), fingerprint(model.state_dict())


def _build_datasets(cfg: RunConfig, cache_dir: Path | None) -> Mapping[str, Any]:
    from mecheval.tasks import build_datasets

    return build_datasets(cfg.task, cache_dir=cache_dir)


def _check_checkpoint(trainer: Trainer, run_dir: Path, reached: int) -> dict[str, str]:
    """A corrupt checkpoint discarded (noted in the status), or a warning where the run had
    reached a step and left no checkpoint to resume it from."""
    discarded = discard_corrupt_checkpoint(trainer)
    if discarded:
        return {"discarded_checkpoint": discarded}
    if reached > 0 and not has_checkpoint(trainer.checkpoint_dir):
        # Say so: a rerun that quietly starts over looks like one that resumed.
        trainer.reporter.warn(
            f"{run_dir}: no checkpoint to resume its step {reached} from; training from step 0"
        )
    return {}


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
