"""What every task shares: its config's common fields, the splits, seeded generators, and the
:class:`Task` record that the task registry (tasks/registry.py) maps a kind to.

A task is one module (tasks/ar.py, tasks/atr.py) that defines its config class, its document
generator and a ``TASK = Task(...)``; one line in tasks/registry.py (or :func:`register_task`
from outside the package) makes every stage use it: datasets, corruption, training defaults,
presets, the experiment catalog, ``mecheval task show|stats`` and the report's labels.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from mecheval.tasks.batch import ROLES
from mecheval.tasks.vocab import N_SPECIAL

if TYPE_CHECKING:
    from mecheval.tasks.batch import Batch
    from mecheval.tasks.dataset import TaskDataset

SPLITS = ("train", "dev", "test")
#: Each split's entry in its seed: the splits draw from disjoint streams of one seed.
SPLIT_IDS = {split: i for i, split in enumerate(SPLITS)}


class TaskConfigBase(BaseModel):
    """The fields every task config has; a task's config subclasses it and adds
    ``kind: Literal["<its kind>"] = "<its kind>"`` and its own fields."""

    model_config = ConfigDict(extra="forbid")

    # ``kind`` is declared by each subclass (after these fields, as the cached configs have it).
    seed: int = Field(0, ge=0, description="data seed: same config, same documents")
    n_train: int = Field(100_032, ge=0, description="training documents (paper: 100,032)")
    n_dev: int = Field(320, ge=0, description="dev documents (paper: 320)")
    n_test: int = Field(320, ge=0, description="test documents (paper: 320)")

    def split_size(self, split: str) -> int:
        return {"train": self.n_train, "dev": self.n_dev, "test": self.n_test}[split]


def out_of_range(msg: str, got: object) -> PydanticCustomError:
    """A field validator's error: one line, and the field in its location."""
    # A custom error keeps pydantic's "Value error, " prefix out of the one-line message.
    del got  # errors.describe appends the offending input itself
    return PydanticCustomError("out_of_range", msg)


def fits_distinct_pairs(v: int, info: Any) -> int:
    """A field validator's body for a count of pairs (or pair slots) in a document whose keys
    and values are distinct: at most min(n_keys, n_values) (fields validated before it)."""
    limit = min(info.data.get("n_keys", v), info.data.get("n_values", v))
    if v > limit:
        raise out_of_range(
            f"distinct keys and values per document need 1..{limit} (= min(n_keys, n_values))", v
        )
    return v


def check_split(fraction: float, total: int, what: str) -> None:
    """A held-out fraction of ``total`` pairs must leave at least one pair on each side."""
    held = round(fraction * total)
    if held < 1 or held >= total:
        raise out_of_range(
            f"holds out {held} of {total} {what} pairs; allowed fractions leave at least one "
            f"test and one train pair, i.e. {0.5 / total:.3g} < fraction < {1 - 0.5 / total:.6g}",
            fraction,
        )


def numpy_rng(*entropy: int) -> np.random.Generator:
    """A NumPy generator seeded from the integers ``entropy`` (through NumPy's SeedSequence)."""
    return np.random.default_rng(list(entropy))


def torch_generator(*entropy: int, two_words: bool = False) -> torch.Generator:
    """A CPU torch generator seeded from the integers ``entropy`` through NumPy's
    SeedSequence: distinct entropy tuples give independent streams. The seed is one 64-bit
    word cut to 63 bits (the documents' streams), or with ``two_words`` two 32-bit words, high
    then low (training's data order and extra queries): each caller keeps the derivation its
    saved datasets and runs were made with."""
    sequence = np.random.SeedSequence(list(entropy))
    if two_words:
        high, low = sequence.generate_state(2, dtype=np.uint32)
        return torch.Generator().manual_seed(int(high) << 32 | int(low))
    seed = int(sequence.generate_state(1, dtype=np.uint64)[0])
    return torch.Generator().manual_seed(seed & ((1 << 63) - 1))


def present_ids(
    batch: Batch, lo: int, hi: int, vocab_size: int, end: int | None = None
) -> torch.Tensor:
    """[B, V] bool: True at the ids in [lo, hi) that occur in a document before ``end`` (by
    default its divider, ``roles["divider"]``): the helper for :attr:`Task.answer_candidates`
    hooks."""
    tokens = batch.tokens
    steps = torch.arange(tokens.shape[1], device=tokens.device)
    stop = batch.roles["divider"][:, None] if end is None else end
    before = steps[None, :] < stop
    hit = before & (tokens >= lo) & (tokens < hi)
    mask = torch.zeros(len(batch), vocab_size, dtype=torch.bool, device=tokens.device)
    rows, cols = hit.nonzero(as_tuple=True)
    mask[rows, tokens[rows, cols]] = True
    return mask


def context_ids(batch: Batch, vocab_size: int) -> torch.Tensor:
    """The default answer candidates: every non-special id before the divider."""
    return present_ids(batch, N_SPECIAL, vocab_size, vocab_size)


#: (cfg, split, n documents, the task's shared state) -> the arrays of a TaskDataset:
#: tokens, answer, roles, lengths, extras (and trees, for a task that keeps derivations).
Generator = Callable[[Any, str, int, Any], dict[str, Any]]


@dataclass(frozen=True)
class Task:
    """One task kind: everything the pipeline needs to know about it, in one record."""

    kind: str
    label: str  # how reports name it: "AR"
    config: type[TaskConfigBase]
    generate: Generator
    #: names of the task's own token ids, which follow the special tokens (tasks/vocab.py)
    token_names: Callable[[Any], list[str]]
    #: most input tokens of a document (query position + 1): the position-embedding size
    max_length: Callable[[Any], int]
    #: [lo, hi) ids of the class a corrupted key is drawn from
    key_class: Callable[[Any], tuple[int, int]]
    #: corruption draws among the class's ids absent from the document (AR: the corrupted query
    #: then has no answer in context); False: among all other ids of the class
    corrupt_to_absent: bool
    default_epochs: int  # the paper's epochs for this task
    paper_lrs: tuple[float, ...]  # the paper's learning-rate grid
    #: preset name ("paper", "quick", "tiny") -> run config data (task, model, training)
    presets: Mapping[str, Mapping[str, Any]]
    #: per-architecture peak LR of the quick preset (others keep the preset's)
    quick_lrs: Mapping[str, float] = field(default_factory=dict)
    #: state built once per config and passed to every split's generator (ATR's grammar)
    shared: Callable[[Any], Any] | None = None
    #: a per-document structure stored with the dataset (ATR's derivation trees): a class with
    #: ``tensors() -> dict`` and ``from_tensors(dict)``
    trees: Any = None
    #: ``task show``: text printed after document i's answer
    describe: Callable[[TaskDataset, int], str] | None = None
    #: ``task stats``: statistics beyond the shared ones (lengths, role distances)
    stats: Callable[[TaskDataset], dict[str, torch.Tensor]] | None = None
    #: the padded width of a typical training batch, where lengths vary (default: max_length)
    typical_length: Callable[[Any, int], int] | None = None
    #: training.train_queries > 1: (cfg, n) -> extra tokens, after checking the config can
    #: take n queries, and (batch, n, generator) -> (tokens, positions, answers)
    check_train_queries: Callable[[Any, int], int] | None = None
    extend_queries: Callable[[Batch, int, torch.Generator], tuple] | None = None
    #: (cfg, batch) -> bool [B]: documents a model can answer without reading the key (ATR:
    #: the answer is the root's head), which interventions can leave out
    #: (``InterventionPlan.documents``); None: every document needs its key
    key_free: Callable[[Any, Batch], torch.Tensor] | None = None
    #: (cfg, batch, vocabulary size) -> bool [B, V]: the answer candidates present in each
    #: document, the ids of the answer's class that occur in its context (AR: the values
    #: before the divider; ATR: the terminals of the yield); the answer should be one of them.
    #: The binding scores (tasks/scores.py: in-context mass and accuracy) and the label
    #: ``candidates only (no binding)`` read them. None: every non-special id before the
    #: divider (:func:`context_ids`), right for a task whose context holds answers only.
    answer_candidates: Callable[[Any, Batch, int], torch.Tensor] | None = None
    #: roles beyond the shared ones (tasks/batch.py's ROLES) that the task's documents carry
    #: (overwrite AR: stale_key, stale_value); datasets keep them and interventions restore
    #: at them too
    extra_roles: tuple[str, ...] = ()
    #: the shared roles (tasks/batch.py's ROLES) its documents carry, in ROLES' order: all of
    #: them unless a role has no token to point at (MQAR has no divider)
    shared_roles: tuple[str, ...] = ROLES
    #: (cfg, split) -> rows the split's dataset holds, where that is not the split's document
    #: count (MQAR: one probe per query in dev and test); None: ``cfg.split_size(split)``
    split_rows: Callable[[Any, str], int] | None = None
