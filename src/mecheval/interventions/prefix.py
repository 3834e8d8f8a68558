"""Running a patched row from its patch position on: a patch at position p leaves
every position before p as the corrupted run computed it, in every layer. So the corrupted
run's block inputs and each mixer's prefix (``Mixer.prefix``: a recurrence's state after
every position, attention's keys and values) are computed once, and a patched row runs each
later block on positions p.. only, resuming its mixer from the state carried into p
(``Prefix.initial_state``). A mixer that keeps no prefix (the ``Mixer`` defaults, e.g. a
plugin) recomputes its whole window, and the block's per-position parts (norms, MLP) still
run on p.. only; so does a mixer that keeps states but declares recomputing faster
(``Mixer.resume_from_prefix``). The engine's patched rows run so through
:func:`run_from_patch` (patched at a block boundary) and :func:`resume_inside_block` (at a
site inside a block), rows that resume at the same position as one batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mecheval.interventions.patch import patch
from mecheval.models.backbone import LanguageModel
from mecheval.models.mixers.base import Prefix

#: The most memory one block's prefix may take (the corrupted run's state after every
#: position of every document: DeltaNet at d = 256, T = 35 and 320 documents would be 2.9 GB).
#: A block over it is not resumed: its mixer recomputes its window.
STATE_BUDGET_BYTES = 1 << 30

#: The most distinct positions a chunk of patched rows resumes from (each a batch of its
#: own): rows of nearby positions start together at the earliest of them, recomputing a few
#: positions the corrupted run already had. Measured at d = 64, against one batch per
#: position: the paper's AR (T = 35) attention 1.20 -> 1.11 s, Hyena 2.04 -> 1.80 s; the
#: quick AR (T = 11) H3 0.64 -> 0.53 s, Mamba 0.68 -> 0.73 s (its scan's cost is per
#: position); 4 groups were faster for attention and Hyena and 25 % slower for Mamba.
MAX_START_GROUPS = 8


@dataclass(frozen=True)
class PrefixCache:
    """The corrupted run, kept for resuming: ``inputs[j]`` is block j's input [N, T, d],
    ``prefixes[j]`` its mixer's :class:`Prefix`, None where block j is not resumed (its mixer
    cannot resume or recomputes faster, or its prefix is over :data:`STATE_BUDGET_BYTES`)."""

    inputs: list[torch.Tensor]
    prefixes: list[Prefix | None]

    def block_prefix(self, model: LanguageModel, layer: int) -> Prefix:
        """Block ``layer``'s prefix, computed where the cache keeps none (the state site needs
        it whether or not the block resumes)."""
        kept = self.prefixes[layer]
        if kept is not None:
            return kept
        block = model.layers[layer]
        with torch.no_grad():
            made = block.mixer.prefix(block.mixer_norm(self.inputs[layer]))
        if made is None:
            raise ValueError(
                f"layers.{layer}.mixer carries a state but its halo() is None: a mixer with a "
                "state site says how many inputs before a cut it reads"
            )
        return made


def prefix_cache(model: LanguageModel, inputs: list[torch.Tensor]) -> PrefixCache:
    """The prefix of every block whose mixer resumes, from the block inputs of the corrupted
    run. One document's prefix is measured first, so that a block over the memory budget is
    never kept whole."""
    prefixes: list[Prefix | None] = []
    for layer, x in zip(model.layers, inputs, strict=True):
        mixer, x = layer.mixer, layer.mixer_norm(x)
        one = mixer.prefix(x[:1]) if mixer.resume_from_prefix else None
        fits = one is not None and one.nbytes * x.shape[0] <= STATE_BUDGET_BYTES
        prefixes.append(mixer.prefix(x) if fits else None)
    return PrefixCache(inputs, prefixes)


def run_from(
    model: LanguageModel,
    cache: PrefixCache,
    first: int,
    docs: torch.Tensor,
    start: int,
    x: torch.Tensor,
    at: torch.Tensor,
) -> torch.Tensor:
    """Logits at positions ``at`` [R] of rows that equal the corrupted documents ``docs``
    before position ``start``: ``x`` [R, T - start, d] is the residual stream entering block
    ``first`` at positions start..; blocks first.. run from ``start`` on, the last one's MLP
    at ``at`` only. Every row must have ``at >= start``."""
    at = at - start
    n_layers = len(model.layers)
    for j in range(first, n_layers):
        layer, prefix = model.layers[j], cache.prefixes[j]
        lo = 0 if prefix is None else max(0, start - prefix.halo)
        window = torch.cat([cache.inputs[j][docs, lo:start], x], dim=1) if lo < start else x
        state = None if prefix is None else prefix.initial_state(docs, start)
        last = j == n_layers - 1
        x = layer.forward_from(
            window, start - lo, state, at=at if last else None, whole=prefix is None
        )
    if first < n_layers:
        at = torch.zeros_like(at)  # the last block kept the query position alone
    return model.head(x, at)


def run_from_patch(
    model: LanguageModel,
    prefix: PrefixCache,
    first: int,
    docs: torch.Tensor,
    patched: torch.Tensor,
    x: torch.Tensor,
    at: torch.Tensor,
) -> torch.Tensor:
    """Logits at ``at`` of rows whose residual stream entering block ``first`` is ``x``
    [R, T, d], equal to the corrupted run's before each row's ``patched`` position: rows
    sharing a start run together from it (:func:`run_from`). A patch after the query cannot
    reach it, so such a row starts at its query."""
    starts = resume_starts(prefix, first, patched, at)
    logits = None
    for start in starts.unique().tolist():
        group = (starts == start).nonzero()[:, 0]
        out = run_from(model, prefix, first, docs[group], start, x[group, start:], at[group])
        if logits is None:
            logits = out.new_empty(len(docs), out.shape[-1])
        logits[group] = out
    return logits


def resume_starts(
    prefix: PrefixCache, first: int, patched: torch.Tensor, at: torch.Tensor
) -> torch.Tensor:
    """Where each row resumes: its patch position, or its query if the patch lies after it
    (a later position cannot reach the query). Any earlier start is exact too: where no
    block from ``first`` on keeps a prefix state, every row starts at the earliest, so that
    the rows run as one batch instead of one batch per position; otherwise rows start at
    no more than :data:`MAX_START_GROUPS` positions, each the earliest of its run of them."""
    starts = torch.minimum(patched, at)
    if all(kept is None for kept in prefix.prefixes[first:]):
        return torch.full_like(starts, int(starts.min()))
    distinct = starts.unique()  # sorted
    if len(distinct) <= MAX_START_GROUPS:
        return starts
    bounds = distinct[:: -(-len(distinct) // MAX_START_GROUPS)].contiguous()
    return bounds[torch.searchsorted(bounds, starts, right=True) - 1]


def resume_inside_block(
    model: LanguageModel,
    prefix: PrefixCache,
    first: int,
    docs: torch.Tensor,
    patched: tuple[str, torch.Tensor, torch.Tensor],
    at: torch.Tensor,
    tail: bool,
) -> torch.Tensor:
    """Logits at ``at`` of rows patched at a site inside block ``first`` (``patched``: the
    site, each row's position and value): block ``first`` resumes from each row's position
    with the patch hook set, reading positions relative to the suffix each site sees, then
    the blocks after it (:func:`run_from`). ``tail``: the last block's MLP at the query only."""
    site, positions, values = patched
    length = prefix.inputs[first].shape[1]
    block, kept = model.layers[first], prefix.prefixes[first]
    last = first == len(model.layers) - 1
    starts = resume_starts(prefix, first, positions, at)
    logits = None
    for start in starts.unique().tolist():
        group = (starts == start).nonzero()[:, 0]
        docs_, at_ = docs[group], at[group] - start
        lo = 0 if kept is None else max(0, start - kept.halo)
        state = None if kept is None else kept.initial_state(docs_, start)
        with patch(model, site, positions[group], values[group], length=length):
            x = block.forward_from(
                prefix.inputs[first][docs_, lo:],
                start - lo,
                state,
                at=at_ if last and tail else None,
                whole=kept is None,
            )
        if not last:
            out = run_from(model, prefix, first + 1, docs_, start, x, at[group])
        else:
            out = model.head(x, torch.zeros_like(at_) if tail else at_)
        if logits is None:
            logits = out.new_empty(len(docs), out.shape[-1])
        logits[group] = out
    return logits
