"""The batched interchange-intervention engine (paper §3; docs/architecture.md, "Mechanistic
metric").

For an original document o and its key-corrupted counterfactual c (same length, same role
positions): run the model on c, overwrite site s at position r(c) with site s at r(o) from
the run on o, let it propagate, and read p(answer) at the query.

Batching: one clean forward on o (and one on c) caches every site at once; then, per site,
all roles × all documents go through together as one stacked batch (chunked to
``max_batch`` rows, fewer where the vocabulary is large: :data:`LOGITS_PER_CHUNK`), each
row patched at its own position with its own source value.
Nothing upstream of the patch is recomputed: at a block boundary (``layers.{i}.input`` /
``layers.{i}.output``, ``final_norm.input``) the cached corrupted tensor is patched directly
and only what follows runs; a site inside block i restarts from the cached corrupted input
of block i. Rows whose source activation equals the corrupted one (every position but the
key, before any mixing) are not run at all: their result is the corrupted result.

Nothing before the patch position is recomputed either (interventions/prefix.py): a patch at
position p leaves positions < p as the corrupted run had them, so the blocks after the
patched one (and a patched block boundary's own block) run on positions p.. only, each
mixer resumed from its prefix state in the corrupted run (``Mixer.prefix_states``: a
recurrent state, attention's keys and values; a mixer without one recomputes its window).
Rows that share a patch position run together.

``InterchangeResult.table`` is tidy, one row per value::

    condition   original | corrupted | restored
    site        "" for original / corrupted, else the patched site
    role        "" for original / corrupted, else the patched role
    metric      one of RESTORE_METRICS: likelihood (mean p(answer)) | accuracy (mean
                argmax == answer) | in_context_mass (mean p summed over the document's
                answer candidates) | in_context_accuracy (mean argmax among them), scored
                by tasks/scores.py in float64; the in-context two only where the original
                batch has candidates (every document from a dataset has)
    value       float

``per_example`` holds one row per (document, site, role) with the restored likelihood, next
to that document's original and corrupted likelihoods; ``attribution`` names, per document
and site, the role that restores most.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mecheval.interventions.patch import patch, record
from mecheval.interventions.prefix import (
    PrefixCache,
    prefix_cache,
    resume_inside_block,
    run_from,
    run_from_patch,
)
from mecheval.interventions.result import (
    InterchangeResult,
    assemble,
    baseline_rows,
    batch_metrics,
    example_frame,
    prepare,
    score_rows,
)
from mecheval.models.backbone import LanguageModel
from mecheval.models.mixers.base import index_states
from mecheval.models.sites import (
    FINAL_NORM_INPUT,
    layer_site,
    site_names,
    split_layer,
    state_site_layer,
    state_site_names,
)
from mecheval.tasks.batch import Batch

#: The most logits one chunk of patched rows may hold (rows x vocabulary, float32: 8 MB).
#: Within it, the buffers of the head and the scoring are reused from call to call; at the
#: paper's 8,192-token vocabulary a chunk of ``max_batch`` rows was a fresh allocation of
#: over 100 MB per chunk. A smaller vocabulary keeps ``max_batch``.
LOGITS_PER_CHUNK = 1 << 21


def _chunk_rows(model: LanguageModel, max_batch: int) -> int:
    return max(1, min(max_batch, LOGITS_PER_CHUNK // model.embedding.num_embeddings))


def _restart(model: LanguageModel, site: str) -> tuple[str, int, bool]:
    """Where a patched forward can start from the cached corrupted run.

    Returns (cached site to start from, first layer to run, whether the patch is applied to
    that cached tensor directly). Everything upstream of the restart point is identical to
    the corrupted run, so it is not recomputed.
    """
    if site == FINAL_NORM_INPUT:
        return site, len(model.layers), True
    split = split_layer(site)
    if split is None:
        return "", 0, False  # not inside a block: run the whole model with a hook
    layer, rest = int(split[0]), split[1]
    if rest == "input":
        return site, layer, True
    if rest == "output":
        return site, layer + 1, True
    return layer_site(layer, "input"), layer, False


def _downstream(
    model: LanguageModel, x: torch.Tensor, first: int, at: torch.Tensor, query_only_tail: bool
):
    """Run layers ``first``.. and the head. With ``query_only_tail`` the last block's MLP
    runs at the query alone (nothing after it looks at other positions)."""
    layers = model.layers[first:]
    for layer in layers[:-1] if query_only_tail else layers:
        x = layer(x)
    if query_only_tail and len(layers):
        x = layers[-1](x, at=at)
        at = torch.zeros_like(at)
    return model.head(x, at)


def _past_last_mixer(model: LanguageModel, site: str) -> bool:
    """Whether ``site`` comes after the last block's mixer: a patch there changes its own
    position only, up to the head."""
    last = len(model.layers) - 1
    return _in_last_block_tail(model, site) or site == layer_site(last, "mixer.output")


def _in_last_block_tail(model: LanguageModel, site: str) -> bool:
    last = len(model.layers) - 1
    return site.startswith((layer_site(last, "mlp"), layer_site(last, "output"))) or (
        site == FINAL_NORM_INPUT
    )


@torch.no_grad()
def interchange(
    model: LanguageModel,
    original: Batch,
    corrupted: Batch,
    sites: Sequence[str] | None = None,
    roles: Sequence[str] | None = None,
    max_batch: int = 4096,
    resume: bool = True,
) -> InterchangeResult:
    """Restore each (site, role) from ``original`` into ``corrupted``; see the module doc.
    ``resume=False`` recomputes whole sequences downstream of the patch (the engine before
    prefix resumption; benchmarks/bench_interventions.py compares the two)."""
    sites, roles, original, corrupted = prepare(model, original, corrupted, sites, roles)
    _check_state_sites(model, sites)
    device = model.device
    n = len(original)
    answer, candidates, metrics = original.answer, original.candidates, batch_metrics(original)
    state_sites = set(state_site_names(model))
    module_sites = [site for site in sites if site not in state_sites]
    restarts = {site: _restart(model, site) for site in module_sites}
    inputs = [layer_site(j, "input") for j in range(len(model.layers))]
    cached = sorted(set(module_sites) | set(inputs) | {s for s, _, _ in restarts.values() if s})
    # A state site patches the source run's state, computed from its block inputs.
    with_states = len(module_sites) < len(sites)
    recorded = sorted(set(module_sites) | (set(inputs) if with_states else set()))
    with record(model, recorded) as source:
        s_orig = score_rows(model(original.tokens, at=original.query), answer, candidates)
    with record(model, cached) as base:
        s_corr = score_rows(model(corrupted.tokens, at=corrupted.query), answer, candidates)

    rows = baseline_rows(s_orig, s_corr, metrics)
    prefix = None
    if resume or with_states:
        prefix = prefix_cache(model, [base[site] for site in inputs])
    docs = torch.arange(n, device=device)
    chunk = _chunk_rows(model, max_batch)
    per_example = []
    if not roles:
        sites = []
    # Row k*n + b of the stacked batch is document b patched at role k.
    src_pos = torch.cat([original.roles[r] for r in roles]) if roles else docs[:0]
    dst_pos = torch.cat([corrupted.roles[r] for r in roles]) if roles else docs[:0]
    doc_of_row = docs.repeat(len(roles))
    for site in sites:
        if site in state_sites:
            state_layer = state_site_layer(site)
            positions = (doc_of_row, src_pos, dst_pos)
            scores = _restore_states(
                model,
                state_layer,
                source,
                prefix,
                positions,
                original,
                corrupted,
                s_corr,
                chunk,
            )
            _collect(site, scores, metrics, roles, n, s_orig, s_corr, rows, per_example)
            continue
        values = source[site][doc_of_row, src_pos]
        # Where the source equals what the corrupted run already has (e.g. every position
        # but the key before any mixing), the patched run *is* the corrupted run; so it is
        # where the patch cannot reach the query: a later position, or another position
        # after the last mixing step (what follows it is per position).
        scores = s_corr[:, doc_of_row].clone()
        todo = (values != base[site][doc_of_row, dst_pos]).flatten(1).any(1)
        query_of_row = corrupted.query[doc_of_row]
        reaches = (
            dst_pos == query_of_row if _past_last_mixer(model, site) else dst_pos <= query_of_row
        )
        todo = (todo & reaches).nonzero()[:, 0]
        # In order of patch position: a chunk then holds few distinct positions, and the
        # rows of one position run as one batch.
        todo = todo[dst_pos[todo].argsort(stable=True)]
        start, first, direct = restarts[site]
        tail = not _in_last_block_tail(model, site)
        for lo in range(0, len(todo), chunk):
            rows_ = todo[lo : lo + chunk]
            docs_, dst_, at_ = doc_of_row[rows_], dst_pos[rows_], corrupted.query[doc_of_row[rows_]]
            if direct:
                x = base[start][docs_].clone()
                x[torch.arange(len(rows_), device=device), dst_] = values[rows_]
                if resume:
                    logits = run_from_patch(model, prefix, first, docs_, dst_, x, at_)
                else:
                    logits = _downstream(model, x, first, at_, tail)
            elif resume and start:
                patched = (site, dst_, values[rows_])
                logits = resume_inside_block(model, prefix, first, docs_, patched, at_, tail)
            elif start:
                with patch(model, site, dst_, values[rows_]):
                    logits = _downstream(model, base[start][docs_], first, at_, tail)
            else:
                with patch(model, site, dst_, values[rows_]):
                    logits = model(corrupted.tokens[docs_], at=at_)
            scores[:, rows_] = score_rows(
                logits, answer[docs_], None if candidates is None else candidates[docs_]
            )
        _collect(site, scores, metrics, roles, n, s_orig, s_corr, rows, per_example)
    return assemble(rows, per_example)


def _collect(
    site: str,
    scores: torch.Tensor,
    metrics: Sequence[str],
    roles: Sequence[str],
    n: int,
    s_orig: torch.Tensor,
    s_corr: torch.Tensor,
    rows: list,
    per_example: list,
) -> None:
    """Append a site's restored scores [metrics, roles x n] to the table rows and the
    per-example frames."""
    by_role = scores.view(len(metrics), len(roles), n).cpu()
    for k, role in enumerate(roles):
        for m, metric in enumerate(metrics):
            rows.append(("restored", site, role, metric, by_role[m, k].mean().item()))
        per_example.append(example_frame(site, role, by_role[0, k], s_orig, s_corr))


def _restore_states(
    model: LanguageModel,
    layer: int,
    source: dict[str, torch.Tensor],
    prefix: PrefixCache,
    positions: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    original: Batch,
    corrupted: Batch,
    s_corr: torch.Tensor,
    max_batch: int,
) -> torch.Tensor:
    """Scores [metrics, rows] of the state site of block ``layer``: in each row the mixer's
    state after the row's corrupted position is the source run's after its position; block
    ``layer`` resumes from there with that state (its output at the position reads it), the
    blocks after it from the position (:func:`run_from`)."""
    doc_of_row, src_pos, dst_pos = positions
    block = model.layers[layer]
    mixer = block.mixer
    source_states = mixer.states_of(block.mixer_norm(source[layer_site(layer, "input")]))
    values = index_states(source_states, doc_of_row, src_pos)
    at = corrupted.query[doc_of_row]
    scores = s_corr[:, doc_of_row].clone()
    # Equal states (every position before the key) and states after the query change nothing.
    own_states = prefix.states[layer]
    if own_states is None:  # over the resuming budget; the state site needs them all the same
        own_states = mixer.states_of(block.mixer_norm(prefix.inputs[layer]))
    corrupted_states = index_states(own_states, doc_of_row, dst_pos)
    pairs = zip(_parts(values), _parts(corrupted_states), strict=True)
    same = torch.stack([(a == b).flatten(1).all(1) for a, b in pairs]).all(0)
    todo = (~same & (dst_pos <= at)).nonzero()[:, 0]
    todo = todo[dst_pos[todo].argsort(stable=True)]
    halo = mixer.halo() or 0
    answer, candidates = original.answer, original.candidates
    for lo_row in range(0, len(todo), max_batch):
        chunk = todo[lo_row : lo_row + max_batch]
        for start in dst_pos[chunk].unique().tolist():
            rows_ = chunk[dst_pos[chunk] == start]
            docs_ = doc_of_row[rows_]
            lo = max(0, start - halo)
            window = prefix.inputs[layer][docs_, lo:]
            x = block.forward_from(window, start - lo, index_states(values, rows_), replace=True)
            logits = run_from(model, prefix, layer + 1, docs_, start, x, at[rows_])
            scores[:, rows_] = score_rows(
                logits, answer[docs_], None if candidates is None else candidates[docs_]
            )
    return scores


def _parts(states: torch.Tensor | tuple) -> tuple[torch.Tensor, ...]:
    return states if isinstance(states, tuple) else (states,)


def _check_state_sites(model: LanguageModel, sites: Sequence[str]) -> None:
    known = state_site_names(model) + site_names(model)
    for site in sites:
        if state_site_layer(site) is not None and site not in known:
            have = ", ".join(known) or "none: no mixer of this model has a recurrent state"
            raise ValueError(f"sites: {site!r} is not a state site of this model ({have})")
