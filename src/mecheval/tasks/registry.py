"""The task registry: kind -> :class:`~mecheval.tasks.base.Task`, like the architecture
registry. Every stage that depends on the task (datasets, corruption, training defaults,
presets, the experiment catalog, ``mecheval task``, report labels) looks the task up here.

A new task is one module defining ``TASK = Task(...)`` plus one line below; from outside the
package, :func:`register_task` (e.g. in a ``--plugin`` file).
"""

from __future__ import annotations

from typing import Any

from mecheval.errors import ConfigError, validate
from mecheval.tasks import ar, atr, compositional_mqar, mqar, noisy_ar, overwrite_ar
from mecheval.tasks.base import Task, TaskConfigBase
from mecheval.tasks.batch import ROLES
from mecheval.tasks.vocab import SPECIAL_NAMES

TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    if task.kind in TASKS:
        raise ConfigError(f"task {task.kind!r}: registered twice")
    TASKS[task.kind] = task
    return task


register_task(ar.TASK)
register_task(atr.TASK)
register_task(noisy_ar.TASK)
register_task(overwrite_ar.TASK)
register_task(mqar.TASK)
register_task(compositional_mqar.TASK)


def get_task(kind: str) -> Task:
    try:
        return TASKS[kind]
    except KeyError:
        raise ConfigError(
            f"task.kind: unknown {kind!r} (expected one of: {', '.join(TASKS)})"
        ) from None


def task_of(cfg: TaskConfigBase) -> Task:
    return get_task(cfg.kind)


def parse_task(data: Any, prefix: str = "task") -> TaskConfigBase:
    """Validate task config data (a mapping with ``kind``) into its task's config class."""
    if isinstance(data, TaskConfigBase):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix}: expected a mapping with a kind, got {type(data).__name__}")
    if "kind" not in data:
        raise ConfigError(f"{prefix}.kind: missing (expected one of: {', '.join(TASKS)})")
    return validate(get_task(str(data["kind"])).config, data, prefix=prefix)


def roles_of(cfg: TaskConfigBase) -> tuple[str, ...]:
    """The roles of the task's documents: the shared ROLES it has, then the task's own."""
    task = task_of(cfg)
    return (*(r for r in ROLES if r in task.shared_roles), *task.extra_roles)


def token_names(cfg: TaskConfigBase) -> list[str]:
    """Printable name of every id, indexed by id: the specials, then the task's own."""
    return [*SPECIAL_NAMES, *task_of(cfg).token_names(cfg)]


def vocab_size(cfg: TaskConfigBase) -> int:
    return len(SPECIAL_NAMES) + len(task_of(cfg).token_names(cfg))


def max_length(cfg: TaskConfigBase) -> int:
    """Most input tokens of a document (query position + 1): the position-embedding size."""
    return task_of(cfg).max_length(cfg)
