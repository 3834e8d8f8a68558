"""State tracking: the word problem of a finite group (parity, S3).

Sources: Grazzi et al. (arXiv 2411.12537, Fig. 1: parity) and Merrill et al. (2024, "The
Illusion of State": the S3/A5 word problem). A document is a sequence of group elements and
the answer at every position is the product of the elements so far, the state a recurrence
would carry::

    <bos> g1 g2 .. gn          -> s1 = g1 at g1, s2 = g2 s1 at g2, .., sn at gn

Elements are permutations, and the state after element ``g`` is ``g ∘ s`` (the state is
applied first, then ``g``), from the identity. Parity is the group of two permutations
(elements ``0`` = the identity and ``1`` = the swap; states ``even`` and ``odd``); S3 the six
permutations of three points in lexicographic order, written in one-line notation
(``120`` maps 0→1, 1→2, 2→0; states ``=120``). Elements and states have ids of their own, as
AR's keys and values do: a state is the answer class and never an input.

Splits. A ``train`` row is a document of ``max_elements`` elements with the loss at every
element (dense supervision, as Grazzi et al. and Merrill et al. train: every prefix is a
shorter document, so lengths 1..max_elements are all trained). A ``dev`` or ``test`` row is
one probe: a document of n elements, n uniform in ``min_elements..max_elements`` (test:
``test_min_elements..test_max_elements``, by default the same; longer test documents measure
length generalisation, Grazzi et al.'s test lengths 40-256 after training up to 40), whose
answer is the state after its last element.

Roles of a probe: key = the element the counterfactual changes, uniform among the elements
before the last; query = the last element. Corruption replaces that element by another, uniform
among the group's others (parity: the bit flips), which changes the answer always (a group has
no two elements with the same effect). Every state is an answer candidate.

Labels (interventions/labels.py, docs/tasks.md): where the changed element's information is
carried to the answer, the first of: ``in the state after it``, a layer's recurrent state at
the query (the state its answer reads, after the element) restores the answer; ``at the
element``, the last layer's input at the element does (the last layer reads the element
itself); ``only at the query``, the query's does (the answer was composed at the query before
the last layer).
"""

from __future__ import annotations

import itertools
from typing import ClassVar, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

from mecheval.tasks.base import SPLIT_IDS, TaskConfigBase, out_of_range, torch_generator
from mecheval.tasks.batch import ANSWER_POSITIONS, ANSWERS, Batch
from mecheval.tasks.documents import Documents
from mecheval.tasks.readings import STATE_TRACKING
from mecheval.tasks.vocab import BOS, N_SPECIAL


def composition_table(permutations: tuple[tuple[int, ...], ...]) -> torch.Tensor:
    """[G, G] long: entry (s, g) is the index of ``g ∘ s`` (i ↦ g[s[i]]) among
    ``permutations``."""
    index = {p: i for i, p in enumerate(permutations)}
    return torch.tensor(
        [[index[tuple(g[i] for i in s)] for g in permutations] for s in permutations]
    )


class WordProblemConfig(TaskConfigBase):
    """The word problem of a group of permutations: elements in, the running product out."""

    #: the group's elements, the identity first
    permutations: ClassVar[tuple[tuple[int, ...], ...]] = ()
    element_names: ClassVar[tuple[str, ...]] = ()
    state_names: ClassVar[tuple[str, ...]] = ()
    shared_roles = ("key", "query")
    readings = STATE_TRACKING

    # ``kind`` is declared by each subclass.
    max_elements: int = Field(
        40, ge=2, description="elements of a training document (Grazzi et al.: up to 40)"
    )
    min_elements: int = Field(
        3, ge=2, description="fewest elements of a dev or test probe (Grazzi et al.: 3)"
    )
    test_min_elements: int | None = Field(
        None, ge=2, description="fewest elements of a test probe (unset: min_elements)"
    )
    test_max_elements: int | None = Field(
        None, ge=2, description="most elements of a test probe (unset: max_elements)"
    )

    @field_validator("min_elements")
    @classmethod
    def _min_fits(cls, v: int, info: ValidationInfo) -> int:
        most = info.data.get("max_elements")
        if most is not None and v > most:
            raise out_of_range(f"allowed 2..max_elements={most}", v)
        return v

    @field_validator("test_max_elements")
    @classmethod
    def _test_range(cls, v: int | None, info: ValidationInfo) -> int | None:
        least = info.data.get("test_min_elements") or info.data.get("min_elements")
        if v is not None and least is not None and v < least:
            raise out_of_range(f"allowed >= test_min_elements (or min_elements) = {least}", v)
        return v

    @property
    def group_order(self) -> int:
        return len(self.permutations)

    def probe_lengths(self, split: str) -> tuple[int, int]:
        """The fewest and most elements of ``split``'s probes."""
        if split == "test":
            lo = self.test_min_elements or self.min_elements
            return lo, self.test_max_elements or max(self.max_elements, lo)
        return self.min_elements, self.max_elements

    def element_id(self, element: torch.Tensor | int) -> torch.Tensor | int:
        return element + N_SPECIAL

    def state_id(self, state: torch.Tensor | int) -> torch.Tensor | int:
        return state + N_SPECIAL + self.group_order

    def token_names(self) -> list[str]:
        return [*self.element_names, *self.state_names]

    def key_class(self) -> tuple[int, int]:
        return int(self.element_id(0)), int(self.element_id(self.group_order))

    def max_length(self) -> int:
        return 1 + max(self.max_elements, self.probe_lengths("test")[1])

    def answer_candidates(self, batch: Batch) -> torch.Tensor:
        """Every state: any of them can be the answer of any document."""
        mask = torch.zeros(len(batch), self.vocab_size(), dtype=torch.bool)
        mask[:, self.state_id(0) : self.state_id(self.group_order)] = True
        return mask.to(batch.tokens.device)

    def generate(self, split: str, n: int, shared: None = None) -> Documents:
        return generate_word_problem(self, split, n)

    def describe(self, documents: Documents, i: int) -> str:
        names = self.id_names()
        length = int(documents.lengths[i])
        if ANSWERS in documents.extras:
            states = documents.extras[ANSWERS][i]
        else:
            states = running_states(self, documents.tokens[i : i + 1, 1:length])[0]
        return "  (states: " + " ".join(names[int(s)] for s in states) + ")"

    def stats(self, documents: Documents) -> dict[str, torch.Tensor]:
        return {"elements": documents.roles["query"]}


def running_states(cfg: WordProblemConfig, elements: torch.Tensor) -> torch.Tensor:
    """[n, L] state ids after each element of ``elements`` [n, L] (element ids)."""
    table = composition_table(cfg.permutations)
    state = torch.zeros(len(elements), dtype=torch.long)  # the identity
    out = torch.empty_like(elements)
    for t in range(elements.shape[1]):
        state = table[state, elements[:, t] - N_SPECIAL]
        out[:, t] = state
    return cfg.state_id(out)


def generate_word_problem(cfg: WordProblemConfig, split: str, n: int) -> Documents:
    """``n`` documents of ``split``: train rows with the loss at every element, dev and test
    rows one probe each (module docstring)."""
    gen = torch_generator(cfg.seed, SPLIT_IDS[split], 0x57A7E)
    lo, hi = (cfg.max_elements, cfg.max_elements) if split == "train" else cfg.probe_lengths(split)
    elements = cfg.element_id(torch.randint(cfg.group_order, (n, hi), generator=gen))
    length = torch.randint(lo, hi + 1, (n,), generator=gen)
    # the changed element: uniform among the 1..length-1 before the last
    key = 1 + (torch.rand(n, generator=gen) * (length - 1)).long().clamp_max(length - 2)
    states = running_states(cfg, elements)
    tokens = torch.zeros(n, 1 + hi, dtype=torch.long)
    tokens[:, 0] = BOS
    tokens[:, 1:] = elements
    tokens[torch.arange(1 + hi)[None, :] > length[:, None]] = 0  # pad after the last
    rows = torch.arange(n)
    extras = {}
    if split == "train":
        positions = torch.arange(1, hi + 1).expand(n, hi).contiguous()
        extras = {ANSWER_POSITIONS: positions, ANSWERS: states}
    return Documents(
        tokens=tokens,
        answer=states[rows, length - 1],
        roles={"key": key, "query": length},
        lengths=length + 1,
        extras=extras,
    )


class ParityConfig(WordProblemConfig):
    """Parity: bits in, the parity of the bits so far out."""

    label = "Parity"
    permutations = ((0, 1), (1, 0))
    element_names = ("0", "1")
    state_names = ("even", "odd")
    preset_fields = {
        "quick": {"max_elements": 16, "min_elements": 3},
        "tiny": {"max_elements": 6, "min_elements": 3, "n_dev": 32, "n_test": 32},
    }

    kind: Literal["parity"] = "parity"


_S3 = tuple(itertools.permutations(range(3)))


class S3Config(WordProblemConfig):
    """The S3 word problem: permutations of three points in, their running product out."""

    label = "S3"
    permutations = _S3
    element_names = tuple("".join(map(str, p)) for p in _S3)
    state_names = tuple("=" + "".join(map(str, p)) for p in _S3)
    preset_fields = {
        "quick": {"max_elements": 16, "min_elements": 3},
        "tiny": {"max_elements": 6, "min_elements": 3, "n_dev": 32, "n_test": 32},
    }

    kind: Literal["s3"] = "s3"
