"""Reverse (value-first) associative recall: each pair's value comes before its key.

Source: tinylang's value-query AR (aryamanarora/tinylang, ``tinylang/language/ar.py`` with
``query_type: "value"``; the ``ar_32_reverse`` experiments on ``languages/ar_value_first``):
the document lists pairs and the query is a pair's *second* token, whose answer is the
token *before* it. In mecheval's words, with AR's vocabulary (keys are what is queried and
corrupted, values what is answered)::

    <bos> v1 k1 v2 k2 ... vn kn <div> q   -> the value right before key q

A reverse AR document is the AR document of the same config with every pair's two tokens
swapped (same seed, same draws: tasks/ar.py's generator), so every AR field keeps its
meaning (variable lengths with ``min_pairs``, held-out pairs with ``split_pairs``).

Roles: key = the in-context position of the queried key, value = key − 1 (before it),
next_key = key + 1 (the token after the key: the next pair's value, or the divider),
divider, query. Corruption is AR's: the token at ``key`` becomes a key absent from the
document. A causal model cannot carry the key to its value, which comes first: restoring at
``value`` never recovers anything, so this task cannot read ``induction``; what it reads
instead (the value moved onto the key, then read at the query: ``direct retrieval, layer
>= 1``; or nothing learned) is the question it asks of each architecture (docs/tasks.md).
"""

from __future__ import annotations

from typing import Literal

import torch

from mecheval.tasks.ar import ARConfig, generate_ar
from mecheval.tasks.base import TaskConfigBase
from mecheval.tasks.documents import Documents


class ReverseARConfig(ARConfig):
    """Reverse AR: ``<bos> v1 k1 ... vn kn <div> q`` → the value before key ``q``."""

    label = "Reverse AR"

    kind: Literal["reverse_ar"] = "reverse_ar"  # type: ignore[assignment]

    def generate(self, split: str, n: int, shared: None = None) -> Documents:
        return reverse_pairs(generate_ar(self, split, n))

    # AR's extra training queries assume key-first pairs: refused, as for any task without them.
    check_train_queries = TaskConfigBase.check_train_queries
    extend_queries = TaskConfigBase.extend_queries


def reverse_pairs(ar: Documents) -> Documents:
    """AR documents with each pair's key and value swapped, and their roles moved with them."""
    tokens = ar.tokens.clone()
    n, pairs = len(tokens), max(tokens.shape[1] - 3, 0) // 2  # the longest document's pairs
    span = tokens[:, 1 : 1 + 2 * pairs]
    # Only a document's own pair slots swap: a shorter one's divider and query fill the slot
    # after its last pair and stay where they are.
    own = 1 + 2 * torch.arange(pairs)[None, :] < ar.roles["divider"][:, None]
    swapped = span.reshape(n, pairs, 2).flip(2).reshape(n, 2 * pairs)
    tokens[:, 1 : 1 + 2 * pairs] = torch.where(own.repeat_interleave(2, dim=1), swapped, span)
    key = ar.roles["key"] + 1
    roles = {**ar.roles, "key": key, "value": key - 1, "next_key": key + 1}
    return Documents(
        tokens=tokens, answer=ar.answer, roles=roles, lengths=ar.lengths, extras=ar.extras
    )
