"""A run resolved once: the record every stage reads, and why reading it again is safe."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mecheval.errors import ConfigError
from mecheval.models.mixers.base import Mixer
from mecheval.models.registry import ARCHITECTURES, architecture
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


def test_planning_builds_the_model_of_a_run_to_train_not_of_one_finished(
    tmp_path: Path, monkeypatch
):
    """A run's model is built on the meta device when it is planned, to refuse a shape its
    architecture cannot take; a folder that holds the finished run of the same config shows
    it was built, and re-planning it (a rerun of `reproduce` for its report) builds nothing."""
    import small_runs

    from mecheval.experiments import plan
    from mecheval.experiments.grid import SweepSpec
    from mecheval.experiments.runners import run_sweep

    spec = SweepSpec(name="p", base=small_runs.SWEEP_BASE, grid={"training.seed": [0, 1]})
    run_sweep(spec, tmp_path, plan=None)
    built = []
    monkeypatch.setattr(plan, "check_model", lambda cfg: built.append(cfg.name))
    names = [run.name for run in plan.plan_runs(spec, tmp_path)]
    assert built == []
    (tmp_path / "p" / names[1] / "status.json").unlink()  # no longer finished
    plan.plan_runs(spec, tmp_path)
    assert built == [names[1]]
    # Another config under the same name is built (and then refused by the folder check).
    built.clear()
    other = spec.model_copy(update={"set": {"training.lr": 0.5}})
    plan.plan_runs(other, tmp_path)
    assert built == names


class _Limited(Mixer):
    """A mixer that takes documents of at most 4 tokens (``max_length``): the tiny AR
    preset's are 7."""

    def __init__(self, d_model: int, options: object) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(d_model, d_model)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)

    def max_length(self) -> int:
        return 4


class _Unlimited(_Limited):
    def max_length(self) -> None:
        return None


def test_a_mixer_too_short_for_the_documents_fails_when_resolved_even_after_a_build() -> None:
    """The limit is read from a build of the model, which runs of one model config share;
    an architecture registered again under the same name is built again."""
    cfg = config_from_data(preset("tiny", "ar", "attention"), ["model.architecture=limited"])
    try:
        architecture("limited")(_Limited)
        with pytest.raises(ConfigError, match=r"^model\.mixer\.l_max: 4 is shorter"):
            resolve(cfg)
        ARCHITECTURES.pop("limited")
        architecture("limited")(_Unlimited)
        assert resolve(cfg).model.architecture == "limited"
        ARCHITECTURES.pop("limited")
        architecture("limited")(_Limited)
        with pytest.raises(ConfigError, match=r"^model\.mixer\.l_max: 4 is shorter"):
            resolve(cfg)
    finally:
        ARCHITECTURES.pop("limited", None)
