"""One run, resolved once: the record that training, stacking, the run folder and the
interventions all read.

Resolving a config (:func:`~mecheval.training.config.resolve`) fills its derived values
(vocabulary, length, evaluation cadence, name) and builds its model on the meta device to
refuse a shape the architecture cannot take. That is done once per run, where the run is
planned: every later stage takes the :class:`ResolvedRun` and reads from it. A sweep's
worker receives the record as data (a plugin's architecture must be registered before its
config can be read) and rebuilds it with :meth:`ResolvedRun.from_data`, which validates but
does not resolve again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mecheval.training.config import RunConfig, check_device, resolve
from mecheval.training.folder import RunFolder
from mecheval.training.trackers import check_trackers


@dataclass(frozen=True)
class ResolvedRun:
    """A run's resolved config, its folder and the dataset cache it trains from."""

    cfg: RunConfig  # every derived value filled: use :meth:`of` to make one
    run_dir: Path
    cache_dir: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_dir", Path(self.run_dir))

    @classmethod
    def of(cls, cfg: RunConfig, run_dir: str | Path, cache_dir: Path | None = None) -> ResolvedRun:
        """Resolve ``cfg`` (a ConfigError names the field it cannot take) into its run."""
        return cls(resolve(cfg), Path(run_dir), cache_dir)

    @classmethod
    def from_data(
        cls, data: Mapping[str, Any], run_dir: str | Path, cache_dir: str | Path | None
    ) -> ResolvedRun:
        """The record again from its resolved config's data (:meth:`data`), as a worker
        process receives it: validated, not resolved a second time."""
        return cls(
            RunConfig.model_validate(data), Path(run_dir), Path(cache_dir) if cache_dir else None
        )

    def data(self) -> dict[str, Any]:
        """The resolved config as plain data, for another process."""
        return self.cfg.model_dump(mode="json")

    @property
    def name(self) -> str:
        assert self.cfg.name is not None  # resolve names every run
        return self.cfg.name

    @property
    def architecture(self) -> str:
        return self.cfg.model.architecture

    @property
    def vocab_size(self) -> int:
        assert self.cfg.model.vocab_size is not None
        return self.cfg.model.vocab_size

    @property
    def length(self) -> int:
        """The longest document the model takes (the task's, plus any extra train queries)."""
        assert self.cfg.model.max_len is not None
        return self.cfg.model.max_len

    @property
    def device(self) -> str:
        return self.cfg.training.device

    def check_machine(self) -> None:
        """ConfigError unless this machine can train the run: it has the run's device, and
        the packages of the run's trackers are installed."""
        check_device(self.device)
        check_trackers(self.cfg.training.log)

    def folder(self) -> RunFolder:
        return RunFolder(self.run_dir, self.cfg)
