"""The naive interchange: one forward per (site, role, document) through :func:`patch`, the
plain reference the batched engine (interventions/engine.py) is tested against. What the two
share (columns, scoring, the result) is read as ``common.<name>`` from result.py."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch

from mecheval.interventions import result as common
from mecheval.interventions.patch import patch, record
from mecheval.models.backbone import LanguageModel
from mecheval.tasks.batch import Batch


@torch.no_grad()
def naive_interchange(
    model: LanguageModel,
    original: Batch,
    corrupted: Batch,
    sites: Sequence[str] | None = None,
    roles: Sequence[str] | None = None,
) -> common.InterchangeResult:
    """The plain reference: one forward per (site, role, document) through :func:`patch`."""
    sites, roles, original, corrupted = common.prepare(model, original, corrupted, sites, roles)
    candidates, metrics = original.candidates, common.batch_metrics(original)
    answer = original.answer
    s_orig = common.score_rows(model(original.tokens, at=original.query), answer, candidates)
    s_corr = common.score_rows(model(corrupted.tokens, at=corrupted.query), answer, candidates)
    rows = common.baseline_rows(s_orig, s_corr, metrics)
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
                    one = common.score_rows(logits, one_o.answer, one_o.candidates)[:, 0]
                restored.append(one.tolist())
                per_example.append(
                    (b, site, role, one[0].item(), s_orig[0, b].item(), s_corr[0, b].item())
                )
            for m, metric in enumerate(metrics):
                values = [r[m] for r in restored]
                rows.append(("restored", site, role, metric, sum(values) / len(values)))
    table = pd.DataFrame(rows, columns=common.TABLE_COLUMNS)
    examples = pd.DataFrame(per_example, columns=common.PER_EXAMPLE_COLUMNS)
    return common.InterchangeResult(table, examples)
