"""A task defined outside the package joins every stage through one registry call
(docs/architecture.md, "How to add ..."): its documents, corruption, presets, run configs,
training, interventions and ``mecheval task show`` work without touching ``mecheval/``.

The toy task, *reversed recall*: ``<bos> v1 k1 v2 k2 ... <div> q`` -> the value written just
before key q (AR with each pair's order swapped, so the value precedes its key).
"""

from __future__ import annotations

from typing import Literal

import pytest
import torch
from pydantic import Field

from mecheval.errors import ConfigError
from mecheval.experiments.mechanisms import InterventionPlan, intervene_run
from mecheval.tasks import (
    SPLITS,
    TASKS,
    Task,
    TaskConfigBase,
    build_datasets,
    corrupt,
    max_length,
    register_task,
    token_names,
    vocab_size,
)
from mecheval.tasks.base import SPLIT_IDS, torch_generator
from mecheval.tasks.vocab import BOS, DIV, N_SPECIAL
from mecheval.training.config import config_from_data, resolve
from mecheval.training.presets import preset
from mecheval.training.run import train


class ReversedConfig(TaskConfigBase):
    kind: Literal["reversed"] = "reversed"
    n_symbols: int = Field(6, ge=2)
    n_pairs: int = Field(2, ge=1)


def generate(cfg: ReversedConfig, split: str, n: int, shared: None) -> dict:
    gen = torch_generator(cfg.seed, SPLIT_IDS[split])
    p = cfg.n_pairs
    keys = torch.rand(n, cfg.n_symbols, generator=gen).argsort(1)[:, :p]  # distinct keys
    values = torch.randint(cfg.n_symbols, (n, p), generator=gen)
    asked = torch.randint(p, (n,), generator=gen)
    rows = torch.arange(n)
    tokens = torch.empty(n, 2 * p + 3, dtype=torch.long)
    tokens[:, 0] = BOS
    tokens[:, 1 : 2 * p + 1 : 2] = values + N_SPECIAL + cfg.n_symbols
    tokens[:, 2 : 2 * p + 2 : 2] = keys + N_SPECIAL
    tokens[:, 2 * p + 1] = DIV
    tokens[:, 2 * p + 2] = keys[rows, asked] + N_SPECIAL
    key = 2 + 2 * asked
    full = torch.full((n,), 2 * p + 2)
    return {
        "tokens": tokens,
        "answer": values[rows, asked] + N_SPECIAL + cfg.n_symbols,
        "roles": {
            "key": key,
            "value": key - 1,
            "next_key": key + 2,
            "divider": full - 1,
            "query": full,
        },
        "lengths": full + 1,
        "extras": {},
    }


TINY = {
    "task": {"kind": "reversed", "n_train": 64, "n_dev": 16, "n_test": 16},
    "model": {"d_model": 16, "n_layers": 2},
    "training": {"steps": 6, "batch_size": 8, "eval_every": 3, "lr": 3e-3},
}

REVERSED = Task(
    kind="reversed",
    label="Reversed AR",
    config=ReversedConfig,
    generate=generate,
    token_names=lambda c: (
        [f"k{i}" for i in range(c.n_symbols)] + [f"v{i}" for i in range(c.n_symbols)]
    ),
    max_length=lambda c: 2 * c.n_pairs + 3,
    key_class=lambda c: (N_SPECIAL, N_SPECIAL + c.n_symbols),
    corrupt_to_absent=True,
    default_epochs=4,
    paper_lrs=(1e-3,),
    presets={"tiny": TINY},
)


@pytest.fixture
def reversed_task():
    register_task(REVERSED)
    yield REVERSED
    del TASKS["reversed"]


def test_its_documents_roles_and_corruption(reversed_task) -> None:
    cfg = ReversedConfig(n_train=40, n_dev=8, n_test=8)
    assert vocab_size(cfg) == N_SPECIAL + 12 == len(token_names(cfg))
    assert max_length(cfg) == 7
    datasets = build_datasets(cfg)
    assert [len(datasets[s]) for s in SPLITS] == [40, 8, 8]
    batch = datasets["train"].batch(torch.arange(40))
    rows = torch.arange(40)
    tok = batch.tokens
    # The value before the queried key is the answer; the query repeats that key.
    assert torch.equal(tok[rows, batch.roles["value"]], batch.answer)
    assert torch.equal(tok[rows, batch.roles["key"]], tok[rows, batch.roles["query"]])
    bad = corrupt(batch, cfg, seed=1)
    changed = bad.tokens != tok
    assert torch.equal(changed.nonzero()[:, 1], batch.roles["key"])
    new = bad.tokens[rows, batch.roles["key"]]
    assert bool(((new >= N_SPECIAL) & (new < N_SPECIAL + cfg.n_symbols)).all())
    # corrupt_to_absent: the swapped-in key occurs nowhere else in the document.
    assert bool(((bad.tokens == new[:, None]).sum(1) == 1).all())


def test_it_trains_and_gets_a_mechanism_label(reversed_task, tmp_path) -> None:
    data = preset("tiny", "reversed", "attention")
    cfg = resolve(config_from_data(data, ["name=r"]))
    assert cfg.model.vocab_size == N_SPECIAL + 12 and cfg.model.max_len == 7
    assert cfg.training.epochs is None  # steps given; else the task's default_epochs
    status = train(cfg, tmp_path / "r")
    assert status["state"] == "done", status
    measured = intervene_run(tmp_path / "r", InterventionPlan(split="dev"))
    assert measured is not None
    assert measured.label.site == "layers.1.input"
    assert set(measured.rows["role"]) >= {"key", "value", "query"}


def test_unknown_and_unregistered_kinds_are_one_line_errors(reversed_task) -> None:
    with pytest.raises(ConfigError, match="task"):
        config_from_data({"task": {"kind": "nope"}})
    with pytest.raises(ConfigError, match="paper"):
        preset("paper", "reversed")  # the toy task defines only a tiny preset
    del TASKS["reversed"]
    try:
        with pytest.raises(ConfigError, match="reversed"):
            preset("tiny", "reversed")
    finally:
        register_task(REVERSED)


def test_task_show_prints_its_documents(reversed_task, monkeypatch, capsys) -> None:
    from small_runs import run_cli

    code, out, _ = run_cli(monkeypatch, capsys, "task", "show", "reversed", "-n", "2")
    assert code == 0, out
    assert out.count("<bos>") == 2 and "-> v" in out
