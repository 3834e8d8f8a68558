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
key, before any mixing) are not run at all: their result is the corrupted result. A block's
output is the next block's input: the second of the two sites takes the first's results.

Nothing before the patch position is recomputed either (interventions/prefix.py): a patch at
position p leaves positions < p as the corrupted run had them, so the blocks after the
patched one (and a patched block boundary's own block) run on positions p.. only, each
mixer resumed from its prefix in the corrupted run (``Mixer.prefix``: a recurrent state,
attention's keys and values; a mixer without one recomputes its window).
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
    example_rows,
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


def _boundary(model: LanguageModel, site: str) -> str:
    """The name a block boundary's site has as the next block's input: ``layers.{i}.output``
    is ``layers.{i+1}.input`` (the last block's, ``final_norm.input``), one tensor, so a patch
    at either runs the same forward; any other site is its own."""
    split = split_layer(site)
    if split is None or split[1] != "output":
        return site
    following = int(split[0]) + 1
    return layer_site(following, "input") if following < len(model.layers) else FINAL_NORM_INPUT


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


@dataclass(frozen=True)
class _SitePatch:
    """What every way of running a chunk of patched rows at one site reads: the model, the
    corrupted run's cached sites and prefix, and where the patched forward starts
    (:func:`_restart`)."""

    model: LanguageModel
    site: str
    base: dict[str, torch.Tensor]
    prefix: PrefixCache | None
    tokens: torch.Tensor
    start: str
    first: int
    tail: bool


#: A way to run a chunk of patched rows: (patch, documents, patch positions, patched values,
#: query positions) -> logits at the queries.
ChunkStrategy = Callable[
    [_SitePatch, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]


def _patched_boundary(sp: _SitePatch, docs, dst, values) -> torch.Tensor:
    x = sp.base[sp.start][docs].clone()
    x[torch.arange(len(docs), device=x.device), dst] = values
    return x


def patch_boundary_and_resume(sp: _SitePatch, docs, dst, values, at) -> torch.Tensor:
    """At a block boundary: patch the cached tensor, run each later block from the patch
    position on."""
    x = _patched_boundary(sp, docs, dst, values)
    return run_from_patch(sp.model, sp.prefix, sp.first, docs, dst, x, at)


def patch_boundary_and_recompute(sp: _SitePatch, docs, dst, values, at) -> torch.Tensor:
    """At a block boundary: patch the cached tensor, run the later blocks on whole
    sequences."""
    x = _patched_boundary(sp, docs, dst, values)
    return _downstream(sp.model, x, sp.first, at, sp.tail)


def resume_block(sp: _SitePatch, docs, dst, values, at) -> torch.Tensor:
    """Inside a block: resume that block from its prefix with the site patched."""
    patched = (sp.site, dst, values)
    return resume_inside_block(sp.model, sp.prefix, sp.first, docs, patched, at, sp.tail)


def hook_block_and_recompute(sp: _SitePatch, docs, dst, values, at) -> torch.Tensor:
    """Inside a block: a hook patches the site, the block and the later ones run on whole
    sequences from the cached block input."""
    with patch(sp.model, sp.site, dst, values):
        return _downstream(sp.model, sp.base[sp.start][docs], sp.first, at, sp.tail)


def hook_whole_model(sp: _SitePatch, docs, dst, values, at) -> torch.Tensor:
    """Outside any block (the embedding): a hook patches the site, the whole model runs."""
    with patch(sp.model, sp.site, dst, values):
        return sp.model(sp.tokens[docs], at=at)


def chunk_strategy(start: str, direct: bool, resume: bool) -> ChunkStrategy:
    """How a site's patched rows run, from where :func:`_restart` starts them."""
    if direct:
        return patch_boundary_and_resume if resume else patch_boundary_and_recompute
    if start:
        return resume_block if resume else hook_block_and_recompute
    return hook_whole_model


@dataclass(frozen=True)
class CleanRuns:
    """What every restore of a pair starts from: the original run's sites to patch from (and
    its block inputs where a state site needs them), the corrupted run's sites to patch and
    restart from, both runs' scores and the corrupted run's prefix (None: ``resume=False``
    without a state site). Kept, the restores of more roles at these sites (the null's,
    interventions/null.py) start from them too, without running the pair again."""

    sites: tuple[str, ...]
    source: dict[str, torch.Tensor]
    base: dict[str, torch.Tensor]
    s_orig: torch.Tensor
    s_corr: torch.Tensor
    prefix: PrefixCache | None


@torch.no_grad()
def clean_runs(
    model: LanguageModel,
    original: Batch,
    corrupted: Batch,
    sites: Sequence[str] | None = None,
    resume: bool = True,
) -> CleanRuns:
    """The pair's :class:`CleanRuns` for restores at ``sites`` (default: every module site)."""
    sites, _, original, corrupted = prepare(model, original, corrupted, sites, [])
    _check_state_sites(model, sites)
    state_sites = set(state_site_names(model))
    module_sites = [site for site in sites if site not in state_sites]
    restarts = {site: _restart(model, site) for site in module_sites}
    with_states = len(module_sites) < len(sites)
    source, base, s_orig, s_corr = _clean_runs(
        model, original, corrupted, module_sites, restarts, with_states
    )
    prefix = None
    if resume or with_states:
        prefix = prefix_cache(model, [base[site] for site in _block_inputs(model)])
    return CleanRuns(tuple(sites), source, base, s_orig, s_corr, prefix)


@torch.no_grad()
def interchange(
    model: LanguageModel,
    original: Batch,
    corrupted: Batch,
    sites: Sequence[str] | None = None,
    roles: Sequence[str] | None = None,
    max_batch: int = 4096,
    resume: bool = True,
    runs: CleanRuns | None = None,
) -> InterchangeResult:
    """Restore each (site, role) from ``original`` into ``corrupted``; see the module doc.
    ``resume=False`` recomputes whole sequences downstream of the patch (the engine before
    prefix resumption; benchmarks/bench_interventions.py compares the two). ``runs``: the
    pair's :func:`clean_runs` made before, at these sites or more (with the same ``resume``)."""
    sites, roles, original, corrupted = prepare(model, original, corrupted, sites, roles)
    if runs is None:
        runs = clean_runs(model, original, corrupted, sites, resume)
    elif missing := [site for site in sites if site not in runs.sites]:
        raise ValueError(f"runs: made for sites {list(runs.sites)}, not {missing}")
    n = len(original)
    metrics = batch_metrics(original)
    state_sites = set(state_site_names(model))
    rows = baseline_rows(runs.s_orig, runs.s_corr, metrics)
    chunk = _chunk_rows(model, max_batch)
    per_example = []
    positions = _row_positions(original, corrupted, roles)
    batch = _Rows(positions, original, corrupted, runs.s_corr, chunk)
    restored: dict[str, torch.Tensor] = {}  # by the block boundary a site is read at
    for site in sites if roles else []:
        boundary = _boundary(model, site)
        if site in state_sites:
            layer = state_site_layer(site)
            scores = _restore_states(model, layer, runs.source, runs.prefix, batch)
        elif boundary in restored:
            scores = restored[boundary]
        else:
            start, first, direct = _restart(model, site)
            tail = not _in_last_block_tail(model, site)
            sp = _SitePatch(
                model, site, runs.base, runs.prefix, corrupted.tokens, start, first, tail
            )
            strategy = chunk_strategy(start, direct, resume)
            scores = _restore_site(sp, strategy, runs.source[site], batch)
            restored[boundary] = scores
        _collect(site, scores, metrics, roles, n, runs.s_orig, runs.s_corr, rows, per_example)
    return assemble(rows, per_example)


def _row_positions(original: Batch, corrupted: Batch, roles: Sequence[str]) -> tuple:
    """(document, source position, patched position) of each row of the stacked batch: row
    k*n + b is document b patched at role k."""
    docs = torch.arange(len(original), device=original.tokens.device)
    src_pos = torch.cat([original.roles[r] for r in roles]) if roles else docs[:0]
    dst_pos = torch.cat([corrupted.roles[r] for r in roles]) if roles else docs[:0]
    return docs.repeat(len(roles)), src_pos, dst_pos


def _block_inputs(model: LanguageModel) -> list[str]:
    return [layer_site(j, "input") for j in range(len(model.layers))]


def _clean_runs(
    model: LanguageModel,
    original: Batch,
    corrupted: Batch,
    module_sites: list[str],
    restarts: dict[str, tuple[str, int, bool]],
    with_states: bool,
) -> tuple[dict, dict, torch.Tensor, torch.Tensor]:
    """The original run's sites to patch from (and its block inputs where a state site
    needs them), the corrupted run's sites to patch and restart from, and both runs'
    scores."""
    inputs = _block_inputs(model)
    cached = sorted(set(module_sites) | set(inputs) | {s for s, _, _ in restarts.values() if s})
    # A state site patches the source run's state, computed from its block inputs.
    recorded = sorted(set(module_sites) | (set(inputs) if with_states else set()))
    answer, candidates = original.answer, original.candidates
    with record(model, recorded) as source:
        s_orig = score_rows(model(original.tokens, at=original.query), answer, candidates)
    with record(model, cached) as base:
        s_corr = score_rows(model(corrupted.tokens, at=corrupted.query), answer, candidates)
    return source, base, s_orig, s_corr


@dataclass(frozen=True)
class _Rows:
    """The stacked batch of patched rows: each row's (document, source position, patched
    position), the batches they come from, the corrupted run's scores (a row the patch cannot
    change keeps its document's) and the most rows a chunk runs at once."""

    positions: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    original: Batch
    corrupted: Batch
    s_corr: torch.Tensor
    max_batch: int


def _restore_site(
    sp: _SitePatch, strategy: ChunkStrategy, source: torch.Tensor, batch: _Rows
) -> torch.Tensor:
    """Scores [metrics, rows] of a module site: each row's corrupted position takes the
    source run's ``source`` at the row's source position; chunks of rows run by ``strategy``."""
    doc_of_row, src_pos, dst_pos = batch.positions
    values = source[doc_of_row, src_pos]
    # Where the source equals what the corrupted run already has (e.g. every position but
    # the key before any mixing), the patched run *is* the corrupted run; so it is where the
    # patch cannot reach the query: a later position, or another position after the last
    # mixing step (what follows it is per position).
    scores = batch.s_corr[:, doc_of_row].clone()
    todo = (values != sp.base[sp.site][doc_of_row, dst_pos]).flatten(1).any(1)
    query_of_row = batch.corrupted.query[doc_of_row]
    if _past_last_mixer(sp.model, sp.site):
        reaches = dst_pos == query_of_row
    else:
        reaches = dst_pos <= query_of_row
    todo = (todo & reaches).nonzero()[:, 0]
    # In order of patch position: a chunk then holds few distinct positions, and the rows of
    # one position run as one batch.
    todo = todo[dst_pos[todo].argsort(stable=True)]
    for lo in range(0, len(todo), batch.max_batch):
        rows = todo[lo : lo + batch.max_batch]
        docs = doc_of_row[rows]
        logits = strategy(sp, docs, dst_pos[rows], values[rows], batch.corrupted.query[docs])
        scores[:, rows] = _score(logits, batch.original, docs)
    return scores


def _score(logits: torch.Tensor, original: Batch, docs: torch.Tensor) -> torch.Tensor:
    candidates = None if original.candidates is None else original.candidates[docs]
    return score_rows(logits, original.answer[docs], candidates)


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
        per_example.append(example_rows(site, role, by_role[0, k], s_orig, s_corr))


def _restore_states(
    model: LanguageModel,
    layer: int,
    source: dict[str, torch.Tensor],
    prefix: PrefixCache,
    batch: _Rows,
) -> torch.Tensor:
    """Scores [metrics, rows] of the state site of block ``layer``: in each row the mixer's
    state after the row's corrupted position is the source run's after its position; block
    ``layer`` resumes from there with that state (its output at the position reads it), the
    blocks after it from the position (:func:`run_from`)."""
    doc_of_row, src_pos, dst_pos = batch.positions
    block = model.layers[layer]
    source_prefix = block.mixer.prefix(block.mixer_norm(source[layer_site(layer, "input")]))
    values = source_prefix.after(doc_of_row, src_pos)
    at = batch.corrupted.query[doc_of_row]
    scores = batch.s_corr[:, doc_of_row].clone()
    # Equal states (every position before the key) and states after the query change nothing.
    own = prefix.block_prefix(model, layer)
    corrupted_states = own.after(doc_of_row, dst_pos)
    pairs = zip(_parts(values), _parts(corrupted_states), strict=True)
    same = torch.stack([(a == b).flatten(1).all(1) for a, b in pairs]).all(0)
    todo = (~same & (dst_pos <= at)).nonzero()[:, 0]
    todo = todo[dst_pos[todo].argsort(stable=True)]
    for lo_row in range(0, len(todo), batch.max_batch):
        chunk = todo[lo_row : lo_row + batch.max_batch]
        for start in dst_pos[chunk].unique().tolist():
            rows_ = chunk[dst_pos[chunk] == start]
            docs_ = doc_of_row[rows_]
            lo = max(0, start - own.halo)
            window = prefix.inputs[layer][docs_, lo:]
            x = block.forward_from(window, start - lo, index_states(values, rows_), replace=True)
            logits = run_from(model, prefix, layer + 1, docs_, start, x, at[rows_])
            scores[:, rows_] = _score(logits, batch.original, docs_)
    return scores


def _parts(states: torch.Tensor | tuple) -> tuple[torch.Tensor, ...]:
    return states if isinstance(states, tuple) else (states,)


def _check_state_sites(model: LanguageModel, sites: Sequence[str]) -> None:
    known = state_site_names(model) + site_names(model)
    for site in sites:
        if state_site_layer(site) is not None and site not in known:
            have = ", ".join(known) or "none: no mixer of this model has a recurrent state"
            raise ValueError(f"sites: {site!r} is not a state site of this model ({have})")
