"""The contract's check of the intervention engine: on this architecture the batched engine
equals the naive loop and both restore what a restore must (:mod:`mecheval.contract`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from mecheval.contract.fixtures import (
    SIGNAL_INIT_STD,
    VOCAB,
    CheckFailed,
    make_model,
    random_tokens,
    require,
)
from mecheval.interventions import engine, reference
from mecheval.models.sites import site_names
from mecheval.tasks import ROLES, ARConfig, Batch, build_datasets, corrupt
from mecheval.tasks.scores import answer_scores

#: documents of the interchange check
N_DOCS = 6
#: Relative tolerance of the interchange check, between the batched and the naive engine and
#: between a restore and the run it must equal. Both run the same float64 model and score it in
#: float64 (tasks/scores.py); what differs is the order of operations in the model's layers
#: (a batch of patched rows against one document), far below this.
ENGINE_RTOL = 1e-6
#: Corrupting the key must move p(answer) by more than SIGNAL_MARGIN * ENGINE_RTOL in some
#: document, or the check could not tell an engine that restores from one that does nothing.
SIGNAL_MARGIN = 1000


def likelihood(logits: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    return answer_scores(logits, answer, ["likelihood"])["likelihood"]


def _close(a: Any, b: Any) -> Any:
    """|a - b| <= ENGINE_RTOL * max(|a|, |b|), elementwise (floats, arrays or Series)."""
    return abs(a - b) <= ENGINE_RTOL * np.maximum(abs(a), abs(b))


def check_interchange(arch: str, options: Mapping[str, Any] | None = None) -> str:

    task = ARConfig(kind="ar", n_keys=8, n_values=8, n_pairs=3, n_train=0, n_dev=N_DOCS, n_test=0)
    assert task.vocab_size() <= VOCAB
    # Large init and float64, so that every patch matters: at init_std 0.02 restoring the key
    # moves the mean p(answer) by 4e-9..4e-6 on 5 of the 7 built-in architectures, and an
    # engine that restores nothing agrees with the naive loop to within any usable tolerance.
    model = make_model(arch, options, init_std=SIGNAL_INIT_STD).double()
    docs = build_datasets(task)["dev"].batch(torch.arange(N_DOCS))
    # Three more tokens after the query and a role "after" at the first of them: a causal
    # model's p(answer) cannot depend on what is restored there.
    tail = random_tokens(N_DOCS, 3, seed=5) % task.vocab_size()
    original = Batch(
        torch.cat([docs.tokens, tail], 1),
        docs.answer,
        {**docs.roles, "after": docs.query + 1},
        docs.lengths,
    )
    corrupted = corrupt(original, task, seed=3)
    roles = [*ROLES, "after"]
    # Layer 0's sites cover every way the engine restarts (block boundary, inside a block,
    # inside the mixer); the naive loop is too slow to run on every site of every layer.
    sites = [n for n in site_names(model) if n.startswith("layers.0.")] + ["final_norm.input"]
    with torch.no_grad():
        p_orig = likelihood(model(original.tokens, at=original.query), docs.answer)
        p_corr = likelihood(model(corrupted.tokens, at=corrupted.query), docs.answer)
    p_orig, p_corr = p_orig.numpy(), p_corr.numpy()
    moved = float((abs(p_orig - p_corr) / np.maximum(p_orig, p_corr)).max())
    require(
        moved > SIGNAL_MARGIN * ENGINE_RTOL,
        f"corrupting the key moves p(answer) by {moved:.1e} at most (relative): too little "
        "to tell an engine that restores from one that does nothing",
    )

    fast = engine.interchange(model, original, corrupted, sites=sites, roles=roles)
    rows = fast.per_example
    doc = rows["doc"].to_numpy()
    # What each restore must give, whatever the model: at layer 0's input only the key differs
    # between the two runs, so restoring it is the original run and restoring any other role
    # is the corrupted one; and a patch after the query is the corrupted run.
    at_input = rows["site"] == "layers.0.input"
    key = rows["role"] == "key"
    for label, where, want in [
        ("restoring the key at layers.0.input", at_input & key, p_orig),
        ("restoring after the query", rows["role"] == "after", p_corr),
        ("restoring an unchanged token at layers.0.input", at_input & ~key, p_corr),
    ]:
        bad = where & ~_close(rows["restored"], want[doc])
        if bad.any():
            row = rows[bad].iloc[0]
            d = int(row["doc"])
            raise CheckFailed(
                f"{label} ({row['site']}, {row['role']}, document {d}) gave p(answer) "
                f"{row['restored']:.6g}, expected {want[d]:.6g} (original {p_orig[d]:.6g}, "
                f"corrupted {p_corr[d]:.6g})"
            )

    slow = reference.naive_interchange(model, original, corrupted, sites=sites, roles=roles)
    for what, a, b, keys in [
        ("per document", fast.per_example, slow.per_example, ["doc", "site", "role"]),
        ("in the table", fast.table, slow.table, ["condition", "site", "role", "metric"]),
    ]:
        merged = a.merge(b, on=keys, suffixes=("_fast", "_slow"), how="outer")
        require(len(merged) == len(a) == len(b), f"the two engines report different rows {what}")
        for column in [c for c in a.columns if c not in keys]:
            bad = ~_close(merged[f"{column}_fast"], merged[f"{column}_slow"])
            if bad.any():
                row = merged[bad].iloc[0]
                raise CheckFailed(
                    f"batched and naive interchange differ {what} at "
                    + "/".join(str(row[k]) for k in keys)
                    + f": {column} {row[f'{column}_fast']:.8g} vs {row[f'{column}_slow']:.8g}"
                )
    return (
        f"batched engine = naive loop over {len(rows)} restores (relative {ENGINE_RTOL:.0e}); "
        f"restoring the key undoes a corruption that moves p(answer) by up to {moved:.0%}"
    )
