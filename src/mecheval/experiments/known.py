"""``mecheval reproduce known-mechanisms``: models whose mechanism is known because their
weights are set by hand (models/known.py), written as run folders and read by the exact
interchange protocol and by the gradient estimators (attribution patching, integrated
gradients), each label beside the one the model was built to have.

A label the protocol does not recover on a model built to have it is a finding, shown in
the table (and counted in its last line), not an error: the command exits 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from mecheval.errors import ConfigError
from mecheval.experiments.mechanisms import InterventionPlan, intervene_run
from mecheval.interventions.attribution import METHODS
from mecheval.io import atomic_save_safetensors, atomic_write_text
from mecheval.models.backbone import LanguageModel
from mecheval.models.known import (
    attention_retrieves_by_hand,
    candidates_by_hand,
    conv_induction_by_hand,
    direct_retrieval_by_hand,
    induction_by_hand,
    parity_by_hand,
)
from mecheval.tasks.vocab import BOS
from mecheval.training.config import RunConfig, config_from_data, dump_yaml, resolve
from mecheval.training.folder import CONFIG_FILE, MODEL_FILE, write_status
from mecheval.training.presets import check_preset

#: The experiment's name, as ``reproduce`` takes it.
NAME = "known-mechanisms"
DESCRIPTION = (
    "Models built by hand to have a known mechanism (induction, direct retrieval in layer 0 "
    "and later, candidates only, a reassigned value held in a state, parity carried in a "
    "state; attention, DeltaNet, Mamba, Hyena and BaseConv, alone and in hybrids): the label each "
    "method reads beside the one built in"
)

#: AR small enough for three one-hot blocks of d = 64 (vocabulary 19, 11 positions), with
#: dev documents enough that a guess among 4 values reads as chance.
AR = {"kind": "ar", "n_keys": 8, "n_values": 8, "n_pairs": 4}
REASSIGN = {
    "kind": "reassign_ar",
    "n_keys": 8,
    "n_values": 8,
    "n_pairs": 3,
    "n_changes": 3,
    "query_changes": 2,
}
#: Parity of up to 16 elements (17 positions: two one-hot blocks and the positions fit d = 64).
PARITY = {"kind": "parity", "max_elements": 16}
SPLITS = {"n_train": 64, "n_dev": 320, "n_test": 64}
#: The dev documents read per preset where not SPLITS' (tiny: a smoke test of the pipeline).
DEV_DOCUMENTS = {"tiny": 64}


@dataclass(frozen=True)
class KnownModel:
    """A model built by hand: its layers, its task, how its weights are set (from the
    resolved run config), and the label it was built to have."""

    name: str
    layers: tuple[str, ...]
    build: Callable[[RunConfig], LanguageModel]
    label: str
    task: dict[str, Any] | None = None  # AR where None
    positions: bool = False
    mixer: dict[str, Any] | None = None  # every layer's mixer options, where not the defaults
    model: dict[str, Any] | None = None  # the model's other options, where not the defaults


def _induction(copy: int, read: int) -> Callable[[RunConfig], LanguageModel]:
    return lambda cfg: induction_by_hand(cfg.model, copy, read)


def _conv_induction(copy: int, read: int) -> Callable[[RunConfig], LanguageModel]:
    def build(cfg: RunConfig) -> LanguageModel:
        task = cfg.task
        keys = [int(task.key_id(i)) for i in range(task.n_keys)]
        values = [int(task.value_id(i)) for i in range(task.n_values)]
        return conv_induction_by_hand(cfg.model, copy, read, keys, values)

    return build


def _direct(layer: int) -> Callable[[RunConfig], LanguageModel]:
    def build(cfg: RunConfig) -> LanguageModel:
        task = cfg.task
        keys = [int(task.key_id(i)) for i in range(task.n_keys)]  # Mamba's columns
        values = [int(task.value_id(i)) for i in range(task.n_values)]  # Hyena's channels
        return direct_retrieval_by_hand(cfg.model, layer, keys, values)

    return build


def _parity(layer: int) -> Callable[[RunConfig], LanguageModel]:
    def build(cfg: RunConfig) -> LanguageModel:
        task = cfg.task
        states = (int(task.state_id(0)), int(task.state_id(1)))
        elements = (int(task.element_id(0)), int(task.element_id(1)))
        return parity_by_hand(cfg.model, layer, BOS, elements, states)

    return build


def _attention_direct(layer: int) -> Callable[[RunConfig], LanguageModel]:
    return lambda cfg: attention_retrieves_by_hand(cfg.model, layer)


def _candidates(layer: int) -> Callable[[RunConfig], LanguageModel]:
    return lambda cfg: candidates_by_hand(cfg.model, layer, int(cfg.task.value_id(0)))


HELD = "held in the state before the query"
KNOWN: tuple[KnownModel, ...] = (
    KnownModel("induction", ("attention",) * 2, _induction(0, 1), "induction", positions=True),
    KnownModel(
        "induction-after-mamba",
        ("mamba", "attention", "attention"),
        _induction(1, 2),
        "induction in layer 2 (attention)",
        positions=True,
    ),
    KnownModel(
        "induction-before-mamba",
        ("attention", "attention", "mamba"),
        _induction(0, 1),
        "induction in layer 1 (attention)",
        positions=True,
    ),
    KnownModel(
        "induction-baseconv-deltanet",
        ("baseconv", "deltanet"),
        _conv_induction(0, 1),
        "induction in layer 1 (deltanet)",
    ),
    KnownModel(
        "induction-baseconv-mamba",
        ("baseconv", "mamba"),
        _conv_induction(0, 1),
        "induction in layer 1 (mamba)",
    ),
    KnownModel(
        "induction-baseconv-hyena",
        ("baseconv", "hyena"),
        _conv_induction(0, 1),
        "induction in layer 1 (hyena)",
    ),
    KnownModel("direct-layer-0", ("deltanet",) * 2, _direct(0), "direct retrieval, layer 0"),
    KnownModel("direct-layer-1", ("deltanet",) * 2, _direct(1), "direct retrieval, layer >= 1"),
    KnownModel(
        "direct-before-attention",
        ("deltanet", "attention"),
        _direct(0),
        "direct retrieval in layer 0 (deltanet)",
    ),
    KnownModel(
        "direct-after-mamba",
        ("mamba", "deltanet"),
        _direct(1),
        "direct retrieval in layer 1 (deltanet)",
    ),
    KnownModel("direct-mamba-layer-0", ("mamba",) * 2, _direct(0), "direct retrieval, layer 0"),
    KnownModel(
        "direct-mamba-after-attention",
        ("attention", "mamba"),
        _direct(1),
        "direct retrieval in layer 1 (mamba)",
    ),
    KnownModel(
        "direct-attention-layer-0",
        ("attention",) * 2,
        _attention_direct(0),
        "direct retrieval, layer 0",
        model={"short_conv": 2},
    ),
    KnownModel(
        "direct-attention-after-mamba",
        ("mamba", "attention"),
        _attention_direct(1),
        "direct retrieval in layer 1 (attention)",
        model={"short_conv": 2},
    ),
    KnownModel("direct-hyena-layer-0", ("hyena",) * 2, _direct(0), "direct retrieval, layer 0"),
    KnownModel(
        "direct-hyena-after-attention",
        ("attention", "hyena"),
        _direct(1),
        "direct retrieval in layer 1 (hyena)",
    ),
    KnownModel(
        "candidates-only", ("attention",) * 2, _candidates(1), "candidates only (no binding)"
    ),
    KnownModel(
        "candidates-only-baseconv",
        ("attention", "baseconv"),
        _candidates(1),
        "candidates only (no binding)",
    ),
    KnownModel(
        "candidates-only-mamba", ("mamba",) * 2, _candidates(0), "candidates only (no binding)"
    ),
    KnownModel(
        "candidates-only-deltanet",
        ("attention", "deltanet"),
        _candidates(1),
        "candidates only (no binding)",
    ),
    KnownModel(
        "reassign-held-layer-0",
        ("deltanet",) * 2,
        _direct(0),
        f"direct retrieval, layer 0; {HELD} (layer 0)",
        task=REASSIGN,
    ),
    KnownModel(
        "reassign-held-layer-1",
        ("mamba", "deltanet"),
        _direct(1),
        f"direct retrieval in layer 1 (deltanet); {HELD} (layer 1)",
        task=REASSIGN,
    ),
    *(
        KnownModel(
            f"parity-state-{arch}",
            (arch,) * 2,
            _parity(0),
            "in the state after it",
            task=PARITY,
            mixer={"allow_neg_eigval": True},
        )
        for arch in ("mamba", "deltanet")
    ),
)


def known_config(known: KnownModel, preset: str = "quick") -> RunConfig:
    """The resolved run config of a known model (d = 64; its training section is unused);
    the ``preset`` sets how many dev documents it is read on (DEV_DOCUMENTS)."""
    splits = {**SPLITS, "n_dev": DEV_DOCUMENTS.get(preset, SPLITS["n_dev"])}
    data = {
        "task": {**(known.task or AR), **splits},
        "model": {
            "layers": [{"architecture": name, "mixer": known.mixer or {}} for name in known.layers],
            "d_model": 64,
            "position_embedding": known.positions,
            **(known.model or {}),
        },
        "training": {"lr": 1e-3, "steps": 1},
    }
    return resolve(config_from_data(data, [f"name={known.name}"]))


def write_known(run_dir: Path, known: KnownModel, preset: str = "quick") -> RunConfig:
    """A run folder of the known model: its config, its hand-set weights and a done status
    at step 0 (built, not trained), so that every reading command reads it as a run. The
    weights the mechanism leaves alone are drawn from the run's seed: the same file each time."""
    cfg = known_config(known, preset)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.training.seed)
        model = known.build(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / CONFIG_FILE, dump_yaml(cfg))
    atomic_save_safetensors(run_dir / MODEL_FILE, model.state_dict())
    write_status(run_dir, state="done", reason=None, step=0, total_steps=0, built_by_hand=True)
    return cfg


def read_known(
    out_dir: Path,
    cases: Sequence[KnownModel] = KNOWN,
    methods: Sequence[str] = METHODS,
    preset: str = "quick",
) -> pd.DataFrame:
    """Write each known model into ``out_dir``/<name>/ and read it on the ``preset``'s dev
    documents: one row per model with the label built in, the exact protocol's, and each
    method's."""
    rows = []
    plan = InterventionPlan(split="dev", methods=tuple(methods))
    for known in cases:
        run_dir = out_dir / known.name
        write_known(run_dir, known, preset)
        measured = intervene_run(run_dir, plan)
        assert measured is not None and measured.label is not None
        row = {
            "model": known.name,
            "layers": "+".join(known.layers),
            "task": (known.task or AR)["kind"],
            "built as": known.label,
            "exact": measured.label.label,
        }
        for graded in measured.graded:
            row[graded.method] = graded.record["label"]
        rows.append(row)
    return pd.DataFrame(rows)


#: The options of ``reproduce`` that shape a sweep, which models built by hand do not take.
NOT_TAKEN = ("--archs", "--tasks", "--widths", "--lrs", "--seeds", "--set", "--device")


def reproduce_known(out: Path, preset: str, given: Mapping[str, Any]) -> str:
    """``mecheval reproduce known-mechanisms``: every known model built and read under
    ``out``/known-mechanisms/ at ``preset``; its table as markdown. A sweep option in
    ``given`` (flag -> value, as the user gave it) is an error before anything is written."""
    for flag, value in given.items():
        if value:
            raise ConfigError(f"{flag}: {NAME} builds its models by hand; no {flag}")
    check_preset(preset)
    return known_markdown(read_known(out / NAME, preset=preset))


def known_markdown(table: pd.DataFrame, methods: Sequence[str] = METHODS) -> str:
    """The table, each reading marked where it differs from the label built in, and a line
    counting how many each method read as built."""
    shown = table.copy()
    for column in ("exact", *methods):
        shown[column] = [
            read if read == built else f"{read} (differs)"
            for read, built in zip(table[column], table["built as"], strict=True)
        ]
    counts = ", ".join(
        f"{column} {int((table[column] == table['built as']).sum())}"
        for column in ("exact", *methods)
    )
    return (
        "## known-mechanisms: labels read from models built to have them\n\n"
        + shown.to_markdown(index=False)
        + f"\n\nRead as built, of {len(table)}: {counts}.\n"
    )
