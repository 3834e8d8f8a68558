"""The task registry: kind -> the task's config class (a
:class:`~mecheval.tasks.base.TaskConfigBase`, which carries the task's behaviour), like the
architecture registry. The stages that name a task by its kind (config parsing, presets, the
experiment catalog, ``mecheval task``, report labels) look it up here; the others call the
config they hold.

A new task is one module defining its config class plus one line below; from outside the
package, :func:`register_task` (e.g. in a ``--plugin`` file).
"""

from __future__ import annotations

from typing import Any

from mecheval.errors import ConfigError, validate
from mecheval.tasks.ar import ARConfig
from mecheval.tasks.atr import ATRConfig
from mecheval.tasks.base import TaskConfigBase
from mecheval.tasks.compositional_mqar import CompositionalMQARConfig
from mecheval.tasks.mqar import MQARConfig
from mecheval.tasks.noisy_ar import NoisyARConfig
from mecheval.tasks.overwrite_ar import OverwriteARConfig
from mecheval.tasks.reassign_ar import ReassignARConfig
from mecheval.tasks.reverse_ar import ReverseARConfig
from mecheval.tasks.stacked_mqar import StackedMQARConfig
from mecheval.tasks.state_tracking import ParityConfig, S3Config

TASKS: dict[str, type[TaskConfigBase]] = {}


def kind_of(task: type[TaskConfigBase]) -> str:
    """The kind a task's config class declares (its ``kind`` field's default)."""
    field = task.model_fields.get("kind")
    if field is None or not isinstance(field.default, str):
        raise ConfigError(f"task {task.__name__}: declares no kind (kind: Literal[...] = ...)")
    return field.default


def register_task(task: type[TaskConfigBase]) -> type[TaskConfigBase]:
    kind = kind_of(task)
    if kind in TASKS:
        raise ConfigError(f"task {kind!r}: registered twice")
    TASKS[kind] = task
    return task


for _task in (
    ARConfig,
    ATRConfig,
    NoisyARConfig,
    OverwriteARConfig,
    ReassignARConfig,
    MQARConfig,
    CompositionalMQARConfig,
    ReverseARConfig,
    StackedMQARConfig,
    ParityConfig,
    S3Config,
):
    register_task(_task)


def get_task(kind: str) -> type[TaskConfigBase]:
    try:
        return TASKS[kind]
    except KeyError:
        raise ConfigError(
            f"task.kind: unknown {kind!r} (expected one of: {', '.join(TASKS)})"
        ) from None


def task_label(kind: str) -> str:
    """How reports name a task kind: its ``label``; a kind no task registers (a results folder
    from a plugin not loaded now), upper-cased."""
    task = TASKS.get(kind)
    return (task.label or kind) if task is not None else kind.upper()


def parse_task(data: Any, prefix: str = "task") -> TaskConfigBase:
    """Validate task config data (a mapping with ``kind``) into its task's config class."""
    if isinstance(data, TaskConfigBase):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix}: expected a mapping with a kind, got {type(data).__name__}")
    if "kind" not in data:
        raise ConfigError(f"{prefix}.kind: missing (expected one of: {', '.join(TASKS)})")
    return validate(get_task(str(data["kind"])), data, prefix=prefix)
