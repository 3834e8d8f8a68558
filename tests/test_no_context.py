"""ATR's no-context optimum (tasks/no_context.py): the exact edge distribution of the grammar
against a Monte-Carlo count over sampled derivations, and what `task stats` reports."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from mecheval.tasks import ATRConfig, build_grammar
from mecheval.tasks.no_context import edge_distribution, no_context_accuracy, optimal_guess
from mecheval.tasks.pcfg import Uniforms, sample_tree

N_TREES = 20_000


def sampled_edges(cfg: ATRConfig, seed: int) -> tuple[np.ndarray, int]:
    """(child terminal, parent terminal) counts over N_TREES derivations from a uniform start,
    unconditioned (no yield-length window, every edge counted)."""
    g = build_grammar(cfg)
    draw = Uniforms(np.random.default_rng(seed))
    counts = np.zeros((g.n_terminals, g.n_terminals))
    for _ in range(N_TREES):
        tree = sample_tree(g, draw, draw.below(g.n_nonterminals), 10**9)
        for child, parent in enumerate(tree.parents):
            if parent >= 0:
                counts[tree.terminals[child], tree.terminals[parent]] += 1
    return counts, N_TREES


@pytest.mark.parametrize(
    "cfg",
    [ATRConfig(), ATRConfig(grammar_seed=3, head="left", n_terminals=8, max_rhs=3)],
    ids=["paper", "left-8-terminals"],
)
def test_exact_edge_distribution_matches_sampled_derivations(cfg: ATRConfig) -> None:
    exact = edge_distribution(build_grammar(cfg))
    counts, trees = sampled_edges(cfg, seed=11)
    # Edges per derivation: a mean over trees, within 5 standard errors of the exact value.
    per_tree = counts.sum() / trees
    assert per_tree == pytest.approx(exact.sum(), rel=0.03)
    # The joint (child, parent) distribution: a chi-square test on the cells with mass.
    expected = exact / exact.sum() * counts.sum()
    cells = expected > 5
    observed = counts[cells]
    scaled = expected[cells] * observed.sum() / expected[cells].sum()
    assert chisquare(observed, scaled).pvalue > 1e-4
    # The grammar-optimal guess's accuracy on the sampled edges: within 5 binomial SEs.
    guess = optimal_guess(exact)
    hits = counts[np.arange(len(guess)), guess].sum()
    accuracy = no_context_accuracy(exact)
    se = np.sqrt(accuracy * (1 - accuracy) / counts.sum())
    assert abs(hits / counts.sum() - accuracy) < 5 * se


def test_a_wrong_distribution_fails_the_comparison() -> None:
    """The chi-square above can fail: the edges with parent and child swapped do not fit."""
    cfg = ATRConfig()
    exact = edge_distribution(build_grammar(cfg)).T
    counts, _ = sampled_edges(cfg, seed=11)
    expected = exact / exact.sum() * counts.sum()
    cells = expected > 5
    scaled = expected[cells] * counts[cells].sum() / expected[cells].sum()
    assert chisquare(counts[cells], scaled).pvalue < 1e-6


def test_task_stats_reports_the_no_context_numbers(monkeypatch, capsys) -> None:
    from small_runs import run_cli

    code, out, _ = run_cli(monkeypatch, capsys, "task", "stats", "atr", "-n", "200")
    assert code == 0, out
    exact = no_context_accuracy(edge_distribution(build_grammar(ATRConfig())))
    line = next(row for row in out.splitlines() if "all edges" in row)
    assert f"{exact:.3g}" in line
    assert "answer is the last yield symbol" in out and "no-context guess right" in out
