"""What every task shares: its config's base class, which carries the task's behaviour, the
splits, seeded generators and helpers for validators and answer candidates.

A task is one config class (tasks/ar.py's ``ARConfig``, tasks/atr.py's ``ATRConfig``): its
fields are the task's parameters, its class attributes the task's constants (report label,
the paper's epochs and learning-rate grid, preset fields) and its methods the task's
behaviour (generate documents, name its ids, ...), with defaults where most tasks agree. One
line in tasks/registry.py (or :func:`~mecheval.tasks.registry.register_task` from outside the
package) makes every stage use it: datasets, corruption, training defaults, presets, the
experiment catalog, ``mecheval task show|stats`` and the report's labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from mecheval.errors import ConfigError
from mecheval.tasks.batch import ROLES, Batch
from mecheval.tasks.documents import Documents
from mecheval.tasks.readings import RETRIEVAL, Readings
from mecheval.tasks.vocab import N_SPECIAL, SPECIAL_NAMES

SPLITS = ("train", "dev", "test")
#: Each split's entry in its seed: the splits draw from disjoint streams of one seed.
SPLIT_IDS = {split: i for i, split in enumerate(SPLITS)}


class TaskConfigBase(BaseModel):
    """A task: its parameters (fields), constants (class attributes) and behaviour (methods).

    A task's config subclasses this, adds ``kind: Literal["<its kind>"] = "<its kind>"`` and
    its own fields, sets ``label`` and implements :meth:`generate`, :meth:`token_names`,
    :meth:`max_length` and :meth:`key_class`; the other methods have defaults that fit a task
    whose every document needs its key and whose context holds answers only.
    """

    model_config = ConfigDict(extra="forbid")

    # ``kind`` is declared by each subclass (after these fields, as the cached configs have it).
    seed: int = Field(0, ge=0, description="data seed: same config, same documents")
    n_train: int = Field(100_032, ge=0, description="training documents (paper: 100,032)")
    n_dev: int = Field(320, ge=0, description="dev documents (paper: 320)")
    n_test: int = Field(320, ge=0, description="test documents (paper: 320)")

    # ------------------------------------------------------------------------ constants
    #: how reports name the task: "AR"
    label: ClassVar[str] = ""
    #: the paper's epochs for this task, and its learning-rate grid
    default_epochs: ClassVar[int] = 16
    paper_lrs: ClassVar[tuple[float, ...]] = (1e-3,)
    #: the task fields of the ``quick`` and ``tiny`` presets (training/presets.py holds the
    #: model and training parts, the same for every task; ``paper`` is the defaults)
    preset_fields: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    #: epochs of the ``quick`` preset
    quick_epochs: ClassVar[int] = 1
    #: the tasks that share one training recipe (AR and the tasks built on it: "ar"), for the
    #: quick preset's per-architecture learning rates (training/presets.py); "": none
    family: ClassVar[str] = ""
    #: corruption draws among the key class's ids absent from the document (AR: the corrupted
    #: query then has no answer in context); False: among all other ids of the class
    corrupt_to_absent: ClassVar[bool] = False
    #: the shared roles (tasks/batch.py's ROLES) its documents carry, in ROLES' order: all of
    #: them unless a role has no token to point at (MQAR has no divider)
    shared_roles: ClassVar[tuple[str, ...]] = ROLES
    #: roles beyond the shared ones (overwrite AR: stale_key, stale_value); datasets keep them
    #: and interventions restore at them too
    extra_roles: ClassVar[tuple[str, ...]] = ()
    #: a per-document structure stored with the dataset (ATR's derivation trees): a class with
    #: ``tensors() -> dict``, ``from_tensors(dict)`` and ``check(n)``; None: none
    tree_class: ClassVar[Any] = None
    #: how its restores read as mechanism labels (tasks/readings.py): retrieval's by default
    readings: ClassVar[Readings] = RETRIEVAL

    # ------------------------------------------------------------------------ behaviour
    def generate(self, split: str, n: int, shared: Any) -> Documents:
        """``n`` documents of ``split``, drawn from the split's own seeded stream;
        ``shared`` is :meth:`shared_state`'s result, built once for all splits."""
        raise NotImplementedError

    def token_names(self) -> list[str]:
        """The names of the task's own ids, which follow the special tokens (tasks/vocab.py)."""
        raise NotImplementedError

    def max_length(self) -> int:
        """Most input tokens of a document (query position + 1): the position-embedding size."""
        raise NotImplementedError

    def key_class(self) -> tuple[int, int]:
        """[lo, hi) ids of the class a corrupted key is drawn from."""
        raise NotImplementedError

    def key_of(self, ids: torch.Tensor) -> torch.Tensor:
        """The key-class id each id carries, for corruption (tasks/corrupt.py): the id itself
        by default; a task whose tokens carry a key inside them (stacked MQAR's pair ids)
        maps them to that key."""
        return ids

    def with_key(self, ids: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``ids`` with the key they carry replaced by ``keys`` (key-class ids): ``keys`` by
        default, a token that is its key."""
        del ids
        return keys

    def shared_state(self) -> Any:
        """State built once per config and handed to every split's generator (ATR: its
        grammar); None by default."""
        return None

    def answer_candidates(self, batch: Batch) -> torch.Tensor:
        """[B, V] bool: the answer candidates present in each document, the ids of the
        answer's class in its context (AR: the values before the divider; ATR: the terminals
        of the yield). The binding scores (tasks/scores.py) and the label ``candidates only
        (no binding)`` read them. By default every non-special id before the divider, right
        for a task whose context holds answers only."""
        return present_ids(batch, N_SPECIAL, self.vocab_size(), self.vocab_size())

    def key_free(self, batch: Batch) -> torch.Tensor | None:
        """bool [B]: documents a model can answer without reading the key (ATR: the answer is
        the root's head), which interventions can leave out; None: every document needs its
        key."""
        del batch
        return None

    @property
    def has_key_free_documents(self) -> bool:
        """Whether the task marks documents answerable without their key (it overrides
        :meth:`key_free`): only then does ``--documents key-dependent`` leave any out."""
        return type(self).key_free is not TaskConfigBase.key_free

    def split_rows(self, split: str) -> int:
        """Rows the split's dataset holds: its document count unless the task cuts documents
        into several rows (MQAR: one probe per query in dev and test)."""
        return self.split_size(split)

    def typical_length(self, batch_size: int) -> int:
        """The padded width of a typical training batch: the sequence length at which to time
        a training step (the longest document where lengths are fixed)."""
        del batch_size
        return self.max_length()

    def check_train_queries(self, n_queries: int) -> int:
        """Whether training documents can carry ``n_queries`` queries
        (``training.train_queries``); the tokens each document gains. Raises ConfigError."""
        del n_queries
        raise ConfigError(f"training.train_queries: task {self.kind!r} takes no extra queries")

    def extend_queries(
        self, batch: Batch, n_queries: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Training documents with ``n_queries`` queries: (tokens, query positions [Q],
        answers [B, Q]); only for a task whose :meth:`check_train_queries` accepts them."""
        raise NotImplementedError

    def describe(self, documents: Documents, i: int) -> str:
        """``task show``: text printed after document ``i``'s answer."""
        del documents, i
        return ""

    def stats(self, documents: Documents) -> dict[str, torch.Tensor]:
        """``task stats``: per-document statistics beyond the shared ones (lengths, role
        distances)."""
        del documents
        return {}

    # ----------------------------------------------------------------------- derived
    def split_size(self, split: str) -> int:
        return {"train": self.n_train, "dev": self.n_dev, "test": self.n_test}[split]

    def roles(self) -> tuple[str, ...]:
        """The roles of the documents: the shared ROLES they have, then the task's own."""
        return (*(r for r in ROLES if r in self.shared_roles), *self.extra_roles)

    def id_names(self) -> list[str]:
        """Printable name of every id, indexed by id: the specials, then the task's own."""
        return [*SPECIAL_NAMES, *self.token_names()]

    def vocab_size(self) -> int:
        return len(SPECIAL_NAMES) + len(self.token_names())


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


def held_out_fraction(description: str) -> Any:
    """A field for the fraction of a task's pairs that only test documents ask about: unset
    (no split) or strictly between 0 and 1; its validator calls :func:`check_split`."""
    return Field(None, gt=0, lt=1, description=description)


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
    default its divider, ``roles["divider"]``): the helper for
    :meth:`TaskConfigBase.answer_candidates`."""
    tokens = batch.tokens
    steps = torch.arange(tokens.shape[1], device=tokens.device)
    stop = batch.roles["divider"][:, None] if end is None else end
    before = steps[None, :] < stop
    hit = before & (tokens >= lo) & (tokens < hi)
    mask = torch.zeros(len(batch), vocab_size, dtype=torch.bool, device=tokens.device)
    rows, cols = hit.nonzero(as_tuple=True)
    mask[rows, tokens[rows, cols]] = True
    return mask
