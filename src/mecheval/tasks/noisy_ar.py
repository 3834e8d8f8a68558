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

from typing import Literal

import torch
from pydantic import Field, field_validator

from mecheval.tasks.base import SPLIT_IDS, out_of_range, torch_generator
from mecheval.tasks.documents import Documents
from mecheval.tasks.family import KeyValueConfig, distinct_rows, pair_roles
from mecheval.tasks.vocab import BOS, DIV, N_SPECIAL


class NoisyARConfig(KeyValueConfig):
    """Noisy AR: ``<bos> s1 .. sS <div> q`` (each slot a pair or two noise tokens) → the
    value after key ``q``."""

    label = "Noisy AR"
    preset_fields = {
        # AR's quick recipe with 4 slots at noise fraction 0.3: AR quick's 8 context tokens,
        # about 3.1 pairs per document. Measured on a loaded 2-core CPU (docs/tasks.md): 8
        # slots at 0.5 and 6 slots at 0.3 stayed at chance (dev accuracy 0.24, 0.25) for the
        # whole epoch.
        "quick": {"n_keys": 16, "n_values": 16, "n_noise": 16, "n_slots": 4, "noise_fraction": 0.3},
        "tiny": {"n_keys": 8, "n_values": 8, "n_noise": 4, "n_slots": 3, "noise_fraction": 0.3},
    }

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

    @field_validator("noise_fraction")
    @classmethod
    def _fraction_in_range(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise out_of_range("allowed range 0 <= noise_fraction < 1", v)
        return v

    # Token ids: AR's (specials, keys k0.., values v0..), then noise n0.. (disjoint).
    def noise_id(self, noise: torch.Tensor | int) -> torch.Tensor | int:
        return noise + N_SPECIAL + self.n_keys + self.n_values

    def token_names(self) -> list[str]:
        return [*super().token_names(), *(f"n{i}" for i in range(self.n_noise))]

    def max_length(self) -> int:
        return 1 + 2 * self.n_slots + 2  # <bos> slots <div> q

    def generate(self, split: str, n: int, shared: None = None) -> Documents:
        return generate_noisy_ar(self, split, n)

    def describe(self, documents: Documents, i: int) -> str:
        return f"  ({int(documents.extras['noise_slots'][i])} of {self.n_slots} slots noise)"

    def stats(self, documents: Documents) -> dict[str, torch.Tensor]:
        noise = documents.extras["noise_slots"]
        return {
            "noise slots per document": noise,
            "pairs per document": self.n_slots - noise,
            "noise fraction (of slots)": noise.double() / self.n_slots,
        }


def generate_noisy_ar(cfg: NoisyARConfig, split: str, n: int) -> Documents:
    """``n`` documents of ``split``."""
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

    pairs = torch.stack([cfg.key_id(keys), cfg.value_id(values)], dim=2)
    slots = torch.where(noise[:, :, None], cfg.noise_id(noise_tokens), pairs)
    width = 2 * s + 3
    tokens = torch.empty(n, width, dtype=torch.long)
    tokens[:, 0] = BOS
    tokens[:, 1 : 1 + 2 * s] = slots.reshape(n, 2 * s)
    tokens[:, 2 * s + 1] = DIV
    tokens[:, 2 * s + 2] = cfg.key_id(keys[rows, qi])
    full = torch.full((n,), 2 * s + 1, dtype=torch.long)
    roles = {
        **pair_roles(qi),
        "divider": full,
        "query": full + 1,
    }
    return Documents(
        tokens=tokens,
        answer=cfg.value_id(values[rows, qi]),
        roles=roles,
        lengths=full + 2,
        extras={"noise_slots": noise.sum(dim=1)},
    )
