"""Associative treecall documents (§5.1, App. B, D.2, D.5).

A document is ``<bos> yield... <div> [qtype] q`` with answer ``a``, where ``yield`` is a PCFG
sample and (q, a) one relation of its derivation tree:

* ``parent``: a is q's parent, the head terminal of the expansion that generated q (or q's
  phrase);
* ``grandparent``: the parent of q's parent;
* ``sibling``: the *rightmost* child of q's parent (App. D.5), which is q itself when q is
  that parent's rightmost child.

The start symbol is a nonterminal drawn uniformly ("an iid nonterminal", §5.1). Yields over
``max_yield`` or under :data:`MIN_YIELD` (3) symbols are rejected, as in the paper's code
(tinylang ``PCFG.sample``), and so are documents without an eligible query.

A query names a terminal and refers to its rightmost instance in the yield, so only children
that are the rightmost instance of their terminal are eligible. Queries are weighted inversely
by the parent's child count: a parent (of the eligible children) is drawn uniformly, then one
of its eligible children uniformly. With ``query == "mixed"`` the query type is drawn
uniformly per document and its token follows the divider.

Roles: key = the queried child's yield position, value = the answer's yield position,
next_key = value + 1 (the divider when the answer is the last yield symbol, e.g. the root
head of a right-headed grammar), divider, query = last position.

Split (App. D.2): with ``split`` = f, round(f·|Σ|²) (query, answer) terminal pairs, drawn from
``grammar_seed``, are held out: test documents ask only about held-out pairs, train and dev
documents never do. Other tree edges in a document are not restricted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mecheval.tasks.config import MIN_YIELD, QUERY_TYPES, ATRConfig
from mecheval.tasks.pcfg import Grammar, Tree, Uniforms, build_grammar, sample_tree
from mecheval.tasks.vocab import BOS, DIV, N_SPECIAL

SPLIT_IDS = {"train": 0, "dev": 1, "test": 2}


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

    def tensors(self) -> dict[str, torch.Tensor]:
        return {
            "start": self.start,
            "parents": self.parents,
            "yield_offsets": self.yield_offsets,
            "rules": self.rules,
            "heads": self.heads,
            "rule_offsets": self.rule_offsets,
        }


def held_out_pairs(cfg: ATRConfig) -> torch.Tensor | None:
    """[Σ, Σ] bool, True at held-out (query, answer) terminal pairs; None without a split."""
    if cfg.split is None:
        return None
    total = cfg.n_terminals**2
    # Seeded by the grammar: every model of an experiment shares one grammar and one split.
    rng = np.random.default_rng([cfg.grammar_seed, 0x5B17])
    chosen = rng.permutation(total)[: round(cfg.split * total)]
    held = np.zeros(total, dtype=bool)
    held[chosen] = True
    return torch.from_numpy(held.reshape(cfg.n_terminals, cfg.n_terminals))


def _answers(tree: Tree, qtype: str) -> list[int]:
    """For each yield position, the answer's position under ``qtype`` (-1: no answer)."""
    par = tree.parents
    if qtype == "parent":
        return list(par)
    if qtype == "grandparent":
        return [par[p] if p >= 0 else -1 for p in par]
    rightmost_child: dict[int, int] = {}
    for i, p in enumerate(par):
        if p >= 0 and i > rightmost_child.get(p, -1):
            rightmost_child[p] = i
    return [rightmost_child[p] if p >= 0 else -1 for p in par]


def choose_query(
    tree: Tree,
    qtype: str,
    draw: Uniforms,
    held: np.ndarray | None = None,
    want_held: bool = False,
) -> tuple[int, int] | None:
    """(child position, answer position) of a query, or None if none is eligible."""
    ys = tree.terminals
    last = {t: i for i, t in enumerate(ys)}
    answers = _answers(tree, qtype)
    groups: dict[int, list[int]] = {}
    for i, a in enumerate(answers):
        if a < 0 or last[ys[i]] != i:
            continue
        if held is not None and bool(held[ys[i], ys[a]]) != want_held:
            continue
        groups.setdefault(tree.parents[i], []).append(i)
    if not groups:
        return None
    parents = sorted(groups)
    kids = groups[parents[draw.below(len(parents))]]
    child = kids[draw.below(len(kids))]
    return child, answers[child]


def generate_atr(cfg: ATRConfig, split: str, n: int, grammar: Grammar | None = None) -> dict:
    """``n`` documents of ``split``: arrays for TaskDataset plus the trees."""
    g = grammar if grammar is not None else build_grammar(cfg)
    draw = Uniforms(np.random.default_rng([cfg.seed, SPLIT_IDS[split], 0xA7]))
    held_t = held_out_pairs(cfg)
    held = None if held_t is None else held_t.numpy()
    types = cfg.query_types
    mixed = cfg.query == "mixed"
    docs: list[tuple[Tree, int, int, int]] = []
    attempts = 0
    while len(docs) < n:
        attempts += 1
        if attempts > 1000 + 1000 * n:
            raise RuntimeError(
                f"ATR: could not draw {n} {split} documents with an eligible query "
                f"after {attempts} samples; the grammar may be too small for this query/split"
            )
        tree = sample_tree(g, draw, draw.below(g.n_nonterminals), cfg.max_yield)
        if tree is None or len(tree.terminals) < MIN_YIELD:
            continue
        q = draw.below(len(types))
        pick = choose_query(tree, types[q], draw, held, want_held=split == "test")
        if pick is None:
            continue
        docs.append((tree, q, pick[0], pick[1]))

    n_yield = np.array([len(t.terminals) for t, *_ in docs], dtype=np.int64)
    extra = 1 if mixed else 0
    lengths = n_yield + 3 + extra
    width = int(lengths.max()) if n else 1
    tokens = np.zeros((n, width), dtype=np.int64)
    answer = np.zeros(n, dtype=np.int64)
    key = np.zeros(n, dtype=np.int64)
    value = np.zeros(n, dtype=np.int64)
    qtypes = np.zeros(n, dtype=np.int64)
    for d, (tree, q, child, ans) in enumerate(docs):
        m = len(tree.terminals)
        row = tokens[d]
        row[0] = BOS
        row[1 : 1 + m] = np.asarray(tree.terminals) + N_SPECIAL
        row[1 + m] = DIV
        if mixed:
            row[2 + m] = N_SPECIAL + cfg.n_terminals + q
        row[2 + m + extra] = tree.terminals[child] + N_SPECIAL
        answer[d] = tree.terminals[ans] + N_SPECIAL
        key[d], value[d] = child + 1, ans + 1
        qtypes[d] = QUERY_TYPES.index(types[q])
    divider = n_yield + 1
    roles = {
        "key": key,
        "value": value,
        "next_key": value + 1,
        "divider": divider,
        "query": lengths - 1,
    }
    trees = ATRTrees(
        start=torch.tensor([t.start for t, *_ in docs], dtype=torch.long),
        parents=torch.tensor([p for t, *_ in docs for p in t.parents], dtype=torch.long),
        yield_offsets=torch.from_numpy(np.concatenate([[0], np.cumsum(n_yield)])),
        rules=torch.tensor([r for t, *_ in docs for r in t.rules], dtype=torch.long),
        heads=torch.tensor([h for t, *_ in docs for h in t.heads], dtype=torch.long),
        rule_offsets=torch.from_numpy(
            np.concatenate([[0], np.cumsum([len(t.rules) for t, *_ in docs], dtype=np.int64)])
        ),
    )
    return {
        "tokens": torch.from_numpy(tokens),
        "answer": torch.from_numpy(answer),
        "roles": {k: torch.from_numpy(v) for k, v in roles.items()},
        "lengths": torch.from_numpy(lengths),
        "extras": {"qtype": torch.from_numpy(qtypes)},
        "trees": trees,
    }
