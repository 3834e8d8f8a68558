"""The batched interchange-intervention engine (paper §3, DESIGN.md "Mechanistic metric").

For an original document o and its key-corrupted counterfactual c (same length, same role
positions): run the model on c, overwrite site s at position r(c) with site s at r(o) from
the run on o, let it propagate, and read p(answer) at the query.

Batching: one clean forward on o (and one on c) caches every site at once; then, per site,
all roles × all documents go through together as one stacked batch (chunked to
``max_batch`` rows), each row patched at its own position with its own source value. At a
block boundary (``layers.{i}.input`` / ``layers.{i}.output``) the cached corrupted residual
stream is patched directly and only the layers downstream are recomputed.

``InterchangeResult.table`` is tidy, one row per value::

    condition   original | corrupted | restored
    site        "" for original / corrupted, else the patched site
    role        "" for original / corrupted, else the patched role
    metric      likelihood (mean p(answer)) | accuracy (mean argmax == answer)
    value       float

``per_example`` holds one row per (document, site, role) with the restored likelihood, next
to that document's original and corrupted likelihoods; ``attribution`` names, per document
and site, the role that restores most.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch

from mecheval.interventions.patch import patch, record
from mecheval.models.backbone import LanguageModel
from mecheval.models.sites import site_names
from mecheval.tasks.batch import ROLES, Batch

_BLOCK_SITE = re.compile(r"^layers\.(\d+)\.(input|output)$")


@dataclass(frozen=True)
class InterchangeResult:
    table: pd.DataFrame
    per_example: pd.DataFrame

    @property
    def attribution(self) -> pd.DataFrame:
        """Per document and site: the role whose restore gives the highest likelihood."""
        best = self.per_example.loc[
            self.per_example.groupby(["doc", "site"])["restored"].idxmax()
        ]
        return best[["doc", "site", "role", "restored"]].reset_index(drop=True)

    def value(self, condition: str, metric: str = "likelihood", site: str = "", role: str = ""):
        rows = self.table[
            (self.table.condition == condition)
            & (self.table.metric == metric)
            & (self.table.site == site)
            & (self.table.role == role)
        ]
        if len(rows) != 1:
            raise KeyError(f"no single value for {condition}/{metric}/{site}/{role}")
        return float(rows.value.iloc[0])


def answer_scores(logits: torch.Tensor, answer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(p(answer), argmax == answer) per row, from logits [N, V] at the query."""
    probs = torch.softmax(logits.float(), dim=-1)
    likelihood = probs.gather(1, answer[:, None])[:, 0]
    return likelihood, (probs.argmax(-1) == answer).float()


def _resume_from(model: LanguageModel, site: str) -> int | None:
    """The first layer to recompute when ``site`` is a block boundary, else None."""
    match = _BLOCK_SITE.match(site)
    if match is None:
        return None
    layer = int(match.group(1))
    return layer if match.group(2) == "input" else layer + 1


def _downstream(model: LanguageModel, x: torch.Tensor, first: int, at: torch.Tensor):
    for layer in model.layers[first:]:
        x = layer(x)
    return model.head(x, at)


@torch.no_grad()
def interchange(
    model: LanguageModel,
    original: Batch,
    corrupted: Batch,
    sites: Sequence[str] | None = None,
    roles: Sequence[str] | None = None,
    max_batch: int = 4096,
) -> InterchangeResult:
    """Restore each (site, role) from ``original`` into ``corrupted``; see the module doc."""
    sites = list(sites) if sites is not None else site_names(model)
    roles = list(roles) if roles is not None else list(ROLES)
    _check(original, corrupted, roles)
    n = len(original)
    answer = original.answer
    with record(model, sites) as source:
        p_orig, acc_orig = answer_scores(model(original.tokens, at=original.query), answer)
    with record(model, sites) as base:
        p_corr, acc_corr = answer_scores(model(corrupted.tokens, at=corrupted.query), answer)

    rows = [
        ("original", "", "", "likelihood", p_orig.mean().item()),
        ("original", "", "", "accuracy", acc_orig.mean().item()),
        ("corrupted", "", "", "likelihood", p_corr.mean().item()),
        ("corrupted", "", "", "accuracy", acc_corr.mean().item()),
    ]
    docs = torch.arange(n)
    per_example = []
    if not roles:
        sites = []
    # Row k*n + b of the stacked batch is document b patched at role k.
    src_pos = torch.cat([original.roles[r] for r in roles]) if roles else docs[:0]
    dst_pos = torch.cat([corrupted.roles[r] for r in roles]) if roles else docs[:0]
    doc_of_row = docs.repeat(len(roles))
    tokens = corrupted.tokens[doc_of_row]
    at = corrupted.query[doc_of_row]
    target = answer[doc_of_row]
    for site in sites:
        values = source[site][doc_of_row, src_pos]
        first = _resume_from(model, site)
        likelihood, accuracy = [], []
        for lo in range(0, len(doc_of_row), max_batch):
            chunk = slice(lo, lo + max_batch)
            if first is not None:
                x = base[site][doc_of_row[chunk]].clone()
                x[torch.arange(x.shape[0]), dst_pos[chunk]] = values[chunk]
                logits = _downstream(model, x, first, at[chunk])
            else:
                with patch(model, site, dst_pos[chunk], values[chunk]):
                    logits = model(tokens[chunk], at=at[chunk])
            p, a = answer_scores(logits, target[chunk])
            likelihood.append(p)
            accuracy.append(a)
        p_all = torch.cat(likelihood).view(len(roles), n)
        a_all = torch.cat(accuracy).view(len(roles), n)
        for k, role in enumerate(roles):
            rows.append(("restored", site, role, "likelihood", p_all[k].mean().item()))
            rows.append(("restored", site, role, "accuracy", a_all[k].mean().item()))
            per_example.append(
                pd.DataFrame(
                    {
                        "doc": docs.numpy(),
                        "site": site,
                        "role": role,
                        "restored": p_all[k].numpy(),
                        "original": p_orig.numpy(),
                        "corrupted": p_corr.numpy(),
                    }
                )
            )
    table = pd.DataFrame(rows, columns=["condition", "site", "role", "metric", "value"])
    examples = (
        pd.concat(per_example, ignore_index=True)
        if per_example
        else pd.DataFrame(columns=["doc", "site", "role", "restored", "original", "corrupted"])
    )
    return InterchangeResult(table, examples)


@torch.no_grad()
def naive_interchange(
    model: LanguageModel,
    original: Batch,
    corrupted: Batch,
    sites: Sequence[str] | None = None,
    roles: Sequence[str] | None = None,
) -> InterchangeResult:
    """The plain reference: one forward per (site, role, document) through :func:`patch`."""
    sites = list(sites) if sites is not None else site_names(model)
    roles = list(roles) if roles is not None else list(ROLES)
    _check(original, corrupted, roles)
    p_orig, acc_orig = answer_scores(model(original.tokens, at=original.query), original.answer)
    p_corr, acc_corr = answer_scores(model(corrupted.tokens, at=corrupted.query), original.answer)
    rows = [
        ("original", "", "", "likelihood", p_orig.mean().item()),
        ("original", "", "", "accuracy", acc_orig.mean().item()),
        ("corrupted", "", "", "likelihood", p_corr.mean().item()),
        ("corrupted", "", "", "accuracy", acc_corr.mean().item()),
    ]
    per_example = []
    for site in sites:
        for role in roles:
            ps, accs = [], []
            for b in range(len(original)):
                one_o, one_c = original.select(slice(b, b + 1)), corrupted.select(slice(b, b + 1))
                with record(model, [site]) as source:
                    model(one_o.tokens, at=one_o.query)
                value = source[site][0, one_o.roles[role][0]][None]
                with patch(model, site, one_c.roles[role], value):
                    p, a = answer_scores(model(one_c.tokens, at=one_c.query), one_o.answer)
                ps.append(p.item())
                accs.append(a.item())
                per_example.append((b, site, role, p.item(), p_orig[b].item(), p_corr[b].item()))
            rows.append(("restored", site, role, "likelihood", sum(ps) / len(ps)))
            rows.append(("restored", site, role, "accuracy", sum(accs) / len(accs)))
    table = pd.DataFrame(rows, columns=["condition", "site", "role", "metric", "value"])
    examples = pd.DataFrame(
        per_example, columns=["doc", "site", "role", "restored", "original", "corrupted"]
    )
    return InterchangeResult(table, examples)


def _check(original: Batch, corrupted: Batch, roles: Sequence[str]) -> None:
    if original.tokens.shape != corrupted.tokens.shape:
        raise ValueError(
            f"corrupted: shape {tuple(corrupted.tokens.shape)} differs from the original's "
            f"{tuple(original.tokens.shape)}"
        )
    for role in roles:
        if role not in original.roles or role not in corrupted.roles:
            raise ValueError(f"roles: {role!r} is not a role of these batches ({', '.join(ROLES)})")
