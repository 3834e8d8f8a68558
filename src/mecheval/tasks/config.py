"""Validated task configs. Defaults are the paper's (Table 3, §4.1, §5.1)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

QUERY_TYPES: tuple[str, ...] = ("parent", "sibling", "grandparent")

#: ATR documents whose yield has fewer terminals than this are rejected, as in the paper's
#: code (tinylang ``PCFG.sample``: ``len(sentence) < 3``).
MIN_YIELD = 3


def _range(msg: str, got: object) -> PydanticCustomError:
    # A custom error keeps pydantic's "Value error, " prefix out of the one-line message;
    # raising it from a field validator puts the offending field in the error's location.
    del got  # errors.describe appends the offending input itself
    return PydanticCustomError("out_of_range", msg)


def _check_split(fraction: float, total: int, what: str) -> None:
    held = round(fraction * total)
    if held < 1 or held >= total:
        raise _range(
            f"holds out {held} of {total} {what} pairs; allowed fractions leave at least one "
            f"test and one train pair, i.e. {0.5 / total:.3g} < fraction < {1 - 0.5 / total:.6g}",
            fraction,
        )


class _Splits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int = Field(0, ge=0, description="data seed: same config, same documents")
    n_train: int = Field(100_032, ge=0, description="training documents (paper: 100,032)")
    n_dev: int = Field(320, ge=0, description="dev documents (paper: 320)")
    n_test: int = Field(320, ge=0, description="test documents (paper: 320)")


class ARConfig(_Splits):
    """Associative recall: ``<bos> k1 v1 ... kn vn <div> q`` → the value after key ``q``."""

    kind: Literal["ar"] = "ar"
    n_keys: int = Field(
        4096, ge=1, description="key vocabulary (paper: |Σ| = 8192 = keys + values)"
    )
    n_values: int = Field(4096, ge=1, description="value vocabulary, disjoint from the keys")
    n_pairs: int = Field(
        16,
        ge=1,
        description=(
            "key-value pairs per document. The paper's text says 32 pairs, but its released "
            "code draws L/2 pairs for context length L = 32, i.e. 16 pairs = 32 tokens; we "
            "follow the code"
        ),
    )
    min_pairs: int | None = Field(
        None, ge=1, description="fewest pairs when lengths vary (default: n_pairs, fixed length)"
    )
    split_pairs: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="fraction of (key, value) pairs held out: only test documents query them",
    )

    @field_validator("n_pairs")
    @classmethod
    def _pairs_fit(cls, v: int, info: ValidationInfo) -> int:
        # Distinct keys and values per document: more pairs than either vocabulary is impossible.
        limit = min(info.data.get("n_keys", v), info.data.get("n_values", v))
        if v > limit:
            raise _range(
                f"distinct keys and values per document need 1..{limit} (= min(n_keys, n_values))",
                v,
            )
        return v

    @field_validator("min_pairs")
    @classmethod
    def _min_fits(cls, v: int | None, info: ValidationInfo) -> int | None:
        n_pairs = info.data.get("n_pairs")
        if v is not None and n_pairs is not None and v > n_pairs:
            raise _range(f"allowed 1..n_pairs={n_pairs}", v)
        return v

    @field_validator("split_pairs")
    @classmethod
    def _split_leaves_both(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is None or "n_keys" not in info.data or "n_values" not in info.data:
            return v
        _check_split(v, info.data["n_keys"] * info.data["n_values"], "(key, value)")
        return v

    @property
    def pairs_min(self) -> int:
        return self.n_pairs if self.min_pairs is None else self.min_pairs


class ATRConfig(_Splits):
    """Associative treecall over a random head-marked PCFG (§5.1, Appendix B; see pcfg.py)."""

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
    split: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="fraction of (query, answer) terminal pairs seen only in test (App. D.2)",
    )

    @field_validator("split")
    @classmethod
    def _split_leaves_both(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is None or "n_terminals" not in info.data:
            return v
        _check_split(v, info.data["n_terminals"] ** 2, "(query, answer)")
        return v

    @property
    def query_types(self) -> tuple[str, ...]:
        return QUERY_TYPES if self.query == "mixed" else (self.query,)


TaskConfig = Annotated[ARConfig | ATRConfig, Field(discriminator="kind")]
