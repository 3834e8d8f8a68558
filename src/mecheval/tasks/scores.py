"""How well a model answers: per-document scores of its distribution at the query (paper
§4.2), shared by training's metrics and the intervention engine so both measure the same thing.

Each score maps the model's distribution at the query (:class:`QueryDistribution`: float64
log-probabilities of the entries it reads, the argmax), the answers [N] and the answer
candidates present in each document ([N, V] bool, from the task config's
``answer_candidates``; None where a batch has none) to one float64 value per document.
A new metric is one entry in :data:`SCORES`: training writes every score to ``metrics.csv``;
the engine reports those in ``interventions.RESTORE_METRICS``.

The binding scores tell "retrieves the bound value" from "copies some value of
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

#: Rows per chunk of :func:`log_normaliser`: a chunk's float64 copy (64 x 8192 x 8 bytes at
#: the paper's vocabulary) stays in cache and is reused, where one float64 copy of every row
#: was a fresh allocation of tens of MB per call.
NORMALISER_CHUNK = 64


def log_normaliser(logits: torch.Tensor, top: torch.Tensor | None = None) -> torch.Tensor:
    """log Σ_v exp(logits[:, v]) of each row in float64, [N]: top + log Σ exp(x - top) with
    top the row's maximum (``top``, if the caller has it), row chunk by row chunk."""
    if top is None:
        top = logits.amax(-1)
    n = logits.shape[0]
    out = torch.empty(n, dtype=torch.float64, device=logits.device)
    buffer = logits.new_empty(min(n, NORMALISER_CHUNK), logits.shape[-1], dtype=torch.float64)
    for lo in range(0, n, NORMALISER_CHUNK):
        hi = min(lo + NORMALISER_CHUNK, n)
        shift = top[lo:hi].double()
        # x - top in float64 (the float32 logits are promoted), written into the reused buffer
        shifted = torch.sub(logits[lo:hi], shift[:, None], out=buffer[: hi - lo])
        out[lo:hi] = shift + shifted.exp_().sum(-1).log_()
    return out


class QueryDistribution:
    """The model's distribution at the query, as the scores read it: each row's float64
    log-normaliser, its argmax (the first maximal entry, as ``torch.argmax``), and the
    float64 log-probabilities of the entries a score asks for.

    Only those entries are computed: at the paper's 8,192-token vocabulary, a float64
    log-softmax of every row and two argmaxes over it were most of the intervention engine's
    time (docs/performance.md). ``full`` gives every log-probability, for a score that needs
    the whole distribution."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits
        top, self.argmax = logits.max(-1)
        self.log_normaliser = log_normaliser(logits, top)

    def logp(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """log p(cols[i] | row rows[i]) in float64."""
        return self.logits[rows, cols].double() - self.log_normaliser[rows]

    def answer_logp(self, answer: torch.Tensor) -> torch.Tensor:
        return self.logp(torch.arange(len(answer), device=answer.device), answer)

    @property
    def full(self) -> torch.Tensor:
        """Every log-probability, [N, V] float64."""
        return self.logits.double() - self.log_normaliser[:, None]


def _in_context_mass(dist: QueryDistribution, candidates: torch.Tensor) -> torch.Tensor:
    # exp then sum (not logsumexp): the same float64 probabilities ``likelihood`` reads, of
    # the few candidates only (a document holds a handful of the V entries).
    rows, cols = candidates.nonzero(as_tuple=True)
    mass = torch.zeros(candidates.shape[0], dtype=torch.float64, device=candidates.device)
    return mass.index_add_(0, rows, dist.logp(rows, cols).exp())


def _in_context_accuracy(dist: QueryDistribution, candidates: torch.Tensor) -> torch.Tensor:
    return candidates.gather(1, dist.argmax[:, None])[:, 0].double()


Score = Callable[[QueryDistribution, torch.Tensor, "torch.Tensor | None"], torch.Tensor]

#: name -> (the distribution at the query, answers [N], candidates [N, V] bool or None) -> [N]
SCORES: dict[str, Score] = {
    "likelihood": lambda dist, answer, candidates: dist.answer_logp(answer).exp(),
    "accuracy": lambda dist, answer, candidates: (dist.argmax == answer).double(),
    "loss": lambda dist, answer, candidates: -dist.answer_logp(answer),
    "in_context_mass": lambda dist, answer, candidates: _in_context_mass(dist, candidates),
    "in_context_accuracy": lambda dist, answer, candidates: _in_context_accuracy(dist, candidates),
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
    dist = QueryDistribution(logits)
    return {name: SCORES[name](dist, answer, candidates) for name in names}


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
