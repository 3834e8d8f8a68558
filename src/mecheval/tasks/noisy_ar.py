"""Noisy associative recall: AR whose context has pairs replaced by noise tokens.

Source: MAD's noisy in-context recall (athms/mad-lab, ``mad/data/instances.py``,
``generate_noisy_in_context_recall_instance``, which calls
``generate_in_context_recall_instance`` with ``frac_noise`` and ``noise_vocab_size``). As
there, the context is a row of two-token slots; each slot is independently a run of two noise
tokens with probability ``noise_fraction`` (MAD's ``frac_noise``, default 0.2; allowed
0 <= f < 1) and a key-value pair otherwise; one slot, drawn uniformly, is always a pair (MAD's
``not_noise_idx``), so every document has something to query. Noise tokens come from their
own vocabulary (MAD's ``noise_vocab_size``, default 16), drawn uniformly with replacement.

mecheval's document is AR's (tasks/ar.py) with the slots in place of the pairs::

    <bos> s1 s2 ... sS <div> q   -> a      each s is "k v" or "n n"

What differs from MAD, to keep AR's contract: keys are distinct within a document, and so
are values (MAD draws keys with replacement and keeps a key's first value); the query is
a separate final token after ``<div>`` (AR's layout) rather than a repeated final pair; the
number of slots ``n_slots`` is a field (MAD derives it from ``seq_len / 2``). The default
16 slots = 32 context tokens follow AR's default (the paper's code). With noise fraction f,
the expected share of noise slots is f·(S−1)/S (one slot is always a pair).

Roles are AR's: key = the in-context position of the queried key (uniform over the
document's pairs), value = key + 1, next_key = value + 1 (the next slot's first token, a key
or a noise token, or the divider), divider, query = last position. Corruption is AR's: the
token at ``key`` is replaced by a key id absent from the document (``corrupt_to_absent``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator

from mecheval.tasks.ar import answer_candidates, distinct_rows, key_class, key_id, value_id
from mecheval.tasks.ar import token_names as ar_token_names
from mecheval.tasks.base import (
    SPLIT_IDS,
    Task,
    TaskConfigBase,
    fits_distinct_pairs,
    out_of_range,
    torch_generator,
)
from mecheval.tasks.vocab import BOS, DIV, N_SPECIAL

if TYPE_CHECKING:
    from mecheval.tasks.dataset import TaskDataset


class NoisyARConfig(TaskConfigBase):
    """Noisy AR: ``<bos> s1 .. sS <div> q`` (each slot a pair or two noise tokens) → the
    value after key ``q``."""

    kind: Literal["noisy_ar"] = "noisy_ar"
    n_keys: int = Field(4096, ge=1, description="key vocabulary (as AR)")
    n_values: int = Field(4096, ge=1, description="value vocabulary, disjoint from the keys")
    n_noise: int = Field(
        16, ge=1, description="noise vocabulary, disjoint from keys and values (MAD: 16)"
    )
    n_slots: int = Field(
        16,
        ge=1,
        description=(
            "two-token slots per document, each a key-value pair or noise (AR's 16 pairs; MAD: "
            "seq_len / 2); the most pairs a document can have"
        ),
    )
    noise_fraction: float = Field(
        0.2,
        description="probability that a slot is noise, 0 <= f < 1 (MAD's frac_noise: 0.2)",
    )

    @field_validator("n_slots")
    @classmethod
    def _slots_fit(cls, v: int, info: ValidationInfo) -> int:
        return fits_distinct_pairs(v, info)

    @field_validator("noise_fraction")
    @classmethod
    def _fraction_in_range(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise out_of_range("allowed range 0 <= noise_fraction < 1", v)
        return v


# Token ids: AR's (specials, keys k0.., values v0..), then noise n0.. (disjoint).
def noise_id(cfg: NoisyARConfig, noise: torch.Tensor | int) -> torch.Tensor | int:
    return noise + N_SPECIAL + cfg.n_keys + cfg.n_values


def token_names(cfg: NoisyARConfig) -> list[str]:
    return [*ar_token_names(cfg), *(f"n{i}" for i in range(cfg.n_noise))]


def max_length(cfg: NoisyARConfig) -> int:
    return 1 + 2 * cfg.n_slots + 2  # <bos> slots <div> q


def generate_noisy_ar(cfg: NoisyARConfig, split: str, n: int, shared: None = None) -> dict:
    """``n`` documents of ``split`` as tensors for TaskDataset."""
    gen = torch_generator(cfg.seed, SPLIT_IDS[split], 0x4015E)
    s = cfg.n_slots
    keys = distinct_rows(gen, n, s, cfg.n_keys)
    values = distinct_rows(gen, n, s, cfg.n_values)
    rows = torch.arange(n)
    # Each slot is noise with probability f, but one uniformly drawn slot is always a pair.
    noise = torch.rand(n, s, generator=gen) < cfg.noise_fraction
    noise[rows, torch.randint(s, (n,), generator=gen)] = False
    noise_tokens = torch.randint(cfg.n_noise, (n, s, 2), generator=gen)
    # The queried pair: uniform over the document's pair slots (noise slots score -1).
    scores = torch.rand(n, s, generator=gen).masked_fill(noise, -1.0)
    qi = scores.argmax(dim=1)

    pairs = torch.stack([key_id(cfg, keys), value_id(cfg, values)], dim=2)
    slots = torch.where(noise[:, :, None], noise_id(cfg, noise_tokens), pairs)
    width = 2 * s + 3
    tokens = torch.empty(n, width, dtype=torch.long)
    tokens[:, 0] = BOS
    tokens[:, 1 : 1 + 2 * s] = slots.reshape(n, 2 * s)
    tokens[:, 2 * s + 1] = DIV
    tokens[:, 2 * s + 2] = key_id(cfg, keys[rows, qi])
    key_pos = 1 + 2 * qi
    full = torch.full((n,), 2 * s + 1, dtype=torch.long)
    roles = {
        "key": key_pos,
        "value": key_pos + 1,
        "next_key": key_pos + 2,
        "divider": full,
        "query": full + 1,
    }
    return {
        "tokens": tokens,
        "answer": value_id(cfg, values[rows, qi]),
        "roles": roles,
        "lengths": full + 2,
        "extras": {"noise_slots": noise.sum(dim=1)},
        "trees": None,
    }


def describe(ds: TaskDataset, i: int) -> str:
    cfg = ds.cfg
    return f"  ({int(ds.extras['noise_slots'][i])} of {cfg.n_slots} slots noise)"


def stats(ds: TaskDataset) -> dict[str, torch.Tensor]:
    noise = ds.extras["noise_slots"]
    return {
        "noise slots per document": noise,
        "pairs per document": ds.cfg.n_slots - noise,
        "noise fraction (of slots)": noise.double() / ds.cfg.n_slots,
    }


# --------------------------------------------------------------------------------- presets
# quick: AR's quick recipe (16 keys, 16 values, init_std 0.1, one epoch of 100,032 documents)
# with 4 slots at noise fraction 0.3: AR quick's 8 context tokens, about 3.1 pairs per
# document. Measured on a loaded 2-core CPU (docs/tasks.md): 8 slots at 0.5 and 6 slots at
# 0.3 stayed at chance (dev accuracy 0.24, 0.25) for the whole epoch.
PRESETS = {
    "paper": {
        "task": {"kind": "noisy_ar"},
        "model": {"d_model": 64, "n_layers": 2},
        "training": {"lr": 1e-3, "batch_size": 32, "epochs": 16},
    },
    "quick": {
        "task": {
            "kind": "noisy_ar",
            "n_keys": 16,
            "n_values": 16,
            "n_noise": 16,
            "n_slots": 4,
            "noise_fraction": 0.3,
        },
        "model": {"d_model": 64, "n_layers": 2, "init_std": 0.1},
        "training": {"lr": 1e-3, "batch_size": 32, "epochs": 1, "eval_every": 250},
    },
    "tiny": {
        "task": {
            "kind": "noisy_ar",
            "n_keys": 8,
            "n_values": 8,
            "n_noise": 4,
            "n_slots": 3,
            "noise_fraction": 0.3,
            "n_train": 640,
            "n_dev": 64,
            "n_test": 64,
        },
        "model": {"d_model": 16, "n_layers": 2, "init_std": 0.1},
        "training": {"steps": 40, "batch_size": 16, "eval_every": 20, "lr": 3e-3},
    },
}


TASK = Task(
    kind="noisy_ar",
    label="Noisy AR",
    config=NoisyARConfig,
    generate=generate_noisy_ar,
    token_names=token_names,
    max_length=max_length,
    key_class=key_class,
    corrupt_to_absent=True,
    default_epochs=16,  # as AR (§4.1)
    paper_lrs=(3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2),  # AR's grid
    presets=PRESETS,
    quick_lrs={"mamba": 3e-3, "hyena": 3e-3},  # AR's, not re-measured on this task
    describe=describe,
    stats=stats,
    # AR's: the document's values (noise tokens are never an answer).
    answer_candidates=answer_candidates,
)
