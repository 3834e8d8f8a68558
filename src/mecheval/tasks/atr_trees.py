"""ATR's derivation trees, stored with a dataset (flat with offsets, so a cache file holds
them as tensors), and the tree shape ``task stats`` reports."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mecheval.tasks.documents import Documents


@dataclass
class ATRTrees:
    """Derivation trees of a dataset's documents, flat with offsets (cacheable as tensors)."""

    start: torch.Tensor  # [N] start nonterminal
    parents: torch.Tensor  # [sum n] parent yield position of each yield symbol, -1 at the root
    yield_offsets: torch.Tensor  # [N + 1]
    rules: torch.Tensor  # [sum m] rules in leftmost-derivation order
    heads: torch.Tensor  # [sum m] head terminal each of those expansions drew
    rule_offsets: torch.Tensor  # [N + 1], for ``rules`` and ``heads`` alike

    def parent_list(self, i: int) -> list[int]:
        a, b = int(self.yield_offsets[i]), int(self.yield_offsets[i + 1])
        return self.parents[a:b].tolist()

    def rule_list(self, i: int) -> list[int]:
        a, b = int(self.rule_offsets[i]), int(self.rule_offsets[i + 1])
        return self.rules[a:b].tolist()

    def head_list(self, i: int) -> list[int]:
        a, b = int(self.rule_offsets[i]), int(self.rule_offsets[i + 1])
        return self.heads[a:b].tolist()

    def check(self, n: int) -> None:
        """Consistency with ``n`` documents; raises ValueError (a cache file is then rebuilt)."""
        if self.yield_offsets.shape != (n + 1,) or self.rule_offsets.shape != (n + 1,):
            raise ValueError("trees")
        if int(self.yield_offsets[-1]) != self.parents.numel():
            raise ValueError("trees")
        if int(self.rule_offsets[-1]) != self.rules.numel():
            raise ValueError("trees")
        if self.heads.shape != self.rules.shape:
            raise ValueError("trees")

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> ATRTrees:
        return cls(**{k: tensors[k] for k in cls.__dataclass_fields__})

    def tensors(self) -> dict[str, torch.Tensor]:
        return {
            "start": self.start,
            "parents": self.parents,
            "yield_offsets": self.yield_offsets,
            "rules": self.rules,
            "heads": self.heads,
            "rule_offsets": self.rule_offsets,
        }


def tree_shape(ds: Documents) -> tuple[list[int], list[float], list[float]]:
    """Per document: tree depth (edges on the longest root-leaf path), mean branching factor
    (children per terminal that has any) and share of yield positions whose terminal repeats."""
    assert ds.trees is not None
    depths, branching, repeated = [], [], []
    for i in range(len(ds)):
        par = ds.trees.parent_list(i)
        n = len(par)
        deepest = 0
        for j in range(n):
            # Walk up to the root; trees are shallow (at most d_max rule levels).
            d = 0
            while par[j] >= 0:
                j, d = par[j], d + 1
            deepest = max(deepest, d)
        depths.append(deepest)
        kids: dict[int, int] = {}
        for p in par:
            if p >= 0:
                kids[p] = kids.get(p, 0) + 1
        branching.append(sum(kids.values()) / len(kids) if kids else 0.0)
        ys = ds.tokens[i, 1 : 1 + n].tolist()
        counts: dict[int, int] = {}
        for t in ys:
            counts[t] = counts.get(t, 0) + 1
        repeated.append(sum(1 for t in ys if counts[t] > 1) / n)
    return depths, branching, repeated
