"""The naive interchange: one forward per (site, role, document) through :func:`patch`, the
plain reference the batched engine (interventions/engine.py) is tested against."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch

from mecheval.interventions.patch import patch, record
from mecheval.interventions.result import (
    PER_EXAMPLE_COLUMNS,
    TABLE_COLUMNS,
    InterchangeResult,
    baseline_rows,
    batch_metrics,
    prepare,
    score_rows,
)
from mecheval.models.backbone import LanguageModel
from mecheval.tasks.batch import Batch


@torch.no_grad()
def naive_interchange(
    model: LanguageModel,
    original: Batch,
    corrupted: Batch,
    sites: Sequence[str] | None = None,
    roles: Sequence[str] | None = None,
) -> InterchangeResult:
    """The plain reference: one forward per (site, role, document) through :func:`patch`."""
    sites, roles, original, corrupted = prepare(model, original, corrupted, sites, roles)
    candidates, metrics = original.candidates, batch_metrics(original)
    s_orig = score_rows(model(original.tokens, at=original.query), original.answer, candidates)
    s_corr = score_rows(model(corrupted.tokens, at=corrupted.query), original.answer, candidates)
    rows = baseline_rows(s_orig, s_corr, metrics)
    per_example = []
    for site in sites:
        for role in roles:
            restored = []
            for b in range(len(original)):
                one_o, one_c = original.select(slice(b, b + 1)), corrupted.select(slice(b, b + 1))
                with record(model, [site]) as source:
                    model(one_o.tokens, at=one_o.query)
                value = source[site][0, one_o.roles[role][0]][None]
                with patch(model, site, one_c.roles[role], value):
                    logits = model(one_c.tokens, at=one_c.query)
                    one = score_rows(logits, one_o.answer, one_o.candidates)[:, 0]
                restored.append(one.tolist())
                per_example.append(
                    (b, site, role, one[0].item(), s_orig[0, b].item(), s_corr[0, b].item())
                )
            for m, metric in enumerate(metrics):
                values = [r[m] for r in restored]
                rows.append(("restored", site, role, metric, sum(values) / len(values)))
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    examples = pd.DataFrame(per_example, columns=PER_EXAMPLE_COLUMNS)
    return InterchangeResult(table, examples)
