"""Synthetic in-context retrieval tasks: associative recall (AR) and treecall (ATR), the AR
family built on AR, and the registry that any other task joins (tasks/registry.py). A task is
its config class: fields for its parameters, methods for its behaviour (tasks/base.py).

Public API::

    from mecheval.tasks import (ARConfig, ATRConfig, TaskConfig, build_datasets, corrupt,
                                TaskDataset, Batch, ROLES, get_task, register_task)
"""

from mecheval.tasks.ar import ARConfig
from mecheval.tasks.atr import MIN_YIELD, QUERY_TYPES, ATRConfig
from mecheval.tasks.base import SPLITS, TaskConfigBase
from mecheval.tasks.batch import ROLES, Batch
from mecheval.tasks.corrupt import corrupt
from mecheval.tasks.dataset import TaskDataset, build_datasets, cache_path, config_hash
from mecheval.tasks.documents import Documents
from mecheval.tasks.pcfg import Grammar, build_grammar
from mecheval.tasks.registry import (
    TASKS,
    get_task,
    kind_of,
    parse_task,
    register_task,
    task_label,
)
from mecheval.tasks.vocab import BOS, DIV, PAD

#: The type of a run's ``task`` field: any registered task's config.
TaskConfig = TaskConfigBase

__all__ = [
    "BOS",
    "DIV",
    "MIN_YIELD",
    "PAD",
    "QUERY_TYPES",
    "ROLES",
    "SPLITS",
    "TASKS",
    "ARConfig",
    "ATRConfig",
    "Batch",
    "Documents",
    "Grammar",
    "TaskConfig",
    "TaskConfigBase",
    "TaskDataset",
    "build_datasets",
    "build_grammar",
    "cache_path",
    "config_hash",
    "corrupt",
    "get_task",
    "kind_of",
    "parse_task",
    "register_task",
    "task_label",
]
