"""Models whose mechanism is known (models/known.py): an induction circuit set by hand, alone
and with a pass-through Mamba layer before or after it. The exact protocol must read the
label the weights were built to have, and the circuit is checked on its own terms first:
the copy layer writes each position's previous token, the model answers every document."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mecheval.errors import ConfigError
from mecheval.experiments.mechanisms import InterventionPlan, intervene_run
from mecheval.interventions.patch import record
from mecheval.models import ModelConfig
from mecheval.models.known import induction_by_hand
from mecheval.tasks import build_datasets, parse_task
from mecheval.training import load_run, resolve, train
from mecheval.training.config import config_from_data

TASK = {"kind": "ar", "n_keys": 8, "n_values": 8, "n_pairs": 4}
SPLITS = {"n_train": 64, "n_dev": 64, "n_test": 64}


def run_folder(tmp_path: Path, layers: list[str]) -> tuple:
    """A run folder of ``layers`` (trained one step, for its config and data), and its config."""
    data = {
        "task": {**TASK, **SPLITS},
        "model": {"layers": layers, "d_model": 64, "position_embedding": True},
        "training": {"lr": 1e-3, "steps": 1, "eval_every": 1, "batch_size": 16},
    }
    run_dir = tmp_path / "-".join(layers)
    train(resolve(config_from_data(data)), run_dir)
    cfg, _ = load_run(run_dir, "cpu")
    return run_dir, cfg


def test_the_circuit_copies_the_previous_token_and_answers_every_document(tmp_path) -> None:
    _, cfg = run_folder(tmp_path, ["attention", "attention"])
    model = induction_by_hand(cfg.model, copy=0, read=1).eval()
    batch = build_datasets(parse_task({**TASK, **SPLITS}))["test"].batch(torch.arange(64))
    with torch.no_grad(), record(model, ["layers.1.input"]) as seen:
        logits = model(batch.tokens)
    vocab = cfg.model.vocab_size
    previous = seen["layers.1.input"][:, 1:, vocab : 2 * vocab].argmax(-1)
    assert torch.equal(previous, batch.tokens[:, :-1])  # position p holds token p - 1
    rows = torch.arange(64)
    answers = logits[rows, batch.roles["query"]].argmax(-1)
    assert torch.equal(answers, batch.answer)


@pytest.mark.parametrize(
    ("layers", "copy", "read", "label"),
    [
        (["attention", "attention"], 0, 1, "induction"),
        (["mamba", "attention", "attention"], 1, 2, "induction in layer 2 (attention)"),
        (["attention", "attention", "mamba"], 0, 1, "induction in layer 1 (attention)"),
    ],
)
def test_the_protocol_reads_the_mechanism_the_weights_were_built_to_have(
    tmp_path, layers: list[str], copy: int, read: int, label: str
) -> None:
    run_dir, cfg = run_folder(tmp_path, layers)
    model = induction_by_hand(cfg.model, copy, read).eval()
    read_ = intervene_run(run_dir, InterventionPlan(split="dev"), loaded=(cfg, model)).label
    assert read_.label == label
    assert read_.original > 0.99 and read_.corrupted < 0.01
    # After a pass-through last layer the label site (its input) already holds the answer
    # at the query; the carrier finds the layer that put it there, reading the value.
    assert read_.role == ("query" if layers[-1] == "mamba" else "value")
    if len(set(layers)) > 1:
        assert (read_.carrier.layer, read_.carrier.reads) == (read, "induction")


@pytest.mark.parametrize(
    ("layers", "copy", "read", "d_model", "says"),
    [
        (["attention", "attention"], 0, 1, 40, "model.d_model: induction_by_hand needs"),
        (["mamba", "attention"], 0, 1, 64, "model.layers[0]: induction_by_hand needs one-head"),
        (["deltanet", "attention", "attention"], 1, 2, 64, "DeltaNet has none"),
        (["attention", "attention"], 1, 0, 64, "need 0 <= copy < read < 2"),
    ],
)
def test_impossible_circuits_are_one_line(layers, copy, read, d_model, says) -> None:
    cfg = ModelConfig(
        layers=layers, d_model=d_model, vocab_size=19, max_len=11, position_embedding=True
    )
    with pytest.raises(ConfigError) as err:
        induction_by_hand(cfg, copy, read)
    assert says in str(err.value) and "\n" not in str(err.value)
