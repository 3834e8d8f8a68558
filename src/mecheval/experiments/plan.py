"""Planning: a sweep spec (a user's YAML, or an experiment's grid at a preset) into the runs it
trains, each resolved once into a :class:`~mecheval.training.resolved.ResolvedRun`, every
config error raised before anything is written.

Every value of a run is merged here, in :func:`plan_runs` alone, as typed data (no value is
written out as text and parsed back). Later sources win:

1. the preset's config for the run's task and architecture (a ``base`` of ``{preset, task}``),
   or the base config the sweep writes out;
2. the other sections of the sweep's ``base``;
3. the sweep's ``set``: an experiment's fixed values, then its preset's; then the ``set`` of
   the grid the run is a point of (a sweep's ``also``); the command line's ``--set``,
   ``--device`` and ``--compile`` (:func:`with_overrides`) over both;
4. the sweep's ``per_architecture`` entry for the run's architecture;
5. the run's point of the grid, which also names the run (``mamba-d64-lr1e-3``).

The command line's values win over the experiment's own, its per-architecture ones too; a
field the grid varies cannot be set (each run would keep its grid value).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mecheval.errors import ConfigError, validate
from mecheval.experiments.grid import TASK_AXIS, RunSpec, SweepSpec, expand, name_part
from mecheval.training.config import RunConfig, check_model, resolve, set_field
from mecheval.training.folder import RUNTIME_FIELDS, RunFolder, finished_as
from mecheval.training.presets import preset
from mecheval.training.resolved import ResolvedRun

ARCHITECTURE = "model.architecture"

#: The grid axes ``reproduce`` can cut to a subset: flag -> (config key, what it is).
SUBSET_AXES = {
    "--widths": ("model.d_model", "widths"),
    "--lrs": ("training.lr", "learning rates"),
    "--seeds": ("training.seed", "seeds"),
}


def base_config(spec: SweepSpec, architecture: str | None, task_kind: str | None) -> dict:
    """Sources 1 and 2: the preset's config data (``base: {preset, task}``), or the base the
    sweep writes out, with the base's explicit sections over it. ``task_kind`` (the run's value
    on the grid's ``task`` axis) replaces the base's task kind."""
    base = copy.deepcopy(spec.base)
    name = base.pop("preset", None)
    task = base.pop("task", None)
    if task_kind is not None:
        if name is None:
            raise ConfigError("sweep.grid.task: varies the task of a preset base only")
        task = task_kind
    if name is None:
        return {"task": task, **base} if task is not None else base
    if not isinstance(task, str):
        raise ConfigError("sweep.base.task: with a preset, expected a task kind (ar or atr)")
    data = preset(name, task, architecture or "attention")
    for section, values in base.items():
        if section not in RunConfig.model_fields:
            raise ConfigError(f"sweep.base.{section}: unknown field")
        if not isinstance(values, dict):
            raise ConfigError(f"sweep.base.{section}: expected a mapping")
        data.setdefault(section, {}).update(values)
    return data


def run_values(spec: SweepSpec, run: RunSpec) -> dict[str, Any]:
    """Sources 3 to 5 of one run, as dotted keys: the sweep's ``set`` and its grid's, its
    architecture's ``per_architecture`` entry, its grid point (the ``task`` axis stays out: it
    picks the preset)."""
    extra = spec.per_architecture.get(str(run.architecture), {})
    own = spec.parts()[run.grid_index].set
    values = {**spec.set, **own, **extra, **run.point}
    values.pop(TASK_AXIS, None)
    return values


def plan_runs(
    spec: SweepSpec, out_dir: str | Path = "runs", cache_dir: Path | None = None
) -> list[ResolvedRun]:
    """Every run of ``spec``, resolved into its folder ``out_dir/<sweep>/<run>``: the one
    resolution a run gets, every run's config error now, before any folder is prepared."""
    planned = []
    for run in expand(spec):
        values = run_values(spec, run)
        try:
            data = base_config(spec, values.get(ARCHITECTURE), run.task)
            for key, value in values.items():
                set_field(data, key.split("."), copy.deepcopy(value))
            data["name"] = run.name
            cfg = resolve(validate(RunConfig, data), build_check=False)
            run_dir = Path(out_dir) / spec.name / run.name
            if not finished_as(run_dir, cfg):  # a finished run of it was built: no need
                check_model(cfg)
        except ConfigError as err:
            raise ConfigError(f"sweep run {run.name}: {err}") from None
        planned.append(ResolvedRun(cfg, run_dir, cache_dir))
    return planned


def with_overrides(spec: SweepSpec, values: Mapping[str, Any]) -> SweepSpec:
    """``spec`` with the command line's dotted ``values`` over every run (source 3, winning
    over the spec's per-architecture values too). Values that change what the runs compute
    name the sweep after them (``conv-switch-quick-L1``), so its runs never mix with the
    experiment's own; runtime fields (device, threads, compile, kernels, log) keep its folder."""
    if not values:
        return spec
    varied = sorted(key for key in values if spec.varies(key))
    if varied:
        raise ConfigError(
            f"--set {varied[0]}: the sweep's grid varies it (each run keeps its grid value); "
            "run a slice of the grid instead (--widths, --lrs, --seeds, --archs)"
        )
    runtime = {f"training.{field}" for field in RUNTIME_FIELDS}
    suffix = "-".join(name_part(key, value) for key, value in values.items() if key not in runtime)
    per_architecture = {
        arch: {key: value for key, value in own.items() if key not in values}
        for arch, own in spec.per_architecture.items()
    }
    also = [
        part.model_copy(update={"set": {k: v for k, v in part.set.items() if k not in values}})
        for part in spec.also
    ]
    return spec.model_copy(
        update={
            "set": {**spec.set, **values},
            "per_architecture": per_architecture,
            "also": also,
            "name": f"{spec.name}-{suffix}" if suffix else spec.name,
        }
    )


def check_this_machine(planned: Sequence[ResolvedRun]) -> None:
    """Every planned run's device and trackers are on this machine (one ``error:`` line if
    not)."""
    # One run per (device, trackers) says it for all of them.
    for run in {(run.device, tuple(run.cfg.training.log)): run for run in planned}.values():
        run.check_machine()


def check_run_folders(planned: Sequence[ResolvedRun]) -> None:
    """No planned run's folder holds a run of another config that trained (one ``error:``
    line naming the folder if one does), checked before any run starts: a finished one would
    otherwise count as this sweep's result, an unfinished one fail its run only when it
    starts."""
    for run in planned:
        RunFolder(run.run_dir, run.cfg).holds_other_config()


def restrict(spec: SweepSpec, experiment: str, subset: Mapping[str, list[Any]]) -> SweepSpec:
    """``spec`` with the axes named in ``subset`` (flags of :data:`SUBSET_AXES`) cut to the
    given values, each checked against what ``spec`` would run, in each of its grids.

    An axis in a grid keeps the given values that are in it, in grid order (LRs compared
    numerically, the grid's own values kept, so run names and configs are the full grid's).
    An axis the grid does not vary (the width and LR at ``quick``/``tiny``) accepts only the
    one value every run uses and leaves the grid alone; where the runs use several
    (``quick``'s per-architecture LR), the flag is an error. Seeds are not an axis of the
    paper's grid (one seed per configuration): ``--seeds`` other than the runs' own seed adds
    the axis, and a run of another seed carries it in its name (``-s1``); the runs' own seed
    keeps the name it has without the axis, so a run trained before is found again."""
    grids = [dict(part.grid) for part in spec.parts()]
    unnamed = dict(spec.unnamed)
    planned: list[ResolvedRun] | None = None  # and the grid of each: planned once, if asked
    grids_of: list[int] = []
    for flag, values in subset.items():
        key, what = SUBSET_AXES[flag]
        where = f"experiment {experiment!r} at --preset {spec.base.get('preset')}"
        if not values:
            raise ConfigError(f"{flag}: expected at least one value")
        for grid in grids:
            if key in grid:
                grid[key] = _kept(flag, values, grid[key], where)
        lacking = [i for i, grid in enumerate(spec.parts()) if key not in grid.grid]
        if not lacking:
            continue
        if planned is None:
            planned = plan_runs(spec)
            grids_of = [run.grid_index for run in expand(spec)]
        own = [run for run, i in zip(planned, grids_of, strict=True) if i in lacking]
        used = {_config_value(run.cfg, key) for run in own}
        if flag == "--seeds":
            # The paper trains one seed per configuration: more seeds are a new axis (runs then
            # carry an -sN suffix); the one seed the runs use already changes nothing.
            if any(v < 0 for v in values):
                raise ConfigError(f"--seeds: expected seeds >= 0, got {values}")
            if used != set(values):
                for i in lacking:
                    grids[i][key] = list(dict.fromkeys(values))
                if len(used) == 1 and len(lacking) == len(grids):  # no grid named seeds
                    unnamed[key] = next(iter(used))
        elif len(used) != 1:
            per_arch = dict.fromkeys((r.architecture, _config_value(r.cfg, key)) for r in own)
            raise ConfigError(
                f"{flag}: {where} does not sweep {what}; its runs use "
                f"{', '.join(f'{a} {_show(v)}' for a, v in per_arch)} "
                "(pick one architecture with --archs, or use --preset paper)"
            )
        else:
            _kept(flag, values, list(used), where, f"; it does not sweep {what}")
    also = [
        part.model_copy(update={"grid": grid})
        for part, grid in zip(spec.also, grids[1:], strict=True)
    ]
    return spec.model_copy(update={"grid": grids[0], "also": also, "unnamed": unnamed})


def _kept(flag: str, values: list[Any], allowed: list[Any], where: str, note: str = "") -> list:
    """The ``allowed`` values (in their order) that ``values`` name; a ConfigError naming
    ``flag`` where one of ``values`` is not allowed."""
    bad = [v for v in values if not any(_same(v, a) for a in allowed)]
    if bad:
        raise ConfigError(
            f"{flag}: {', '.join(_show(v) for v in bad)} not in the grid of {where} "
            f"(allowed: {', '.join(_show(a) for a in allowed)}{note})"
        )
    return [a for a in allowed if any(_same(v, a) for v in values)]


def _config_value(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


def _show(value: Any) -> str:
    """LRs as in run names (``1e-3``, ``3e-5``) where that is exact, else ``%g``."""
    if not isinstance(value, float):
        return str(value)
    short = f"{value:.0e}".replace("e-0", "e-")
    return short if 0 < abs(value) < 1 and float(short) == value else f"{value:g}"
