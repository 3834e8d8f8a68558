"""How much of ATR's answer the query alone gives away: the best accuracy of a guess of the
parent terminal from the queried child terminal, without reading the document.

Within one expansion of a nonterminal X, the head terminal h (the parent of everything the
expansion generates) is drawn from ``head_probs[X]`` independently of X's rule and of its
children. So a child terminal t tells about its parent only through which X generated it,
and the joint distribution of (child t, parent h) over the parent-child edges of a
derivation is, exactly,

    P(t, h)  ∝  Σ_X  E[expansions of X] · E[children t | X expands] · head_probs[X, h]

where a child of terminal t is a terminal t in X's rule, or the head of a nonterminal child Y
(drawn from ``head_probs[Y]``), and the expected expansions come from the uniform start
symbol through the rules' expected nonterminal children (depth scores increase along every
rule, so the series ends). The grammar-optimal guess is ``argmax_h P(t, h)``; its accuracy
``Σ_t max_h P(t, h)`` is what a model can reach on parent queries with no use of the key.

This is over all edges of unconditioned derivations. The task's documents add a yield-length
window and its choice of query (rightmost instance of its terminal, parents weighted
equally), so ``task stats`` also reports how often the grammar-optimal guess is right on the
documents' own queries.
"""

from __future__ import annotations

import numpy as np

from mecheval.tasks.pcfg import Grammar


def edge_distribution(g: Grammar) -> np.ndarray:
    """[Σ, Σ] expected number of parent-child edges per derivation with child terminal t
    (row) and parent terminal h (column)."""
    n_t, n_n = g.n_terminals, g.n_nonterminals
    terminal_children = np.zeros((n_n, n_t))  # expected body terminals t per expansion of X
    nonterminal_children = np.zeros((n_n, n_n))  # expected body nonterminals Y per expansion
    for r, x in enumerate(g.rule_lhs):
        for s in g.rule_body[r, : g.rule_len[r]]:
            if s < n_t:
                terminal_children[x, s] += g.rule_prob[r]
            else:
                nonterminal_children[x, s - n_t] += g.rule_prob[r]
    start = np.full(n_n, 1.0 / n_n)
    # e = start + e M: expected expansions of each nonterminal per derivation.
    expansions = np.linalg.solve((np.eye(n_n) - nonterminal_children).T, start)
    children = terminal_children + nonterminal_children @ g.head_probs  # [X, t]
    return (expansions[:, None] * children).T @ g.head_probs


def optimal_guess(edges: np.ndarray) -> np.ndarray:
    """The grammar-optimal parent of each child terminal: [Σ] ints."""
    return edges.argmax(axis=1)


def no_context_accuracy(edges: np.ndarray) -> float:
    """The accuracy of the grammar-optimal guess over all parent-child edges."""
    return float(edges.max(axis=1).sum() / edges.sum())
