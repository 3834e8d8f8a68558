"""A random head-marked PCFG and a sampler of derivation trees (App. B).

Follows the paper's released code, aryamanarora/tinylang ``tinylang/language/pcfg.py``
(``PCFG.__init__`` lines 110-150: depth scores, rule sizes, rule and head distributions;
``PCFG._sample`` lines 221-268: each expansion's rule and head, and where the head goes;
``PCFG.sample`` line 399: the yield-length rejection, applied in :mod:`mecheval.tasks.atr`).

Grammar construction, all from ``grammar_seed``:

* each nonterminal X gets a depth score d(X) uniform in 1..d_max and a distribution over
  head terminals drawn from a uniform Dirichlet;
* X gets 1..R_max rules (uniform). Each rule has a head slot plus 1..L_max-1 other symbols
  (uniform, as the reference's ``np.random.randint(1, max_rhs_len)``, line 127/132), so a
  right-hand side holds 2..L_max symbols and there are no ``X -> a`` rules. Each other
  symbol is drawn with weight r_Σ for "a terminal" (then uniform over terminals) and
  weight 1 for each nonterminal Y with d(Y) > d(X). A nonterminal with no such Y gets
  terminal-only rules, so no recursion is possible and trees are at most d_max deep;
* rule probabilities are drawn from a uniform Dirichlet per nonterminal.

A right-headed rule is ``X -> s1 ... sn <head of X>`` (head slot at the right end), a
left-headed one ``X -> <head of X> s1 ... sn``; each ``si`` is a terminal or a deeper
nonterminal, in any order, so this is not Greibach normal form: terminals may precede a
nonterminal, and a right-headed rule may begin with a nonterminal.

Rules carry no head terminal. As in the reference (``_sample``: rule at lines 246-248, then
head at 251-252 for a right head, 261-262 for a left one), each *expansion* of X draws its
rule from X's rule distribution and then, independently, a head terminal from X's head
distribution (``head_probs``, lines 146-150); the head fills the rule's head slot. So the
same rule applied twice can have different heads, and the heads of X's expansions are
distributed as ``head_probs[X]``. The draws of one expansion are: rule, then head, then the
expansions of its nonterminal children left to right (a leftmost derivation), for either
head position; this is the reference's order within an expansion. The head terminal is the
parent of every symbol its expansion generates: terminals directly and, for each
nonterminal child, that child's own head terminal. A :class:`Tree` records each expansion's
rule and head, which is all :func:`rederive` needs to replay it.

Symbols are encoded as ints: terminals ``0..|Σ|-1``, nonterminal X as ``|Σ| + X``.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from mecheval.tasks.base import numpy_rng

#: The head slot in :meth:`Grammar.rhs`: filled by a head terminal drawn at each expansion.
HEAD_SLOT = -1


@dataclass(frozen=True)
class Grammar:
    n_terminals: int
    n_nonterminals: int
    head: str  # "right" | "left"
    depth: np.ndarray  # [N] depth score of each nonterminal, 1..d_max
    head_probs: np.ndarray  # [N, Σ] per-nonterminal distribution over head terminals
    rule_lhs: np.ndarray  # [R]
    rule_body: np.ndarray  # [R, L_max - 1] non-head symbols in order, -1 padded
    rule_len: np.ndarray  # [R] number of non-head symbols, 1..L_max - 1
    rule_prob: np.ndarray  # [R], sums to 1 over each nonterminal's rules
    # Plain-Python views for the sampler's hot loop (numpy scalar access is slow there).
    _rules_of: list[list[int]] = field(repr=False, default_factory=list)
    _cum_of: list[list[float]] = field(repr=False, default_factory=list)
    _body: list[list[int]] = field(repr=False, default_factory=list)
    _head_cum_of: list[list[float]] = field(repr=False, default_factory=list)

    def rules_of(self, nonterminal: int) -> list[int]:
        return self._rules_of[nonterminal]

    def rhs(self, rule: int) -> list[int]:
        """The rule's right-hand side in order (encoded symbols), with :data:`HEAD_SLOT` where
        each expansion puts the head terminal it draws: last if right-headed, else first."""
        body = list(self._body[rule])
        return body + [HEAD_SLOT] if self.head == "right" else [HEAD_SLOT] + body

    def describe(self, rule: int) -> str:
        """E.g. ``N3 -> t4 N7 <head of N3>``."""
        lhs = f"N{int(self.rule_lhs[rule])}"

        def name(s: int) -> str:
            if s == HEAD_SLOT:
                return f"<head of {lhs}>"
            return f"t{s}" if s < self.n_terminals else f"N{s - self.n_terminals}"

        return f"{lhs} -> " + " ".join(name(s) for s in self.rhs(rule))


class GrammarParameters(Protocol):
    """What a grammar is drawn from: the fields of tasks/atr.py's ``ATRConfig`` it reads."""

    grammar_seed: int
    head: str
    max_depth: int
    max_rhs: int
    max_rules: int
    n_nonterminals: int
    n_terminals: int
    terminal_weight: float


def build_grammar(cfg: GrammarParameters) -> Grammar:
    rng = numpy_rng(cfg.grammar_seed, 0x9CF6)
    n_t, n_n = cfg.n_terminals, cfg.n_nonterminals
    depth = rng.integers(1, cfg.max_depth + 1, size=n_n)
    head_probs = rng.dirichlet(np.ones(n_t), size=n_n)
    lhs, bodies, probs = [], [], []
    for x in range(n_n):
        allowed = np.flatnonzero(depth > depth[x])
        # Index 0 stands for "a terminal" with weight r_Σ; then one entry per allowed Y.
        weights = np.concatenate([[cfg.terminal_weight], np.ones(len(allowed))])
        weights = weights / weights.sum()
        n_rules = int(rng.integers(1, cfg.max_rules + 1))
        for _ in range(n_rules):
            # 1..L_max-1 non-head symbols; the head slot makes the right-hand side 2..L_max long.
            n_body = int(rng.integers(1, cfg.max_rhs))
            body = []
            for _ in range(n_body):
                c = int(rng.choice(len(weights), p=weights))
                body.append(int(rng.integers(n_t)) if c == 0 else n_t + int(allowed[c - 1]))
            lhs.append(x)
            bodies.append(body)
        probs.extend(rng.dirichlet(np.ones(n_rules)).tolist())
    body_arr = np.full((len(bodies), cfg.max_rhs - 1), -1, dtype=np.int64)
    for r, body in enumerate(bodies):
        body_arr[r, : len(body)] = body
    rules_of: list[list[int]] = [[] for _ in range(n_n)]
    for r, x in enumerate(lhs):
        rules_of[x].append(r)
    cum_of = [np.cumsum([probs[r] for r in rs]).tolist() for rs in rules_of]
    head_cum_of = [np.cumsum(p).tolist() for p in head_probs]
    for c in cum_of + head_cum_of:
        c[-1] = 1.0  # guard against float round-off leaving a uniform draw past the end
    return Grammar(
        n_terminals=n_t,
        n_nonterminals=n_n,
        head=cfg.head,
        depth=depth,
        head_probs=head_probs,
        rule_lhs=np.asarray(lhs, dtype=np.int64),
        rule_body=body_arr,
        rule_len=np.asarray([len(b) for b in bodies], dtype=np.int64),
        rule_prob=np.asarray(probs),
        _rules_of=rules_of,
        _cum_of=cum_of,
        _body=bodies,
        _head_cum_of=head_cum_of,
    )


class Uniforms:
    """Uniform draws in bulk from a numpy Generator; one Python float per call."""

    def __init__(self, rng: np.random.Generator, chunk: int = 1 << 16) -> None:
        self.rng, self.chunk = rng, chunk
        self.buf: list[float] = []
        self.i = 0

    def __call__(self) -> float:
        if self.i >= len(self.buf):
            self.buf = self.rng.random(self.chunk).tolist()
            self.i = 0
        self.i += 1
        return self.buf[self.i - 1]

    def below(self, n: int) -> int:
        """Uniform int in 0..n-1."""
        return min(int(self() * n), n - 1)


class _TooLong(Exception):
    pass


@dataclass
class Tree:
    """One derivation: its yield (terminals), each yield position's parent position (-1 for
    the root's head), the rules applied in leftmost-derivation order and, aligned with them,
    the head terminal each of those expansions drew."""

    start: int
    terminals: list[int]
    parents: list[int]
    rules: list[int]
    heads: list[int]


def sample_tree(g: Grammar, draw: Uniforms, start: int, max_yield: int) -> Tree | None:
    """A derivation from ``start``, or None if its yield exceeds ``max_yield`` symbols.

    Each expansion of a nonterminal X takes two uniforms from ``draw``: the first picks X's
    rule, the second its head terminal from ``head_probs[X]``; then X's nonterminal children
    are expanded left to right."""
    n_t = g.n_terminals
    rules_of, cum_of, bodies = g._rules_of, g._cum_of, g._body
    head_cum_of = g._head_cum_of
    right = g.head == "right"
    ys: list[int] = []
    par: list[int] = []
    used: list[int] = []
    used_heads: list[int] = []

    def expand(x: int) -> int:
        u = draw()
        cum = cum_of[x]
        k = 0
        while cum[k] < u:
            k += 1
        r = rules_of[x][k]
        # First index whose cumulative probability reaches the draw (the last one is 1.0).
        head = bisect_left(head_cum_of[x], draw())
        used.append(r)
        used_heads.append(head)
        if not right:
            head_pos = len(ys)
            ys.append(head)
            par.append(-1)
        children = []
        for s in bodies[r]:
            if s < n_t:
                children.append(len(ys))
                ys.append(s)
                par.append(-1)
            else:
                children.append(expand(s - n_t))
            if len(ys) > max_yield:
                raise _TooLong
        if right:
            head_pos = len(ys)
            ys.append(head)
            par.append(-1)
            if len(ys) > max_yield:
                raise _TooLong
        for c in children:
            par[c] = head_pos
        return head_pos

    try:
        expand(start)
    except _TooLong:
        return None
    return Tree(start, ys, par, used, used_heads)


def rederive(
    g: Grammar, start: int, rules: list[int], heads: list[int]
) -> tuple[list[int], list[int]]:
    """Replay ``rules`` as a leftmost derivation from ``start``, the k-th expansion's head
    slot filled with ``heads[k]``; return (yield, parents).

    Independent of :func:`sample_tree` (string rewriting, not recursion), so tests can check
    recorded trees against the grammar. Raises ValueError if a rule does not apply, a head is
    not a terminal or ``heads`` and ``rules`` differ in length.
    """
    n_t = g.n_terminals
    if len(heads) != len(rules):
        raise ValueError(f"{len(rules)} rules but {len(heads)} heads")
    # Sentential form of (symbol, parent node id, own node id); node ids are creation order.
    form: list[tuple[int, int, int]] = [(n_t + start, -1, -1)]
    next_id = 0
    for r, h in zip(rules, heads, strict=True):
        i = next((j for j, (s, _, _) in enumerate(form) if s >= n_t), None)
        if i is None or form[i][0] - n_t != int(g.rule_lhs[r]):
            raise ValueError(f"rule {g.describe(r)} does not rewrite the leftmost nonterminal")
        if not 0 <= h < n_t:
            raise ValueError(f"head {h} of rule {g.describe(r)} is not a terminal")
        parent = form[i][1]
        head_id = next_id
        next_id += 1
        new = []
        for s in g.rhs(r):
            if s == HEAD_SLOT:
                new.append((h, parent, head_id))
            elif s < n_t:
                new.append((s, head_id, next_id))
                next_id += 1
            else:
                new.append((s, head_id, -1))
        form[i : i + 1] = new
    if any(s >= n_t for s, _, _ in form):
        raise ValueError("derivation ends with nonterminals left")
    where = {node: pos for pos, (_, _, node) in enumerate(form)}
    return [s for s, _, _ in form], [where[p] if p >= 0 else -1 for _, p, _ in form]
