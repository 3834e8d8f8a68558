"""PCFG construction and ATR documents: grammar form, trees, queries, weighting, split."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from scipy.stats import chisquare

from mecheval.tasks import (
    DIV,
    QUERY_TYPES,
    ATRConfig,
    build_datasets,
    build_grammar,
    corrupt,
)
from mecheval.tasks.atr import MIN_YIELD, choose_query, generate_atr, held_out_pairs
from mecheval.tasks.pcfg import HEAD_SLOT, Tree, Uniforms, rederive, sample_tree

SIZES = dict(n_train=400, n_dev=100, n_test=100)


@pytest.fixture(scope="module")
def parent_data():
    cfg = ATRConfig(**SIZES)
    return cfg, build_grammar(cfg), build_datasets(cfg)


def _yield(ds, i):
    n = int(ds.roles["divider"][i]) - 1
    return [t - 3 for t in ds.tokens[i, 1 : 1 + n].tolist()]


def test_paper_defaults():
    cfg = ATRConfig()
    assert (cfg.head, cfg.max_depth, cfg.max_rhs, cfg.max_rules) == ("right", 10, 5, 5)
    assert (cfg.n_nonterminals, cfg.n_terminals, cfg.terminal_weight) == (40, 20, 20)
    # yields up to 1020 symbols: a whole document fits the paper models' 1024 positions
    assert cfg.max_yield == 1020 and cfg.query == "parent"
    assert cfg.vocab_size() == 23 and cfg.max_length() == 1023
    assert ATRConfig(query="mixed").max_length() == 1024
    assert ATRConfig(query="mixed").vocab_size() == 26


@pytest.mark.parametrize("head", ["right", "left"])
def test_grammar_is_headed_and_depth_limited(head):
    cfg = ATRConfig(head=head, grammar_seed=3)
    g = build_grammar(cfg)
    n_t = cfg.n_terminals
    assert ((g.depth >= 1) & (g.depth <= cfg.max_depth)).all()
    np.testing.assert_allclose(g.head_probs.sum(1), 1.0)
    for x in range(cfg.n_nonterminals):
        rules = g.rules_of(x)
        assert 1 <= len(rules) <= cfg.max_rules
        assert abs(sum(g.rule_prob[r] for r in rules) - 1) < 1e-9
        has_deeper = bool((g.depth > g.depth[x]).any())
        for r in rules:
            rhs = g.rhs(r)
            # A head slot plus 1..L_max-1 other symbols: never a bare ``X -> a``.
            assert int(g.rule_lhs[r]) == x and 2 <= len(rhs) <= cfg.max_rhs
            assert len(rhs) == int(g.rule_len[r]) + 1
            # One head slot, at the head end; each expansion fills it with a drawn terminal.
            head_idx = len(rhs) - 1 if head == "right" else 0
            assert [j for j, s in enumerate(rhs) if s == HEAD_SLOT] == [head_idx]
            text, slot = g.describe(r), f"<head of N{x}>"
            if head == "right":
                assert text.startswith(f"N{x} -> ") and text.endswith(f" {slot}")
            else:
                assert text.startswith(f"N{x} -> {slot} ")
            for s in rhs[:head_idx] + rhs[head_idx + 1 :]:
                assert 0 <= s < n_t + cfg.n_nonterminals
                if s >= n_t:
                    # No recursion: nonterminal children are strictly deeper.
                    assert g.depth[s - n_t] > g.depth[x]
            if not has_deeper:
                assert all(s < n_t for s in rhs)
    # The terminal class (weight r_Σ = 20) dominates the right-hand sides.
    body = g.rule_body[g.rule_body >= 0]
    assert (body < n_t).mean() > 0.3


@pytest.mark.parametrize("grammar_seed", [0, 1, 7])
def test_rules_have_1_to_max_rhs_minus_1_non_head_symbols(grammar_seed):
    # tinylang's PCFG draws np.random.randint(1, max_rhs_len) non-head symbols per rule.
    cfg = ATRConfig(grammar_seed=grammar_seed)
    g = build_grammar(cfg)
    n_body = g.rule_len
    assert n_body.min() == 1 and n_body.max() == cfg.max_rhs - 1  # both extremes occur
    assert ((g.rule_body >= 0).sum(1) == n_body).all()
    # Uniform over 1..L_max-1.
    counts = np.bincount(n_body, minlength=cfg.max_rhs)
    assert counts[0] == 0
    assert chisquare(counts[1:]).pvalue > 1e-3


def test_shortest_rules_have_exactly_one_non_head_symbol():
    g = build_grammar(ATRConfig(max_rhs=2))
    assert (g.rule_len == 1).all()
    assert all(len(g.rhs(r)) == 2 for r in range(len(g.rule_lhs)))


@pytest.mark.parametrize("head", ["right", "left"])
def test_no_yield_shorter_than_three(head):
    # tinylang's PCFG.sample rejects len(sentence) < 3.
    assert MIN_YIELD == 3
    cfg = ATRConfig(head=head)
    docs = generate_atr(cfg, "train", 400)
    n_yield = docs.roles["divider"] - 1
    assert int(n_yield.min()) == 3  # 3 is allowed, and happens
    assert torch.equal(docs.lengths, n_yield + 3)
    with pytest.raises(ValidationError):
        ATRConfig(max_yield=2)


@pytest.mark.parametrize("head", ["right", "left"])
def test_documents_rederive_from_their_trees(head):
    cfg = ATRConfig(head=head, **SIZES)
    g = build_grammar(cfg)
    for ds in build_datasets(cfg).values():
        assert ds.trees.heads.shape == ds.trees.rules.shape
        for i in range(len(ds)):
            ys, par = _yield(ds, i), ds.trees.parent_list(i)
            rules, heads = ds.trees.rule_list(i), ds.trees.head_list(i)
            # Every recorded production exists and rewrites the leftmost nonterminal, and
            # its recorded head fills the head slot.
            again, again_par = rederive(g, int(ds.trees.start[i]), rules, heads)
            assert again == ys and again_par == par
            assert sum(p < 0 for p in par) == 1  # n - 1 edges
            assert len(ys) <= cfg.max_yield
            # The root expansion's head is the root of the tree.
            assert ys[par.index(-1)] == heads[0]


def test_rederive_needs_the_recorded_heads(parent_data):
    cfg, g, splits = parent_data
    ds = splits["train"]
    start, rules, heads = int(ds.trees.start[0]), ds.trees.rule_list(0), ds.trees.head_list(0)
    ys, _ = rederive(g, start, rules, heads)
    other = [(h + 1) % cfg.n_terminals for h in heads]
    assert rederive(g, start, rules, other)[0] != ys  # heads are not implied by the rules
    with pytest.raises(ValueError, match="heads"):
        rederive(g, start, rules, heads[:-1])
    with pytest.raises(ValueError, match="not a terminal"):
        rederive(g, start, rules, [cfg.n_terminals] + heads[1:])


def test_same_rule_draws_different_heads(parent_data):
    # tinylang's PCFG._sample draws the head from head_probs[X] at every expansion of X, so
    # one rule is seen with several heads across (and within) documents.
    cfg, g, splits = parent_data
    heads_of: dict[int, set[int]] = {}
    for ds in splits.values():
        for r, h in zip(ds.trees.rules.tolist(), ds.trees.heads.tolist(), strict=True):
            heads_of.setdefault(r, set()).add(h)
    used = {r: hs for r, hs in heads_of.items() if len(hs) > 1}
    # Most rules applied often enough show several heads.
    assert len(used) > len(heads_of) / 2
    # ... and each expansion's head is the terminal at its slot (checked by rederive above).


@pytest.mark.parametrize("head", ["right", "left"])
def test_expansion_heads_follow_head_probs(head):
    cfg = ATRConfig(head=head)
    g = build_grammar(cfg)
    draw = Uniforms(np.random.default_rng(11))
    n_t = cfg.n_terminals
    counts = np.zeros((cfg.n_nonterminals, n_t), dtype=np.int64)
    rule_counts = np.zeros(len(g.rule_lhs), dtype=np.int64)
    for k in range(8000):
        tree = sample_tree(g, draw, k % cfg.n_nonterminals, cfg.max_yield)
        for r, h in zip(tree.rules, tree.heads, strict=True):
            counts[int(g.rule_lhs[r]), h] += 1
            rule_counts[r] += 1
    # The three most expanded nonterminals: head frequencies match head_probs[X]. Bins with
    # expected counts under 5 are pooled.
    for x in np.argsort(-counts.sum(1))[:3]:
        n = counts[x].sum()
        assert n >= 1000
        exp = n * g.head_probs[x]
        small = exp < 5
        obs_b = np.append(counts[x][~small], counts[x][small].sum())
        exp_b = np.append(exp[~small], exp[small].sum())
        if not small.any():
            obs_b, exp_b = obs_b[:-1], exp_b[:-1]
        assert chisquare(obs_b, exp_b).pvalue > 1e-4, (x, counts[x], exp)
        # More distinct heads than X has rules: heads are not tied to rules.
        assert (counts[x] > 0).sum() > len(g.rules_of(int(x)))
    # Rule frequencies still follow rule_prob (one uniform for the rule, one for the head).
    for x in np.argsort(-counts.sum(1))[:3]:
        rs = g.rules_of(int(x))
        if len(rs) > 1:
            obs = rule_counts[rs]
            assert chisquare(obs, obs.sum() * g.rule_prob[rs]).pvalue > 1e-4


def test_depth_limit_holds():
    cfg = ATRConfig(max_depth=3, n_train=300, n_dev=1, n_test=1)
    g = build_grammar(cfg)
    ds = build_datasets(cfg)["train"]
    for i in range(len(ds)):
        par = ds.trees.parent_list(i)
        for j in range(len(par)):
            d = 0
            while par[j] >= 0:
                j, d = par[j], d + 1
            assert d <= cfg.max_depth
        # Depth scores strictly increase along each derivation path.
        lhs_depths = [int(g.depth[g.rule_lhs[r]]) for r in ds.trees.rule_list(i)]
        assert lhs_depths[0] == min(lhs_depths)


def test_max_yield_rejects_long_samples():
    cfg = ATRConfig(max_yield=6, n_train=200, n_dev=1, n_test=1)
    ds = build_datasets(cfg)["train"]
    n_yield = ds.roles["divider"] - 1
    assert int(n_yield.max()) <= 6 and int(n_yield.min()) >= MIN_YIELD
    assert ds.tokens.shape[1] <= cfg.max_length()


def test_parent_queries(parent_data):
    cfg, g, splits = parent_data
    for ds in splits.values():
        rows = torch.arange(len(ds))
        assert (ds.tokens[rows, ds.roles["divider"]] == DIV).all()
        assert (ds.roles["query"] == ds.roles["divider"] + 1).all()
        assert (ds.roles["next_key"] == ds.roles["value"] + 1).all()
        for i in range(len(ds)):
            ys, par = _yield(ds, i), ds.trees.parent_list(i)
            k, v = int(ds.roles["key"][i]) - 1, int(ds.roles["value"][i]) - 1
            q = int(ds.tokens[i, ds.roles["query"][i]]) - 3
            assert ys[k] == q and par[k] == v
            assert int(ds.answer[i]) - 3 == ys[v]
            assert q not in ys[k + 1 :]  # the query refers to the rightmost instance


def test_sibling_and_grandparent_queries():
    for qtype in ("sibling", "grandparent"):
        cfg = ATRConfig(query=qtype, **SIZES)
        ds = build_datasets(cfg)["train"]
        assert (ds.extras["qtype"] == QUERY_TYPES.index(qtype)).all()
        for i in range(len(ds)):
            ys, par = _yield(ds, i), ds.trees.parent_list(i)
            k, v = int(ds.roles["key"][i]) - 1, int(ds.roles["value"][i]) - 1
            assert ys[k] == int(ds.tokens[i, ds.roles["query"][i]]) - 3
            assert ys[k] not in ys[k + 1 :]
            assert int(ds.answer[i]) - 3 == ys[v]
            if qtype == "grandparent":
                assert par[k] >= 0 and par[par[k]] == v
            else:
                siblings = [j for j, p in enumerate(par) if p == par[k]]
                assert v == max(siblings)


def test_mixed_queries_carry_a_type_token():
    cfg = ATRConfig(query="mixed", **SIZES)
    ds = build_datasets(cfg)["train"]
    rows = torch.arange(len(ds))
    qtok = ds.tokens[rows, ds.roles["divider"] + 1]
    assert torch.equal(qtok, 3 + cfg.n_terminals + ds.extras["qtype"])
    assert (ds.roles["query"] == ds.roles["divider"] + 2).all()
    assert set(ds.extras["qtype"].tolist()) == {0, 1, 2}


def test_queries_weighted_inversely_by_child_count():
    # Yield positions 0..9, all distinct terminals; 7 is the root head. Children of 9: 0, 1,
    # 2, 5; of 7: 4, 6, 8; of 5: 3; of 8: 9. Each parent should be drawn equally often.
    ys = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    par = [9, 9, 9, 5, 7, 9, 7, -1, 7, 8]
    tree = Tree(start=0, terminals=ys, parents=par, rules=[], heads=[])
    draw = Uniforms(np.random.default_rng(1234))
    n = 24_000
    counts = Counter(choose_query(tree, "parent", draw)[0] for _ in range(n))
    groups = {9: [0, 1, 2, 5], 5: [3], 7: [4, 6, 8], 8: [9]}
    expected = {c: n / len(groups) / len(kids) for kids in groups.values() for c in kids}
    children = sorted(expected)
    assert sorted(counts) == children
    obs = [counts[c] for c in children]
    exp = [expected[c] for c in children]
    assert chisquare(obs, exp).pvalue > 1e-3
    # A uniform choice over edges would be far off.
    assert chisquare(obs, [n / len(children)] * len(children)).pvalue < 1e-6


def test_only_rightmost_instances_are_eligible():
    # Terminal 4 occurs at 0 and 2: only position 2 may be queried.
    tree = Tree(start=0, terminals=[4, 5, 4, 6], parents=[3, 3, 3, -1], rules=[], heads=[])
    draw = Uniforms(np.random.default_rng(0))
    picks = {choose_query(tree, "parent", draw)[0] for _ in range(200)}
    assert picks == {1, 2}


def test_split_never_leaks():
    cfg = ATRConfig(split=0.2, n_train=600, n_dev=150, n_test=150)
    held = held_out_pairs(cfg)
    assert int(held.sum()) == 80
    splits = build_datasets(cfg)
    for name, ds in splits.items():
        rows = torch.arange(len(ds))
        q = ds.tokens[rows, ds.roles["query"]] - 3
        a = ds.answer - 3
        assert bool((held[q, a] == (name == "test")).all()), name
    assert held_out_pairs(cfg.model_copy(update={"seed": 5})).equal(held)  # shared by seeds


def test_determinism_by_seed():
    cfg = ATRConfig(**SIZES)
    a, b = build_datasets(cfg), build_datasets(cfg)
    for s in a:
        assert torch.equal(a[s].tokens, b[s].tokens)
        assert torch.equal(a[s].trees.parents, b[s].trees.parents)
    c = build_datasets(cfg.model_copy(update={"seed": 1}))
    assert not torch.equal(a["train"].tokens[:50], c["train"].tokens[:50])
    g1, g2 = build_grammar(cfg), build_grammar(cfg.model_copy(update={"grammar_seed": 1}))
    assert not np.array_equal(g1.depth, g2.depth)


def test_corrupt_swaps_one_terminal(parent_data):
    cfg, _, splits = parent_data
    b = splits["dev"].batch(torch.arange(100))
    c = corrupt(b, cfg, seed=7)
    changed = c.tokens != b.tokens
    assert (changed.sum(1) == 1).all()
    rows = torch.arange(len(b))
    assert changed[rows, b.roles["key"]].all()
    new = c.tokens[rows, b.roles["key"]]
    assert ((new >= 3) & (new < 3 + cfg.n_terminals)).all()
    assert torch.equal(corrupt(b, cfg, seed=7).tokens, c.tokens)
    # Padding stays padding.
    assert torch.equal(c.tokens[~b.padding_mask], b.tokens[~b.padding_mask])
