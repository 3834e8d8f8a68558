"""Running a patched row from its patch position on: a patch at position p leaves
every position before p as the corrupted run computed it, in every layer. So the corrupted
run's block inputs and each mixer's prefix states (``Mixer.prefix_states``: a recurrence's
state after every position, attention's keys and values) are computed once, and a patched
row runs each later block on positions p.. only, resuming its mixer from the state carried
into p. A mixer that keeps no prefix state (the ``Mixer`` defaults, e.g. a long convolution,
or a plugin) recomputes its whole window, and the block's per-position parts (norms, MLP)
still run on p.. only; so does a mixer that keeps states but declares recomputing faster
(``Mixer.resume_from_prefix``). The engine's patched rows run so through
:func:`run_from_patch` (patched at a block boundary) and :func:`resume_inside_block` (at a
site inside a block), rows that resume at the same position as one batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mecheval.interventions.patch import patch
from mecheval.models.backbone import LanguageModel

#: The most memory one block's prefix states may take (the corrupted run's state after every
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
    """The corrupted run, kept for resuming: ``inputs[j]`` is block j's input [N, T, d];
    ``states[j]`` its mixer's prefix states and ``halos[j]`` how many inputs before a cut its
    mixer reads, both None where block j is not resumed (no prefix state, or over
    :data:`STATE_BUDGET_BYTES`)."""

    inputs: list[torch.Tensor]
    states: list[Any]
    halos: list[int | None]


def prefix_cache(model: LanguageModel, inputs: list[torch.Tensor]) -> PrefixCache:
    """The prefix states of every block whose mixer keeps them, from the block inputs of the
    corrupted run."""
    states, halos = [], []
    for layer, x in zip(model.layers, inputs, strict=True):
        mixer = layer.mixer
        halo = mixer.halo() if mixer.resume_from_prefix else None
        per_position = mixer.prefix_state_size()
        if per_position is not None:
            size = x.shape[0] * x.shape[1] * per_position * x.element_size()
            halo = None if size > STATE_BUDGET_BYTES else halo
        halos.append(halo)
        states.append(None if halo is None else mixer.states_of(layer.mixer_norm(x)))
    return PrefixCache(inputs, states, halos)


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
        layer = model.layers[j]
        halo = cache.halos[j]
        lo = 0 if halo is None else max(0, start - halo)
        window = torch.cat([cache.inputs[j][docs, lo:start], x], dim=1) if lo < start else x
        state = None if halo is None else layer.mixer.state_at(cache.states[j], docs, start)
        last = j == n_layers - 1
        x = layer.forward_from(
            window, start - lo, state, at=at if last else None, whole=halo is None
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
    if all(halo is None for halo in prefix.halos[first:]):
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
    block = model.layers[first]
    halo = prefix.halos[first]
    last = first == len(model.layers) - 1
    starts = resume_starts(prefix, first, positions, at)
    logits = None
    for start in starts.unique().tolist():
        group = (starts == start).nonzero()[:, 0]
        docs_, at_ = docs[group], at[group] - start
        lo = 0 if halo is None else max(0, start - halo)
        state = None if halo is None else block.mixer.state_at(prefix.states[first], docs_, start)
        with patch(model, site, positions[group], values[group], length=length):
            x = block.forward_from(
                prefix.inputs[first][docs_, lo:],
                start - lo,
                state,
                at=at_ if last and tail else None,
                whole=halo is None,
            )
        if not last:
            out = run_from(model, prefix, first + 1, docs_, start, x, at[group])
        else:
            out = model.head(x, torch.zeros_like(at_) if tail else at_)
        if logits is None:
            logits = out.new_empty(len(docs), out.shape[-1])
        logits[group] = out
    return logits
