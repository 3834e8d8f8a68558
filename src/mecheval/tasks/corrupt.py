"""Counterfactual documents: the key at ``roles["key"]`` replaced by another of its class
(the task's ``key_class()``). The key is the token there, or the key it carries where the
task's tokens carry one (``key_of`` / ``with_key``: stacked MQAR's pair ``k:v`` becomes
``k':v``).

* A task with ``corrupt_to_absent`` (AR): another id, drawn uniformly among the class's ids
  that occur nowhere in the document, so the corrupted query has no answer in context (the
  in-context key was the only instance of the query key). Only if every id of the class occurs
  in the document (n_pairs == n_keys) is it drawn among all other ids.
* Otherwise (ATR): uniform over the other ids of the class. Terminals repeat within yields,
  so "absent from the document" is often impossible; the paper swaps the terminal.

Draws come from ``torch.Generator().manual_seed(seed)`` on the CPU, one per document in batch
order, so (batch, seed) rebuilds the same pair. Exactly one token per document changes.
"""

from __future__ import annotations

import torch

from mecheval.tasks.base import TaskConfigBase
from mecheval.tasks.batch import Batch


def corrupt(batch: Batch, cfg: TaskConfigBase, seed: int) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    tokens = batch.tokens.cpu()
    rows = torch.arange(len(batch))
    pos = batch.roles["key"].cpu()
    keys = cfg.key_of(tokens)
    old = keys[rows, pos]
    lo, hi = cfg.key_class()
    n_class = hi - lo
    if n_class < 2:
        raise ValueError("corrupt: the key class has a single token; nothing to swap in")
    if cfg.corrupt_to_absent and len(batch):
        present = torch.zeros(len(batch), n_class, dtype=torch.bool)
        in_class = (keys >= lo) & (keys < hi)
        r, c = in_class.nonzero(as_tuple=True)
        present[r, keys[r, c] - lo] = True
        allowed = ~present
        full = ~allowed.any(dim=1)
        # Every key is in the document: fall back to any key but the original.
        allowed[full] = True
        allowed[rows[full], old[full] - lo] = False
        new = torch.multinomial(allowed.float(), 1, generator=gen).squeeze(1) + lo
    else:
        # Shift by 1..n_class-1 (mod class size): uniform over the other tokens of the class.
        shift = torch.randint(1, n_class, (len(batch),), generator=gen)
        new = (old - lo + shift) % n_class + lo
    out = tokens.clone()
    out[rows, pos] = cfg.with_key(tokens[rows, pos], new)
    return batch.with_tokens(out.to(batch.tokens.device))
