"""How well a model answers: per-document scores of its distribution at the query (paper
§4.2), shared by training's metrics and the intervention engine so both measure the same thing.

Each score maps the log-probabilities at the query ([N, V], float64), the answers [N] and the
answer candidates present in each document ([N, V] bool, from the task's
``answer_candidates`` hook; None where a batch has none) to one float64 value per document.
A new metric is one entry in :data:`SCORES`: training writes every score to ``metrics.csv``;
the engine reports those in ``interventions.RESTORE_METRICS``.

The binding scores (issue #14) tell "retrieves the bound value" from "copies some value of
the context": ``in_context_mass`` is the probability summed over the answer candidates the
document holds (AR: its values; ATR: the terminals of its yield), ``in_context_accuracy``
whether the argmax is one of them. The answer is always a candidate, so
``in_context_mass >= likelihood`` and ``in_context_accuracy >= accuracy`` document by
document. A model that learned the candidates but not the binding sits at
``in_context_accuracy`` ≈ 1 and ``accuracy`` ≈ :func:`chance_level`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def _answer_logp(logp: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    return logp.gather(1, answer[:, None])[:, 0]


def _in_context_mass(logp: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    # exp then sum (not logsumexp): the same float64 probabilities ``likelihood`` reads, of
    # the few candidates only (a document holds a handful of the V entries).
    rows, cols = candidates.nonzero(as_tuple=True)
    mass = logp.new_zeros(logp.shape[0])
    return mass.index_add_(0, rows, logp[rows, cols].exp())


def _in_context_accuracy(logp: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    return candidates.gather(1, logp.argmax(-1)[:, None])[:, 0].double()


Score = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]

#: name -> (log-probabilities [N, V], answers [N], candidates [N, V] bool or None) -> [N]
SCORES: dict[str, Score] = {
    "likelihood": lambda logp, answer, candidates: _answer_logp(logp, answer).exp(),
    "accuracy": lambda logp, answer, candidates: (logp.argmax(-1) == answer).double(),
    "loss": lambda logp, answer, candidates: -_answer_logp(logp, answer),
    "in_context_mass": lambda logp, answer, candidates: _in_context_mass(logp, candidates),
    "in_context_accuracy": lambda logp, answer, candidates: _in_context_accuracy(logp, candidates),
}

#: The scores that read the candidates: left out (by default) where a batch has none.
CANDIDATE_SCORES = frozenset({"in_context_mass", "in_context_accuracy"})


def available_scores(names: Sequence[str], candidates: torch.Tensor | None) -> list[str]:
    """``names`` less the candidate scores when there are no candidates."""
    return [n for n in names if candidates is not None or n not in CANDIDATE_SCORES]


def answer_scores(
    logits: torch.Tensor,
    answer: torch.Tensor,
    names: Sequence[str] | None = None,
    candidates: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The scores ``names`` per document, from logits [N, V] at the query. Default: every
    score, the candidate scores only where ``candidates`` ([N, V] bool) are given; naming one
    without them is a ValueError."""
    if names is None:
        names = available_scores(list(SCORES), candidates)
    elif candidates is None and CANDIDATE_SCORES.intersection(names):
        raise ValueError(
            f"answer_scores: {sorted(CANDIDATE_SCORES.intersection(names))} need the "
            "documents' answer candidates"
        )
    if candidates is not None and candidates.shape != logits.shape:
        raise ValueError(
            f"answer_scores: candidates of shape {tuple(candidates.shape)}, logits "
            f"{tuple(logits.shape)}"
        )
    logp = torch.log_softmax(logits.double(), dim=-1)
    return {name: SCORES[name](logp, answer, candidates) for name in names}


def n_candidates(candidates: torch.Tensor) -> torch.Tensor:
    """Answer candidates present in each document, [N] long."""
    return candidates.sum(-1)


def chance_level(candidates: torch.Tensor) -> float:
    """The accuracy of a guess drawn uniformly among each document's in-context candidates,
    averaged over documents: mean(1 / n_i). (Not 1 / mean(n_i): where n varies, as for ATR
    yields, the expected accuracy of such a guesser is the mean of the per-document chances.)"""
    counts = n_candidates(candidates).double()
    if not len(counts) or bool((counts < 1).any()):
        raise ValueError("chance_level: every document needs at least one candidate")
    return float((1.0 / counts).mean())
