"""A random PCFG in (right-)Greibach normal form and a sampler of derivation trees (App. B).

Grammar construction, all from ``grammar_seed``:

* each nonterminal X gets a depth score d(X) uniform in 1..d_max and a distribution over
  head terminals drawn from a uniform Dirichlet;
* X gets 1..R_max rules (uniform); each rule has 1..L_max right-hand-side symbols (uniform),
  one of which is the head terminal, drawn once per rule from X's head distribution; each
  other symbol is drawn with weight r_Σ for "a terminal" (then uniform over terminals) and
  weight 1 for each nonterminal Y with d(Y) > d(X). A nonterminal with no such Y gets
  terminal-only rules, so no recursion is possible and trees are at most d_max deep;
* rule probabilities are drawn from a uniform Dirichlet per nonterminal.

A right-headed rule is ``X -> s1 ... sn a`` (head last), a left-headed one ``X -> a s1 ... sn``.
The head terminal is the parent of every symbol its rule generates: terminals directly and,
for each nonterminal child, that child's own head terminal.

Symbols are encoded as ints: terminals ``0..|Σ|-1``, nonterminal X as ``|Σ| + X``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mecheval.tasks.config import ATRConfig


@dataclass(frozen=True)
class Grammar:
    n_terminals: int
    n_nonterminals: int
    head: str  # "right" | "left"
    depth: np.ndarray  # [N] depth score of each nonterminal, 1..d_max
    head_probs: np.ndarray  # [N, Σ] per-nonterminal distribution over head terminals
    rule_lhs: np.ndarray  # [R]
    rule_head: np.ndarray  # [R] head terminal of each rule
    rule_body: np.ndarray  # [R, L_max - 1] non-head symbols in order, -1 padded
    rule_len: np.ndarray  # [R] number of non-head symbols
    rule_prob: np.ndarray  # [R], sums to 1 over each nonterminal's rules
    # Plain-Python views for the sampler's hot loop (numpy scalar access is slow there).
    _rules_of: list[list[int]] = field(repr=False, default_factory=list)
    _cum_of: list[list[float]] = field(repr=False, default_factory=list)
    _body: list[list[int]] = field(repr=False, default_factory=list)
    _head: list[int] = field(repr=False, default_factory=list)

    def rules_of(self, nonterminal: int) -> list[int]:
        return self._rules_of[nonterminal]

    def rhs(self, rule: int) -> list[int]:
        """The rule's right-hand side in order, head included (encoded symbols)."""
        body = self._body[rule]
        return body + [self._head[rule]] if self.head == "right" else [self._head[rule]] + body

    def describe(self, rule: int) -> str:
        def name(s: int) -> str:
            return f"t{s}" if s < self.n_terminals else f"N{s - self.n_terminals}"

        lhs = f"N{int(self.rule_lhs[rule])}"
        return f"{lhs} -> " + " ".join(name(s) for s in self.rhs(rule))


def build_grammar(cfg: ATRConfig) -> Grammar:
    rng = np.random.default_rng([cfg.grammar_seed, 0x9CF6])
    n_t, n_n = cfg.n_terminals, cfg.n_nonterminals
    depth = rng.integers(1, cfg.max_depth + 1, size=n_n)
    head_probs = rng.dirichlet(np.ones(n_t), size=n_n)
    lhs, heads, bodies, probs = [], [], [], []
    for x in range(n_n):
        allowed = np.flatnonzero(depth > depth[x])
        # Index 0 stands for "a terminal" with weight r_Σ; then one entry per allowed Y.
        weights = np.concatenate([[cfg.terminal_weight], np.ones(len(allowed))])
        weights = weights / weights.sum()
        n_rules = int(rng.integers(1, cfg.max_rules + 1))
        for _ in range(n_rules):
            n_body = int(rng.integers(1, cfg.max_rhs + 1)) - 1
            head = int(rng.choice(n_t, p=head_probs[x]))
            body = []
            for _ in range(n_body):
                c = int(rng.choice(len(weights), p=weights))
                body.append(int(rng.integers(n_t)) if c == 0 else n_t + int(allowed[c - 1]))
            lhs.append(x)
            heads.append(head)
            bodies.append(body)
        probs.extend(rng.dirichlet(np.ones(n_rules)).tolist())
    width = max(cfg.max_rhs - 1, 1)
    body_arr = np.full((len(bodies), width), -1, dtype=np.int64)
    for r, body in enumerate(bodies):
        body_arr[r, : len(body)] = body
    rules_of: list[list[int]] = [[] for _ in range(n_n)]
    for r, x in enumerate(lhs):
        rules_of[x].append(r)
    cum_of = [np.cumsum([probs[r] for r in rs]).tolist() for rs in rules_of]
    for c in cum_of:
        c[-1] = 1.0  # guard against float round-off leaving a uniform draw past the end
    return Grammar(
        n_terminals=n_t,
        n_nonterminals=n_n,
        head=cfg.head,
        depth=depth,
        head_probs=head_probs,
        rule_lhs=np.asarray(lhs, dtype=np.int64),
        rule_head=np.asarray(heads, dtype=np.int64),
        rule_body=body_arr,
        rule_len=np.asarray([len(b) for b in bodies], dtype=np.int64),
        rule_prob=np.asarray(probs),
        _rules_of=rules_of,
        _cum_of=cum_of,
        _body=bodies,
        _head=heads,
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
    the root's head) and the rules applied in leftmost-derivation order."""

    start: int
    terminals: list[int]
    parents: list[int]
    rules: list[int]


def sample_tree(g: Grammar, draw: Uniforms, start: int, max_yield: int) -> Tree | None:
    """A derivation from ``start``, or None if its yield exceeds ``max_yield`` symbols."""
    n_t = g.n_terminals
    rules_of, cum_of, bodies, heads = g._rules_of, g._cum_of, g._body, g._head
    right = g.head == "right"
    ys: list[int] = []
    par: list[int] = []
    used: list[int] = []

    def expand(x: int) -> int:
        u = draw()
        cum = cum_of[x]
        k = 0
        while cum[k] < u:
            k += 1
        r = rules_of[x][k]
        used.append(r)
        if not right:
            head_pos = len(ys)
            ys.append(heads[r])
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
            ys.append(heads[r])
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
    return Tree(start, ys, par, used)


def rederive(g: Grammar, start: int, rules: list[int]) -> tuple[list[int], list[int]]:
    """Replay ``rules`` as a leftmost derivation from ``start``; return (yield, parents).

    Independent of :func:`sample_tree` (string rewriting, not recursion), so tests can check
    recorded trees against the grammar. Raises ValueError if a rule does not apply.
    """
    n_t = g.n_terminals
    # Sentential form of (symbol, parent node id, own node id); node ids are creation order.
    form: list[tuple[int, int, int]] = [(n_t + start, -1, -1)]
    next_id = 0
    for r in rules:
        i = next((j for j, (s, _, _) in enumerate(form) if s >= n_t), None)
        if i is None or form[i][0] - n_t != int(g.rule_lhs[r]):
            raise ValueError(f"rule {g.describe(r)} does not rewrite the leftmost nonterminal")
        parent = form[i][1]
        head_id = next_id
        next_id += 1
        rhs = g.rhs(r)
        head_idx = len(rhs) - 1 if g.head == "right" else 0
        new = []
        for j, s in enumerate(rhs):
            if j == head_idx:
                new.append((s, parent, head_id))
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
