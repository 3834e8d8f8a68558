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

from typing import Literal

import numpy as np
import torch
from pydantic import Field, ValidationInfo, field_validator

from mecheval.tasks.atr_trees import ATRTrees, tree_shape
from mecheval.tasks.base import (
    SPLIT_IDS,
    TaskConfigBase,
    check_split,
    held_out_fraction,
    numpy_rng,
    present_ids,
)
from mecheval.tasks.batch import Batch
from mecheval.tasks.documents import Documents
from mecheval.tasks.no_context import edge_distribution, no_context_accuracy, optimal_guess
from mecheval.tasks.pcfg import Grammar, Tree, Uniforms, build_grammar, sample_tree
from mecheval.tasks.vocab import BOS, DIV, N_SPECIAL

QUERY_TYPES: tuple[str, ...] = ("parent", "sibling", "grandparent")

#: ATR documents whose yield has fewer terminals than this are rejected, as in the paper's
#: code (tinylang ``PCFG.sample``: ``len(sentence) < 3``).
MIN_YIELD = 3


class ATRConfig(TaskConfigBase):
    """Associative treecall over a random head-marked PCFG (§5.1, Appendix B; see pcfg.py)."""

    label = "ATR"
    default_epochs = 32  # §5
    paper_lrs = (3e-5, 1e-4, 3e-4, 1e-3, 3e-3)
    family = "atr"
    # Terminals repeat within yields, so "absent from the document" is often impossible; the
    # paper swaps the terminal for any other (corrupt_to_absent stays False).
    preset_fields = {
        # Measured on the 2-core CPU, 2026-11-23 (docs/quick-preset.md, ATR): the paper's
        # grammar and document count, 2 epochs (6,250 steps of batch 32: about 2 min for
        # Attention and Based, about 6 min for Mamba from its cost per step, at one idle
        # thread); 3 epochs of 32,000 gave 59-85 % dev accuracy, this 65-89 % (docs/atr.md).
        # Larger batches cost more per document (a batch pads to its longest document), and
        # d = 128 was several times slower per step without learning faster.
        "quick": {"n_train": 100_000},
        "tiny": {"n_train": 640, "n_dev": 32, "n_test": 32},
    }
    quick_epochs = 2
    tree_class = ATRTrees

    kind: Literal["atr"] = "atr"
    grammar_seed: int = Field(0, ge=0, description="seed of the one PCFG shared by an experiment")
    head: Literal["right", "left"] = Field("right", description="H: head terminal position")
    max_depth: int = Field(10, ge=1, description="d_max: depth scores are drawn from 1..d_max")
    max_rhs: int = Field(
        5, ge=2, description="L_max: most symbols on a rule's right-hand side, head included"
    )
    max_rules: int = Field(5, ge=1, description="R_max: most rules per nonterminal")
    n_nonterminals: int = Field(40, ge=1, description="|N|")
    n_terminals: int = Field(20, ge=2, description="|Σ|")
    terminal_weight: float = Field(
        20.0, gt=0, description="r_Σ: weight of the terminal class vs 1 per allowed nonterminal"
    )
    # 1020: a whole document (<bos> yield <div> [query type] query) fits the 1024 positions of
    # the paper's models (its code bounds the yield below 1024 symbols and never checks the
    # document; ours counts the document, so no model with l_max 1024 meets a longer one).
    max_yield: int = Field(
        1020,
        ge=MIN_YIELD,
        description=f"yields longer than this are rejected (and shorter than {MIN_YIELD}); "
        "1020 keeps every document within 1024 tokens",
    )
    query: Literal["parent", "sibling", "grandparent", "mixed"] = Field(
        "parent", description="relation asked about; 'mixed' adds a query-type token"
    )
    split: float | None = held_out_fraction(
        "fraction of (query, answer) terminal pairs seen only in test (App. D.2)"
    )

    @field_validator("split")
    @classmethod
    def _split_leaves_both(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is None or "n_terminals" not in info.data:
            return v
        check_split(v, info.data["n_terminals"] ** 2, "(query, answer)")
        return v

    @property
    def query_types(self) -> tuple[str, ...]:
        return QUERY_TYPES if self.query == "mixed" else (self.query,)

    # Token ids: the specials, terminals t0.., then, only when ``query == "mixed"``, one
    # query-type token per type (<parent>, <sibling>, <grandparent>).
    def terminal_id(self, terminal: np.ndarray | int) -> np.ndarray | int:
        return terminal + N_SPECIAL

    def qtype_id(self, qtype: int) -> int:
        return N_SPECIAL + self.n_terminals + qtype

    def token_names(self) -> list[str]:
        names = [f"t{i}" for i in range(self.n_terminals)]
        return names + ([f"<{q}>" for q in QUERY_TYPES] if self.query == "mixed" else [])

    def max_length(self) -> int:
        mixed = 1 if self.query == "mixed" else 0
        return 1 + self.max_yield + 2 + mixed  # <bos> yield <div> [t] q

    def key_class(self) -> tuple[int, int]:
        return int(self.terminal_id(0)), int(self.terminal_id(self.n_terminals))

    def shared_state(self) -> Grammar:
        return build_grammar(self)

    def generate(self, split: str, n: int, shared: Grammar | None = None) -> Documents:
        return generate_atr(self, split, n, shared)

    def answer_candidates(self, batch: Batch) -> torch.Tensor:
        """The distinct terminals of each document's yield (positions before the divider).

        The answer's class is *terminals*: a parent (grandparent, sibling) is named by its
        head terminal, which sits at a yield position (``roles["value"]``); nonterminals have
        no tokens. So the candidates are the terminals the document holds, the query's own
        terminal included (it is in the yield, and a sibling query's answer can be the query
        itself). Terminals repeat within a yield: each counts once, so the chance level is
        1 / (distinct terminals), not 1 / (yield length). The query-type tokens of
        ``query: mixed`` are not terminals and never candidates.
        """
        lo, hi = self.key_class()
        return present_ids(batch, lo, hi, self.vocab_size())

    def key_free(self, batch: Batch) -> torch.Tensor:
        """Documents whose answer is the root's head: the last yield symbol (the first, in a
        left-headed grammar). Half of the paper's parent queries are such, and a model
        answers them from the document's end without finding the key, so corrupting the key
        leaves them answered (``task stats``: "answer is the last yield symbol")."""
        divider = batch.roles["divider"]
        root = divider - 1 if self.head == "right" else torch.ones_like(batch.answer)
        return batch.roles["value"] == root

    def typical_length(self, batch_size: int) -> int:
        """Documents vary from a few tokens to ``max_yield`` (1023 tokens): the median width
        of the first TYPICAL_BATCHES training batches (generated here, in milliseconds) stands
        for them, not the longest possible."""
        sample = generate_atr(self, "train", TYPICAL_BATCHES * batch_size).lengths
        return int(sample.view(TYPICAL_BATCHES, batch_size).amax(1).median())

    def describe(self, documents: Documents, i: int) -> str:
        """The query type of a mixed-query document."""
        if self.query != "mixed":
            return ""
        return f" ({QUERY_TYPES[int(documents.extras['qtype'][i])]})"

    def stats(self, documents: Documents) -> dict[str, torch.Tensor]:
        return tree_stats(self, documents)


#: Training batches sampled by :meth:`ATRConfig.typical_length`.
TYPICAL_BATCHES = 16


def held_out_pairs(cfg: ATRConfig) -> torch.Tensor | None:
    """[Σ, Σ] bool, True at held-out (query, answer) terminal pairs; None without a split."""
    if cfg.split is None:
        return None
    total = cfg.n_terminals**2
    # Seeded by the grammar: every model of an experiment shares one grammar and one split.
    rng = numpy_rng(cfg.grammar_seed, 0x5B17)
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


def generate_atr(cfg: ATRConfig, split: str, n: int, grammar: Grammar | None = None) -> Documents:
    """``n`` documents of ``split``, with their trees."""
    g = grammar if grammar is not None else build_grammar(cfg)
    draw = Uniforms(numpy_rng(cfg.seed, SPLIT_IDS[split], 0xA7))
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
        row[1 : 1 + m] = cfg.terminal_id(np.asarray(tree.terminals))
        row[1 + m] = DIV
        if mixed:
            row[2 + m] = cfg.qtype_id(q)
        row[2 + m + extra] = cfg.terminal_id(tree.terminals[child])
        answer[d] = cfg.terminal_id(tree.terminals[ans])
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
    return Documents(
        tokens=torch.from_numpy(tokens),
        answer=torch.from_numpy(answer),
        roles={k: torch.from_numpy(v) for k, v in roles.items()},
        lengths=torch.from_numpy(lengths),
        extras={"qtype": torch.from_numpy(qtypes)},
        trees=trees,
    )


# ------------------------------------------------------------------------ show, stats, length


def tree_stats(cfg: ATRConfig, ds: Documents) -> dict[str, torch.Tensor]:
    """``task stats``: tree depth, branching, repeated terminals, how often the answer is the
    query terminal itself or the last yield symbol (the root's head, in a right-headed
    grammar), and, for parent queries, how much the query alone gives away
    (tasks/no_context.py): the exact grammar-optimal accuracy over all parent-child edges,
    and whether that guess is right on each document's own query."""
    depths, branching, repeated = tree_shape(ds)
    rows = torch.arange(len(ds))
    query = ds.tokens[rows, ds.roles["query"]]
    last = ds.tokens[rows, ds.roles["divider"] - 1]
    out = {
        "tree depth (edges)": torch.tensor(depths),
        "branching factor": torch.tensor(branching),
        "share of non-unique terminals": torch.tensor(repeated),
        "answer equals query": (ds.answer == query).double(),
        "answer is the last yield symbol": (ds.answer == last).double(),
    }
    if cfg.query == "parent":
        edges = edge_distribution(build_grammar(cfg))
        guess = cfg.terminal_id(torch.from_numpy(optimal_guess(edges)))
        out["no-context guess right (grammar-optimal)"] = (
            guess[query - cfg.terminal_id(0)] == ds.answer
        ).double()
        out["no-context accuracy, all edges (exact)"] = torch.tensor([no_context_accuracy(edges)])
    return out
