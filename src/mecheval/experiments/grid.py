"""Sweep specs: a base run config plus a grid, expanded into named runs.

A sweep spec (YAML)::

    name: ar-main
    base:                      # a partial RunConfig, or {preset: quick, task: ar}
      preset: quick
      task: ar
    set:                       # dotted overrides applied to every run (not in run names)
      task.n_pairs: 8
    grid:                      # dotted config paths -> lists of values (a full product)
      model.architecture: [attention, mamba]
      model.d_model: [32, 64]
      training.seed: [0, 1]
    per_architecture:          # optional overrides applied to runs of one architecture
      mamba: {training.lr: 3e-3}
    also:                      # optional further grids, each with its own set: their runs
      - set: {task.n_pairs: 8} #   join the sweep's (one folder, one report)
        grid: {model.n_layers: [4]}

With a preset base, the grid may also vary ``task`` (task kinds): each run then starts from
that task's preset (``task: [ar, mqar]``; the task-by-architecture matrix does this).

Each point of the product becomes one run with a readable, stable name built from the grid
values in spec order, e.g. ``mamba-d64-lr1e-3-s0`` (but for the values ``unnamed`` leaves
out); the runs of ``also``'s grids follow, each
grid's ``set`` over the sweep's (runs of models too unlike to share one product, in one
folder and one report). The user's documentation of the format:
docs/sweeps.md, with configs/sweep-example.yaml.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from mecheval.errors import ConfigError, validate
from mecheval.io import load_yaml
from mecheval.models.config import layers_name

#: How a grid key shows in a run name: a short prefix (value appended), "" = value alone.
NAME_PREFIXES: dict[str, str] = {
    "task": "",
    "model.architecture": "",
    "model.layers": "",
    "model.d_model": "d",
    "model.n_layers": "L",
    "model.position_embedding": "pe",
    "model.short_conv": "conv",
    "model.mixer.d_conv": "conv",
    "model.mixer.kernel_size": "k",
    "model.mixer.conv_kernel_size": "k",
    "model.mixer.long_conv": "long",
    "model.mixer.allow_neg_eigval": "neg",
    "training.lr": "lr",
    "training.seed": "s",
    "task.seed": "data",
    "task.n_pairs": "pairs",
    "task.query": "",
    "task.split": "split",
}


def _each_has_values(grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
    for key, values in grid.items():
        if not values:
            raise ValueError(f"grid.{key}: expected at least one value")
    return grid


class GridPart(BaseModel):
    """A further grid of a sweep (``also``): its runs take its ``set`` over the sweep's."""

    model_config = ConfigDict(extra="forbid")

    set: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(min_length=1)

    @field_validator("grid")
    @classmethod
    def _non_empty(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return _each_has_values(grid)


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    base: dict[str, Any] = Field(default_factory=dict)
    set: dict[str, Any] = Field(default_factory=dict)
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    per_architecture: dict[str, dict[str, Any]] = Field(default_factory=dict)
    also: list[GridPart] = Field(default_factory=list)
    #: grid values a run's name leaves out, so that adding an axis keeps the names of the
    #: runs that train as before (``reproduce --seeds 0,1``: seed 0 keeps its name)
    unnamed: dict[str, Any] = Field(default_factory=dict)

    @field_validator("grid")
    @classmethod
    def _non_empty(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return _each_has_values(grid)

    def parts(self) -> list[GridPart]:
        """Every grid of the sweep, in order: its own (with no ``set`` of its own), then
        ``also``'s."""
        return [GridPart.model_construct(set={}, grid=self.grid), *self.also]

    def varies(self, key: str) -> bool:
        """Whether one of the sweep's grids has ``key`` as an axis."""
        return any(key in part.grid for part in self.parts())


#: The grid key that varies the task kind of a preset base (not a dotted config path).
TASK_AXIS = "task"


@dataclass(frozen=True)
class RunSpec:
    """One point of a sweep: its run's name, the grid's values there (dotted keys, and the
    ``task`` axis), the architecture whose ``per_architecture`` entry applies (None: no
    run of the sweep names one) and which of the sweep's grids (``parts()``) it is a point of."""

    name: str
    point: dict[str, Any] = field(default_factory=dict)
    architecture: str | None = None
    grid_index: int = 0

    @property
    def task(self) -> str | None:
        """The task kind the grid chose for this run (the ``task`` axis), if any."""
        task = self.point.get(TASK_AXIS)
        return None if task is None else str(task)


def name_part(key: str, value: Any) -> str:
    prefix = NAME_PREFIXES.get(key, key.rsplit(".", 1)[-1])
    if value is None:
        text = "none"
    elif isinstance(value, bool):
        text = "on" if value else "off"
    elif isinstance(value, float):
        text = f"{value:.0e}".replace("e-0", "e-").replace("e+0", "e") if value else "0"
        if float(text) != value:
            # One digit fits a grid's LRs (3e-4); a value it would round (0.99 -> 1e0, the
            # name 0.95 has too) is named exactly, so two values never share a folder.
            text = repr(value)
    elif key == "model.layers":
        text = layers_name(value)
    elif isinstance(value, list | tuple):
        text = "_".join(str(v) for v in value)
    else:
        text = str(value)
    return f"{prefix}{text}"


def _unnamed(spec: SweepSpec, key: str, value: Any) -> bool:
    """Whether run names leave out this value of axis ``key`` (of its type too: ``True`` is
    not ``1``)."""
    if key not in spec.unnamed:
        return False
    left_out = spec.unnamed[key]
    return type(left_out) is type(value) and left_out == value


def expand(spec: SweepSpec) -> list[RunSpec]:
    """The points of the sweep's grids in order, each named from its values; what each run's
    config is made of is merged in experiments/plan.py."""
    for key in spec.unnamed:
        if not spec.varies(key):
            raise ConfigError(f"sweep.unnamed.{key}: no grid of this sweep varies it")
    runs: list[RunSpec] = []
    seen: set[str] = set()
    architectures: set[str] = set()
    for index, part in enumerate(spec.parts()):
        keys = list(part.grid)
        fixed = {**spec.set, **part.set}.get(
            "model.architecture", spec.base.get("model", {}).get("architecture")
        )
        for values in itertools.product(*(part.grid[k] for k in keys)):
            point = dict(zip(keys, values, strict=True))
            arch = point.get("model.architecture", fixed)
            architectures.add(str(arch))
            named = {k: v for k, v in point.items() if not _unnamed(spec, k, v)}
            name = "-".join(name_part(k, v) for k, v in named.items()) or spec.name
            if name in seen:
                raise ConfigError(f"grid: two runs would both be named {name!r}")
            seen.add(name)
            runs.append(RunSpec(name, point, None if arch is None else str(arch), index))
    for arch in spec.per_architecture:
        if arch not in architectures:
            # A misspelt name would otherwise leave its runs without their overrides.
            raise ConfigError(
                f"sweep.per_architecture.{arch}: no run of this sweep has that architecture "
                f"(its runs: {', '.join(sorted(architectures - {'None'})) or 'none named'})"
            )
    return runs


def load_sweep(path: str | Path) -> SweepSpec:
    path = Path(path)
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (expected a YAML sweep spec)") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read sweep spec ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with name/base/grid")
    return validate(SweepSpec, data, prefix="sweep")
