"""The Batch contract shared by every stage: tokens, the answer, and named role positions."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

#: Role names every task's documents carry, in the order reports show them. Each maps to one
#: position per document. A task may add its own after these (its config's ``extra_roles``,
#: e.g. overwrite AR's stale_key and stale_value; ``cfg.roles()`` lists them all).
ROLES: tuple[str, ...] = ("key", "value", "next_key", "divider", "query")

#: ``Batch.extras`` of a task that supervises several answers per training document (MQAR):
#: [B, Q] positions and [B, Q] answers; training takes its loss at all of them.
ANSWER_POSITIONS, ANSWERS = "answer_positions", "answers"


@dataclass(frozen=True)
class Batch:
    """A batch of documents.

    ``tokens`` holds each document up to and including the query token (the model's input),
    right-padded with the pad id when lengths vary. The answer is predicted at
    ``roles["query"]``; positions after it are padding and, the models being causal,
    never influence it.
    """

    tokens: torch.Tensor  # [B, T] long
    answer: torch.Tensor  # [B] long
    roles: dict[str, torch.Tensor]  # role -> [B] long positions into tokens
    lengths: torch.Tensor | None = None  # [B] long, number of real tokens (query position + 1)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # task-specific per-doc data
    #: [B, V] bool, True at the answer candidates present in each document (the task's
    #: ``answer_candidates``: AR its values, ATR its yield's terminals); the binding scores
    #: (tasks/scores.py) read them. None: not known (a batch built by hand).
    candidates: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.tokens.dim() != 2:
            raise ValueError(f"Batch.tokens: expected shape [B, T], got {tuple(self.tokens.shape)}")
        size = self.tokens.shape[0]
        if self.answer.shape != (size,):
            raise ValueError(
                f"Batch.answer: expected shape [{size}], got {tuple(self.answer.shape)}"
            )
        for role, pos in self.roles.items():
            if pos.shape != (size,):
                raise ValueError(
                    f"Batch.roles[{role!r}]: expected shape [{size}], got {tuple(pos.shape)}"
                )
        if self.candidates is not None and (
            self.candidates.dim() != 2 or self.candidates.shape[0] != size
        ):
            raise ValueError(
                f"Batch.candidates: expected shape [{size}, V], got {tuple(self.candidates.shape)}"
            )

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def query(self) -> torch.Tensor:
        return self.roles["query"]

    @property
    def padding_mask(self) -> torch.Tensor:
        """[B, T] bool, True at real tokens."""
        if self.lengths is None:
            return torch.ones_like(self.tokens, dtype=torch.bool)
        steps = torch.arange(self.tokens.shape[1], device=self.tokens.device)
        return steps[None, :] < self.lengths[:, None]

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            tokens=self.tokens.to(device),
            answer=self.answer.to(device),
            roles={k: v.to(device) for k, v in self.roles.items()},
            lengths=None if self.lengths is None else self.lengths.to(device),
            extras={k: v.to(device) for k, v in self.extras.items()},
            candidates=None if self.candidates is None else self.candidates.to(device),
        )

    def select(self, index: torch.Tensor | slice) -> Batch:
        """The sub-batch of the given documents."""
        return Batch(
            tokens=self.tokens[index],
            answer=self.answer[index],
            roles={k: v[index] for k, v in self.roles.items()},
            lengths=None if self.lengths is None else self.lengths[index],
            extras={k: v[index] for k, v in self.extras.items()},
            candidates=None if self.candidates is None else self.candidates[index],
        )

    def with_tokens(self, tokens: torch.Tensor) -> Batch:
        """The same documents and roles over other tokens (a counterfactual). The candidates
        stay the original documents': a corrupted document is scored against the candidates of
        the document it was made from (so in-context mass >= likelihood in every condition)."""
        return Batch(
            tokens, self.answer, dict(self.roles), self.lengths, dict(self.extras), self.candidates
        )
