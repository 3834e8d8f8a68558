"""How well a model answers: per-document scores of its distribution at the query (paper
§4.2), shared by training's metrics and the intervention engine so both measure the same thing.

Each score maps the log-probabilities at the query ([N, V], float64) and the answers [N] to
one float64 value per document. A new metric is one entry in :data:`SCORES`: training writes
every score to ``metrics.csv``; the engine reports those in ``interventions.RESTORE_METRICS``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def _answer_logp(logp: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    return logp.gather(1, answer[:, None])[:, 0]


#: name -> (log-probabilities [N, V], answers [N]) -> score per document [N]
SCORES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "likelihood": lambda logp, answer: _answer_logp(logp, answer).exp(),
    "accuracy": lambda logp, answer: (logp.argmax(-1) == answer).double(),
    "loss": lambda logp, answer: -_answer_logp(logp, answer),
}


def answer_scores(
    logits: torch.Tensor, answer: torch.Tensor, names: Sequence[str] | None = None
) -> dict[str, torch.Tensor]:
    """The scores ``names`` (default: all) per document, from logits [N, V] at the query."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    return {name: SCORES[name](logp, answer) for name in names or SCORES}
