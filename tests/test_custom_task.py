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
    Documents,
    TaskConfigBase,
    build_datasets,
    corrupt,
    register_task,
    task_label,
)
from mecheval.tasks.base import SPLIT_IDS, torch_generator
from mecheval.tasks.vocab import BOS, DIV, N_SPECIAL
from mecheval.training.config import config_from_data, resolve
from mecheval.training.presets import preset
from mecheval.training.run import train


class ReversedConfig(TaskConfigBase):
    label = "Reversed AR"
    default_epochs = 4
    corrupt_to_absent = True
    preset_fields = {"tiny": {"n_train": 64, "n_dev": 16, "n_test": 16}}

    kind: Literal["reversed"] = "reversed"
    n_symbols: int = Field(6, ge=2)
    n_pairs: int = Field(2, ge=1)

    def token_names(self) -> list[str]:
        return [f"k{i}" for i in range(self.n_symbols)] + [f"v{i}" for i in range(self.n_symbols)]

    def max_length(self) -> int:
        return 2 * self.n_pairs + 3

    def key_class(self) -> tuple[int, int]:
        return N_SPECIAL, N_SPECIAL + self.n_symbols

    def generate(self, split: str, n: int, shared: None) -> Documents:
        gen = torch_generator(self.seed, SPLIT_IDS[split])
        p = self.n_pairs
        keys = torch.rand(n, self.n_symbols, generator=gen).argsort(1)[:, :p]  # distinct keys
        values = torch.randint(self.n_symbols, (n, p), generator=gen)
        asked = torch.randint(p, (n,), generator=gen)
        rows = torch.arange(n)
        tokens = torch.empty(n, 2 * p + 3, dtype=torch.long)
        tokens[:, 0] = BOS
        tokens[:, 1 : 2 * p + 1 : 2] = values + N_SPECIAL + self.n_symbols
        tokens[:, 2 : 2 * p + 2 : 2] = keys + N_SPECIAL
        tokens[:, 2 * p + 1] = DIV
        tokens[:, 2 * p + 2] = keys[rows, asked] + N_SPECIAL
        key = 2 + 2 * asked
        full = torch.full((n,), 2 * p + 2)
        roles = {"key": key, "value": key - 1, "next_key": key + 2, "divider": full - 1}
        return Documents(
            tokens=tokens,
            answer=values[rows, asked] + N_SPECIAL + self.n_symbols,
            roles={**roles, "query": full},
            lengths=full + 1,
        )


@pytest.fixture
def reversed_task():
    register_task(ReversedConfig)
    yield ReversedConfig
    del TASKS["reversed"]


def test_its_documents_roles_and_corruption(reversed_task) -> None:
    cfg = ReversedConfig(n_train=40, n_dev=8, n_test=8)
    assert cfg.vocab_size() == N_SPECIAL + 12 == len(cfg.id_names())
    assert cfg.max_length() == 7
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
    # Its preset_fields, the tiny recipe's model and training.
    assert cfg.task.n_train == 64 and cfg.training.steps == 40 and cfg.model.d_model == 16
    status = train(cfg, tmp_path / "r")
    assert status["state"] == "done", status
    measured = intervene_run(tmp_path / "r", InterventionPlan(split="dev"))
    assert measured is not None
    assert measured.label.site == "layers.1.input"
    assert set(measured.rows["role"]) >= {"key", "value", "query"}


def test_unknown_and_unregistered_kinds_are_one_line_errors(reversed_task) -> None:
    with pytest.raises(ConfigError, match="task"):
        config_from_data({"task": {"kind": "nope"}})
    assert task_label("reversed") == "Reversed AR"  # how reports name it
    paper = preset("paper", "reversed")  # the paper recipe at the task's defaults
    assert paper["task"] == {"kind": "reversed"} and paper["training"]["epochs"] == 4
    del TASKS["reversed"]
    try:
        with pytest.raises(ConfigError, match="reversed"):
            preset("tiny", "reversed")
        assert task_label("reversed") == "REVERSED"  # a results folder of an unloaded plugin
    finally:
        register_task(ReversedConfig)
    with pytest.raises(ConfigError, match="registered twice"):
        register_task(ReversedConfig)


def test_a_config_class_without_a_kind_is_refused() -> None:
    class Kindless(TaskConfigBase):
        n_symbols: int = 3

    with pytest.raises(ConfigError, match="Kindless: declares no kind"):
        register_task(Kindless)


def test_task_show_prints_its_documents(reversed_task, monkeypatch, capsys) -> None:
    from small_runs import run_cli

    code, out, _ = run_cli(monkeypatch, capsys, "task", "show", "reversed", "-n", "2")
    assert code == 0, out
    assert out.count("<bos>") == 2 and "-> v" in out
