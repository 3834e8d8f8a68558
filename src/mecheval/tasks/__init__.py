"""Synthetic in-context retrieval tasks: associative recall (AR) and treecall (ATR).

Public API::

    from mecheval.tasks import (ARConfig, ATRConfig, TaskConfig, build_datasets, corrupt,
                                vocab_size, max_length, TaskDataset, Batch, ROLES)
"""

from mecheval.tasks.batch import ROLES, Batch
from mecheval.tasks.config import QUERY_TYPES, ARConfig, ATRConfig, TaskConfig
from mecheval.tasks.corrupt import corrupt
from mecheval.tasks.dataset import (
    TaskDataset,
    build_datasets,
    cache_path,
    config_hash,
    typical_batch_length,
)
from mecheval.tasks.pcfg import Grammar, build_grammar
from mecheval.tasks.vocab import BOS, DIV, PAD, max_length, token_names, vocab_size

__all__ = [
    "BOS",
    "DIV",
    "PAD",
    "QUERY_TYPES",
    "ROLES",
    "ARConfig",
    "ATRConfig",
    "Batch",
    "Grammar",
    "TaskConfig",
    "TaskDataset",
    "build_datasets",
    "build_grammar",
    "cache_path",
    "config_hash",
    "corrupt",
    "max_length",
    "token_names",
    "typical_batch_length",
    "vocab_size",
]
