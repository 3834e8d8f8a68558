"""AR and the tasks built on it (noisy AR, overwrite AR, MQAR, compositional MQAR): what they
share with AR. The recipe (the paper's AR epochs and learning-rate grid, the quick preset's
per-architecture rates through ``family``), AR's corruption (a key absent from the document),
the answer candidates (the values of the document's context), AR's vocabulary of keys then
values, the draw of distinct ids every generator makes, the roles of a queried pair, and the
check of a count that cannot exceed the pairs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pydantic import ValidationInfo, field_validator

from mecheval.tasks.base import TaskConfigBase, fits_distinct_pairs, out_of_range, present_ids
from mecheval.tasks.batch import Batch
from mecheval.tasks.documents import Documents
from mecheval.tasks.vocab import BOS, DIV, N_SPECIAL

#: Rows of uniforms drawn at once by :func:`distinct_rows`'s dense case.
_CHUNK = 4096


class ARFamilyConfig(TaskConfigBase):
    """A task of AR's family: AR's recipe and corruption; its values are the answers."""

    default_epochs = 16  # §4.1
    # The paper's AR grid: {3e-5 … 3e-3} plus the follow-up {1e-2, 3e-2} (text: [3e-5, 3e-2]).
    paper_lrs = (3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
    family = "ar"
    corrupt_to_absent = True

    if TYPE_CHECKING:  # a field of every subclass (declared there, in its own order)
        n_values: int

    def value_id(self, value: torch.Tensor | int) -> torch.Tensor | int:
        raise NotImplementedError

    def context_end(self) -> int | None:
        """Where the context whose values are the answer candidates ends: None at the
        divider, else a position (a task without a divider)."""
        return None

    def answer_candidates(self, batch: Batch) -> torch.Tensor:
        """The values of each document's context: what a model that learned "answer with a
        value from the context" but not the key-value binding picks from (noise tokens and
        fillers are never candidates; a stale value of overwrite AR is one)."""
        lo, hi = self.value_id(0), self.value_id(self.n_values)
        return present_ids(batch, lo, hi, self.vocab_size(), end=self.context_end())


class KeyValueConfig(ARFamilyConfig):
    """An AR-family task with AR's ids: the specials, then keys k0.., then values v0..
    (disjoint); the key class is the keys."""

    if TYPE_CHECKING:  # fields of every subclass
        n_keys: int

    @field_validator("n_pairs", "n_slots", check_fields=False)
    @classmethod
    def _pairs_fit(cls, v: int, info: ValidationInfo) -> int:
        """A document's pairs (noisy AR: its slots, each may be a pair) have distinct keys
        and distinct values."""
        return fits_distinct_pairs(v, info)

    def key_id(self, key: torch.Tensor | int) -> torch.Tensor | int:
        return key + N_SPECIAL

    def value_id(self, value: torch.Tensor | int) -> torch.Tensor | int:
        return value + N_SPECIAL + self.n_keys

    def token_names(self) -> list[str]:
        return [f"k{i}" for i in range(self.n_keys)] + [f"v{i}" for i in range(self.n_values)]

    def key_class(self) -> tuple[int, int]:
        return int(self.key_id(0)), int(self.key_id(self.n_keys))


def pair_roles(pair: torch.Tensor) -> dict[str, torch.Tensor]:
    """The roles of the queried pair, at index ``pair`` among a document's ``<bos> k v k v ...``:
    its key, its value right after it, and the token after that (the next pair's key)."""
    key = 1 + 2 * pair
    return {"key": key, "value": key + 1, "next_key": key + 2}


def rebound_documents(
    cfg: KeyValueConfig,
    slot_keys: torch.Tensor,
    values: torch.Tensor,
    asked: torch.Tensor,
    latest: torch.Tensor,
    stale: torch.Tensor,
    extras: dict[str, torch.Tensor] | None = None,
) -> Documents:
    """``<bos> k v .. k v <div> q`` of a task whose keys are bound again (overwrite and
    reassign AR): the slots' keys and values ([n, S] key and value indices), the query key
    (key index per document), the slot of its latest binding (the answer and AR's roles) and
    of the binding before it (``stale_key``, ``stale_value``)."""
    n, slots = slot_keys.shape
    pairs = torch.stack([cfg.key_id(slot_keys), cfg.value_id(values)], dim=2)
    width = 2 * slots + 3
    tokens = torch.empty(n, width, dtype=torch.long)
    tokens[:, 0] = BOS
    tokens[:, 1 : width - 2] = pairs.reshape(n, 2 * slots)
    tokens[:, width - 2] = DIV
    tokens[:, width - 1] = cfg.key_id(asked)
    full = torch.full((n,), width - 2, dtype=torch.long)
    stale_key = 1 + 2 * stale
    roles = {
        **pair_roles(latest),
        "divider": full,
        "query": full + 1,
        "stale_key": stale_key,
        "stale_value": stale_key + 1,
    }
    answer = cfg.value_id(values[torch.arange(n), latest])
    return Documents(tokens, answer, roles, full + 2, extras=extras or {})


def at_most_pairs(v: int | None, info: ValidationInfo, why: str = "") -> int | None:
    """A field validator's body for a count (None: unset) that cannot exceed the document's
    ``n_pairs`` (validated before it); ``why`` opens the error."""
    n_pairs = info.data.get("n_pairs")
    if v is not None and n_pairs is not None and v > n_pairs:
        raise out_of_range(f"{why}{': ' if why else ''}allowed 1..n_pairs={n_pairs}", v)
    return v


def _has_duplicate(rows: torch.Tensor) -> torch.Tensor:
    s = rows.sort(dim=1).values
    return (s[:, 1:] == s[:, :-1]).any(dim=1)


def distinct_rows(gen: torch.Generator, n: int, k: int, m: int) -> torch.Tensor:
    """[n, k] long, each row k distinct ints from 0..m-1, uniformly over such rows."""
    if k * k <= 2 * m:
        # Few collisions (birthday bound): draw with replacement and redraw bad rows.
        out = torch.randint(m, (n, k), generator=gen)
        bad = _has_duplicate(out)
        while bool(bad.any()):
            out[bad] = torch.randint(m, (int(bad.sum()), k), generator=gen)
            bad = _has_duplicate(out)
        return out
    # Dense case: the k largest of m uniforms are a uniform random k-subset in random order.
    parts = [
        torch.rand(min(_CHUNK, n - i), m, generator=gen).topk(k, dim=1).indices
        for i in range(0, n, _CHUNK)
    ]
    return torch.cat(parts) if parts else torch.zeros(0, k, dtype=torch.long)
