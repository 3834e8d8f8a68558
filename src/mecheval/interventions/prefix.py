"""Running a patched row from its patch position on: a patch at position p leaves
every position before p as the corrupted run computed it, in every layer. So the corrupted
run's block inputs and each mixer's prefix states (``Mixer.prefix_states``: a recurrence's
state after every position, attention's keys and values) are computed once, and a patched
row runs each later block on positions p.. only, resuming its mixer from the state carried
into p. A mixer that keeps no prefix state (the ``Mixer`` defaults, e.g. a long convolution,
or a plugin) recomputes its whole window, and the block's per-position parts (norms, MLP)
still run on p.. only; so does a mixer that keeps states but declares recomputing faster
(``Mixer.resume_from_prefix``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mecheval.models.backbone import LanguageModel

#: The most memory one block's prefix states may take (the corrupted run's state after every
#: position of every document: DeltaNet at d = 256, T = 35 and 320 documents would be 2.9 GB).
#: A block over it is not resumed: its mixer recomputes its window.
STATE_BUDGET_BYTES = 1 << 30


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
