"""Experiment trackers a run also logs to (``training.log``): TensorBoard and Weights & Biases.

metrics.csv stays the record; a tracker shows the same numbers where researchers watch runs.
Each evaluation logs its metrics.csv values as ``<split>/<metric>`` (``train/running_loss``,
``dev/accuracy``, ...) and what the training callbacks return (the emergence restores as
``emergence/<condition>``) at the evaluation's step. Each is an optional extra, imported only
when a run asks for it:

- ``tensorboard``: event files in the run folder's ``tensorboard/`` (offline by nature), read
  with ``tensorboard --logdir <sweep folder>``. A resumed run discards what its earlier session
  logged after the checkpoint it resumes from, so its curves are those of one run.
- ``wandb``: one W&B run per mecheval run (so each member of a stack is its own run), its
  files in the run folder's ``wandb/``; offline unless W&B is configured on this machine
  (``WANDB_MODE``, or an API key from ``WANDB_API_KEY`` or ``wandb login``). The project is
  ``WANDB_PROJECT`` or ``mecheval``; a resumed run continues the same W&B run.

Trackers are a runtime setting (see folder.RUNTIME_FIELDS): they change what is shown, not
what is computed, so a run may be resumed or skipped with other ones.
"""

from __future__ import annotations

import hashlib
import importlib.util
import netrc
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from mecheval.errors import ConfigError

#: The trackers' folders in a run folder (folder.py lists every name a run folder holds).
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"  # W&B's own name for the folder it writes under ``dir``

#: Tracker name -> the module it needs and the extra that installs it.
TRACKERS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
}


def check_trackers(names: Sequence[str], field: str = "training.log") -> None:
    """ConfigError in one line unless every tracker in ``names`` is installed here (checked
    where runs are planned, before any folder is written)."""
    for name in names:
        module, extra = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"{field}: {name} needs the {module} package: pip install 'mecheval[{extra}]'"
            )


class Tracker(Protocol):
    def log(self, step: int, values: Mapping[str, float]) -> None: ...
    def close(self) -> None: ...


class _TensorBoard:
    def __init__(self, run_dir: Path, first_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: events an earlier session wrote from this step on are dropped by
        # TensorBoard's reader, so a resumed run shows each step once.
        self.writer = SummaryWriter(str(run_dir / TENSORBOARD_DIR), purge_step=first_step)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()  # a watcher sees each evaluation as it is made

    def close(self) -> None:
        self.writer.close()


def wandb_mode() -> str:
    """``WANDB_MODE`` where set; online where W&B has an API key here (``WANDB_API_KEY``, or
    the netrc file `wandb login` writes); offline otherwise."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:  # where `wandb login` stores the key (NETRC names another file, as for W&B)
        stored = netrc.netrc(os.environ.get("NETRC")).authenticators("api.wandb.ai")
    except (OSError, netrc.NetrcParseError):
        stored = None
    return "online" if stored else "offline"


class _WandB:
    def __init__(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        import wandb

        # The run's id follows from its folder, so a resumed run continues its W&B run.
        run_id = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]
        (run_dir / WANDB_DIR).mkdir(exist_ok=True)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "mecheval"),
            name=f"{run_dir.parent.name}/{run_dir.name}",
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=dict(config),
            mode=wandb_mode(),
            reinit="create_new",  # the members of a stack are runs of one process
        )

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """The trackers of one run, opened at its first log (a run that is skipped or fails before
    it evaluates opens none) and closed by :meth:`close` (idempotent)."""

    def __init__(
        self, names: Sequence[str], run_dir: Path, config: Mapping[str, Any] | None = None
    ) -> None:
        self.names = tuple(names)
        self.run_dir = Path(run_dir)
        self.config = config or {}
        self.first_step = 0
        self.open: list[Tracker] | None = None

    def resumed_at(self, step: int) -> None:
        """The run resumes from its checkpoint at ``step``: what was logged after it will be
        logged again (``step`` itself is not evaluated again)."""
        self.first_step = step + 1

    def _opened(self) -> list[Tracker]:
        if self.open is None:
            self.open = [self._make(name) for name in self.names]
        return self.open

    def _make(self, name: str) -> Tracker:
        if name == "tensorboard":
            return _TensorBoard(self.run_dir, self.first_step)
        return _WandB(self.run_dir, self.config)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        if not self.names or not values:
            return
        for tracker in self._opened():
            tracker.log(step, values)

    def close(self) -> None:
        for tracker in self.open or []:
            tracker.close()
        self.open = None


def scalars(results: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """``{split: {metric: value}}`` as tracker tags ``split/metric``."""
    return {
        f"{split}/{metric}": float(value)
        for split, values in results.items()
        for metric, value in values.items()
    }
