"""Token id layout and names.

Ids, in order: the specials (0 = ``<pad>``, 1 = ``<bos>``, 2 = ``<div>``), then

* AR: keys ``k0..k{n_keys-1}`` then values ``v0..v{n_values-1}`` (disjoint);
* ATR: terminals ``t0..t{n_terminals-1}``, then, only when ``query == "mixed"``, one
  query-type token per type (``<parent>``, ``<sibling>``, ``<grandparent>``).
"""

from __future__ import annotations

from mecheval.tasks.config import QUERY_TYPES, ARConfig, ATRConfig

PAD, BOS, DIV = 0, 1, 2
N_SPECIAL = 3
SPECIAL_NAMES = ("<pad>", "<bos>", "<div>")


def key_id(cfg: ARConfig, key: int) -> int:
    return N_SPECIAL + key


def value_id(cfg: ARConfig, value: int) -> int:
    return N_SPECIAL + cfg.n_keys + value


def terminal_id(cfg: ATRConfig, terminal: int) -> int:
    return N_SPECIAL + terminal


def qtype_id(cfg: ATRConfig, qtype: int) -> int:
    """Id of the query-type token; only documents of ``query == "mixed"`` carry one."""
    return N_SPECIAL + cfg.n_terminals + qtype


def vocab_size(cfg: ARConfig | ATRConfig) -> int:
    if isinstance(cfg, ARConfig):
        return N_SPECIAL + cfg.n_keys + cfg.n_values
    return N_SPECIAL + cfg.n_terminals + (len(QUERY_TYPES) if cfg.query == "mixed" else 0)


def max_length(cfg: ARConfig | ATRConfig) -> int:
    """Most input tokens of a document (query position + 1): the position-embedding size."""
    if isinstance(cfg, ARConfig):
        return 1 + 2 * cfg.n_pairs + 2  # <bos> pairs <div> q
    return 1 + cfg.max_yield + 2 + (1 if cfg.query == "mixed" else 0)  # <bos> yield <div> [t] q


def token_names(cfg: ARConfig | ATRConfig) -> list[str]:
    """Printable name of every id, indexed by id."""
    names = list(SPECIAL_NAMES)
    if isinstance(cfg, ARConfig):
        names += [f"k{i}" for i in range(cfg.n_keys)]
        names += [f"v{i}" for i in range(cfg.n_values)]
    else:
        names += [f"t{i}" for i in range(cfg.n_terminals)]
        if cfg.query == "mixed":
            names += [f"<{q}>" for q in QUERY_TYPES]
    return names


def key_range(cfg: ARConfig | ATRConfig) -> tuple[int, int]:
    """[lo, hi) ids of the class a corrupted key is drawn from (AR keys or ATR terminals)."""
    if isinstance(cfg, ARConfig):
        return N_SPECIAL, N_SPECIAL + cfg.n_keys
    return N_SPECIAL, N_SPECIAL + cfg.n_terminals
