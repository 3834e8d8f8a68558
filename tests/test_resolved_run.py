"""A run resolved once: the record every stage reads, and why reading it again is safe."""

from __future__ import annotations

from pathlib import Path

import pytest

from mecheval.errors import ConfigError
from mecheval.tasks import TASKS
from mecheval.training.config import config_from_data, resolve, total_steps
from mecheval.training.presets import preset
from mecheval.training.resolved import ResolvedRun


@pytest.mark.parametrize("kind", sorted(TASKS))
@pytest.mark.parametrize("name", ["tiny", "paper"])
def test_a_resolved_run_is_a_fixed_point_and_travels_as_data(
    kind: str, name: str, tmp_path: Path
) -> None:
    cfg = config_from_data(preset(name, kind, "mamba"), [])
    run = ResolvedRun.of(cfg, tmp_path / "run", tmp_path / "cache")
    # Nothing left to fill: resolving again (what every stage used to do) changes nothing.
    assert resolve(run.cfg) == run.cfg
    assert run.cfg != cfg  # ... and resolving did fill something
    assert total_steps(run.cfg) > 0
    assert run.vocab_size == run.cfg.task.vocab_size()
    assert run.length == run.cfg.task.max_length()
    assert run.name and run.architecture == "mamba" and run.device == "cpu"
    # A worker's copy, rebuilt from data, is the same record.
    again = ResolvedRun.from_data(run.data(), str(run.run_dir), str(run.cache_dir))
    assert again == run
    assert run.folder().cfg is run.cfg and run.folder().total == total_steps(run.cfg)


def test_a_config_the_model_cannot_take_fails_when_resolved(tmp_path: Path) -> None:
    data = preset("tiny", "ar", "attention")
    cfg = config_from_data(data, ["model.vocab_size=3"])
    with pytest.raises(ConfigError, match=r"^model\.vocab_size: 3 is smaller"):
        ResolvedRun.of(cfg, tmp_path)
    assert not any(tmp_path.iterdir())  # nothing written
