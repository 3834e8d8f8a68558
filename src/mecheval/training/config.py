"""A run's config: task + model + training recipe, loaded from YAML with dotted overrides.

The paper's recipe (§4.1) is the default: AdamW β=(0.9, 0.999), ε=1e-8, no weight decay,
linear warm-up over the first 10 % of steps then cosine decay to 0, batch 32, 16 epochs for
AR and 32 for ATR.
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, field_validator
from pydantic_core import PydanticCustomError

from mecheval.errors import ConfigError, validate
from mecheval.io import load_yaml
from mecheval.models import ModelConfig, build_model
from mecheval.models.backbone import uses_position_embedding
from mecheval.models.mixers.base import Mixer
from mecheval.models.registry import ARCHITECTURES
from mecheval.tasks import TASKS, TaskConfig, get_task

#: ``training.precision``: the training step's arithmetic (training/precision.py applies it).
Precision = Literal["fp32", "tf32", "bf16", "bf16-model"]

#: A run folder's name: one path component inside ``--out`` (and not "." or "..").
# "~" (a parallel layer in a hybrid's name) not first, where a shell would read a home folder
RUN_NAME = r"^[A-Za-z0-9._=+-][A-Za-z0-9._=+~-]*$"

#: Evaluations per run when ``eval_every`` is unset.
DEFAULT_EVALS = 20

Split = Literal["train", "dev", "test"]


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-3, gt=0.0, description="peak learning rate")
    batch_size: int = Field(32, ge=1)
    epochs: int | None = Field(
        None, ge=1, description="passes over the train set; unset: the task's (AR 16, ATR 32)"
    )
    steps: int | None = Field(None, ge=1, description="optimizer steps; overrides epochs")
    warmup_fraction: float = Field(0.1, ge=0.0, le=1.0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    train_queries: int = Field(
        1,
        ge=1,
        description=(
            "AR only: extend each training document past its query with more queries about "
            "its own pairs, teacher-forced (<div> q1 a1 q2 a2 ... qQ), loss at every query. "
            "The paper's document is a prefix of each, evaluation documents are unchanged; "
            "1 = the paper's recipe"
        ),
    )
    grad_clip: float | None = Field(None, gt=0.0, description="max grad norm; unset: no clipping")
    stop_at_accuracy: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description=(
            "stop at the first evaluation whose dev accuracy is at least this (zoology's "
            "early stopping, on at 0.99 there); the LR schedule stays the full run's, so the "
            "run up to that step is the full run's exactly. Unset: train every step (the paper)"
        ),
    )
    seed: int = Field(0, ge=0, description="model init and data order (the data seed is task.seed)")
    eval_every: int | None = Field(None, ge=1, description=f"steps; unset: {DEFAULT_EVALS} evals")
    checkpoint_every: int | None = Field(None, ge=1, description="steps; unset: eval_every")
    keep_checkpoint: bool = Field(False, description="keep the training state after a run is done")
    eval_splits: list[Split] = Field(default_factory=lambda: ["dev", "test"])
    eval_at_end: list[Split] = Field(
        default_factory=list,
        description=(
            "splits evaluated at the run's last evaluation only (its last step, or the one "
            "training.stop_at_accuracy stops it at), after eval_splits: their final metrics "
            "without the curve, at a fraction of the time"
        ),
    )
    eval_batch_size: int | None = Field(None, ge=1, description="unset: batch_size")
    threads: int | None = Field(None, ge=1, description="torch CPU threads; unset: leave as is")
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?|mps)$")
    precision: Precision = Field(
        "fp32",
        description=(
            "training-step arithmetic: fp32; tf32 (CUDA matmuls and convolutions in TF32, a "
            "no-op elsewhere); bf16 (forward and loss under bfloat16 autocast, float32 "
            "weights and optimizer); bf16-model (a bfloat16 model, as the paper's later code "
            "casts one: bf16 autocast, and weights, gradients and AdamW moments rounded to "
            "bfloat16 at every step). Evaluation is always float32. Part of the run's identity: "
            "it changes results"
        ),
    )
    compile: bool = Field(
        False,
        description=(
            "train through torch.compile(model) (single runs only: a train_group stack trains "
            "uncompiled); evaluation and interventions use the plain module. Changes speed, "
            "not what is computed (equal to float32 rounding), so a run may be resumed or "
            "skipped with another value"
        ),
    )

    kernels: Literal["reference", "fused"] = Field(
        "reference",
        description=(
            "fused: on CUDA, the training forward uses mamba-ssm's selective scan and "
            "causal-conv1d's short convolution where installed (pip install "
            "'mecheval[cuda]'); evaluation and interventions keep the reference code. Changes "
            "speed, not what is computed (equal to float32 rounding)"
        ),
    )

    log: list[Literal["tensorboard", "wandb"]] = Field(
        default_factory=list,
        description=(
            "experiment trackers the run also logs its metrics and emergence restores to: "
            "tensorboard, wandb or both (comma-separated, e.g. --set training.log=tensorboard), "
            "each an optional extra. Changes what is shown, not what is computed"
        ),
    )

    @field_validator("log", mode="before")
    @classmethod
    def _split_log(cls, log: Any) -> Any:
        # --set training.log=tensorboard,wandb arrives as one string; none or "" logs nowhere.
        if isinstance(log, str):
            log = [name.strip() for name in log.split(",")]
            log = [name for name in log if name not in ("", "none")]
        return list(dict.fromkeys(log)) if isinstance(log, list) else log  # each once

    @field_validator("betas")
    @classmethod
    def _check_betas(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError("each beta must be in [0, 1)")
        return betas


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, description="run folder name")
    task: SerializeAsAny[TaskConfig]  # any registered task's config, chosen by its kind
    model: ModelConfig = Field(default_factory=ModelConfig)
    training: TrainConfig = Field(default_factory=TrainConfig)

    @field_validator("name")
    @classmethod
    def _inside_out(cls, name: str | None) -> str | None:
        if name is not None and (name in (".", "..") or not re.fullmatch(RUN_NAME, name)):
            raise ValueError(
                "expected one folder name inside --out (letters, digits and . _ = + -, and ~ "
                "after the first)"
            )
        return name

    @field_validator("task", mode="wrap")
    @classmethod
    def _registered_task(cls, data: Any, handler: Any) -> TaskConfig:
        if isinstance(data, TaskConfig):
            return data
        kind = data.get("kind") if isinstance(data, dict) else None
        if kind not in TASKS:
            raise PydanticCustomError("unknown_task", f"kind must be one of: {', '.join(TASKS)}")
        # Its ValidationError keeps the field's location (task.n_pairs), for errors.describe.
        return get_task(kind).model_validate(data)


# --------------------------------------------------------------------------- derived values


def steps_per_epoch(cfg: RunConfig) -> int:
    # Partial batches are dropped so every step sees batch_size documents (the paper's
    # 100,032 train documents are an exact multiple of 32 anyway).
    return max(1, cfg.task.n_train // cfg.training.batch_size)


def total_steps(cfg: RunConfig) -> int:
    t = cfg.training
    if t.steps is not None:
        return t.steps
    epochs = t.epochs if t.epochs is not None else cfg.task.default_epochs
    return epochs * steps_per_epoch(cfg)


def warmup_steps(cfg: RunConfig) -> int:
    return round(cfg.training.warmup_fraction * total_steps(cfg))


def default_name(cfg: RunConfig) -> str:
    m, t = cfg.model, cfg.training
    return f"{cfg.task.kind}-{m.architecture}-d{m.d_model}-L{m.n_layers}-lr{t.lr:g}-s{t.seed}"


def check_finite(cfg: RunConfig) -> None:
    """Raise ConfigError naming the first field that holds inf or nan (pydantic's bounds let
    ``lr=inf`` through, and a plugin's mixer options may have no bounds at all)."""

    def walk(node: Any, path: str) -> None:
        if isinstance(node, float) and not math.isfinite(node):
            raise ConfigError(f"{path}: expected a finite number (got {node})")
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else str(key))
        elif isinstance(node, list | tuple):
            for i, value in enumerate(node):
                walk(value, f"{path}.{i}")

    walk(cfg.model_dump(), "")  # python mode: JSON mode would turn inf into null


def check_buildable(model: ModelConfig, length: int) -> None:
    """Build the model on the meta device (no memory, no arithmetic), so that an option its
    architecture cannot take with this shape (e.g. an H3 head_dim that does not divide d_model),
    or a mixer that cannot take the task's ``length``-token documents, is a ConfigError when
    the config is resolved, before any run folder is written."""
    shortest = _shortest_limit(model)
    if shortest is not None and shortest < length:
        raise ConfigError(
            f"model.mixer.l_max: {shortest} is shorter than the task's longest document "
            f"({length} tokens); lower the task's document length or raise l_max"
        )


#: :func:`_shortest_limit` by model config and the architectures registered when it was
#: built: the runs of a grid that differ only in training share one build.
_LIMITS: dict[tuple, int | None] = {}


def _shortest_limit(model: ModelConfig) -> int | None:
    """The longest document every mixer of ``model`` takes (None: no limit), from a build
    on the meta device."""
    key = (model.model_dump_json(), tuple(ARCHITECTURES.values()))
    if key not in _LIMITS:
        with torch.device("meta"):
            built = build_model(model)
        limits = [m.max_length() for m in built.modules() if isinstance(m, Mixer)]
        if len(_LIMITS) >= 256:
            _LIMITS.clear()
        _LIMITS[key] = min((n for n in limits if n is not None), default=None)
    return _LIMITS[key]


def check_device(device: str, field: str = "training.device") -> None:
    """ConfigError unless this machine has ``device`` (cpu | cuda | cuda:N | mps). Checked
    where a run starts or a model is loaded, not when a config is read: a run trained on a
    GPU is still read, reported and loaded on a machine without one."""
    kind, _, index = device.partition(":")
    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            raise ConfigError(f"{field}: {device!r}, but this machine has no CUDA device")
        if index and int(index) >= count:
            raise ConfigError(
                f"{field}: {device!r}, but this machine has {count} CUDA device"
                f"{'s' if count > 1 else ''} (cuda:0{f' .. cuda:{count - 1}' if count > 1 else ''})"
            )
    elif kind == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{field}: {device!r}, but this machine has no MPS (Apple GPU)")
    elif kind not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"{field}: expected cpu, cuda, cuda:N or mps, got {device!r}")


def document_length(cfg: RunConfig) -> int:
    """The longest sequence a run of ``cfg`` feeds its model: the task's longest document,
    plus the extra queries a training step may add."""
    length = cfg.task.max_length()
    queries = cfg.training.train_queries
    if queries > 1:
        length += cfg.task.check_train_queries(queries)
    return length


def check_model(cfg: RunConfig) -> None:
    """:func:`check_buildable` of a resolved config's model."""
    check_buildable(cfg.model, document_length(cfg))


def resolve(cfg: RunConfig, build_check: bool = True) -> RunConfig:
    """Fill every unset field that has a derived value, so the dumped config is explicit.
    ``build_check=False`` leaves out :func:`check_model` (for a run a finished folder shows
    was built: the caller checks the others)."""
    check_finite(cfg)
    # With explicit steps too: every step draws whole batches of the train set.
    if cfg.task.n_train < cfg.training.batch_size:
        raise ConfigError(
            f"training.batch_size: {cfg.training.batch_size} exceeds task.n_train="
            f"{cfg.task.n_train}"
        )
    vocab, length = cfg.task.vocab_size(), document_length(cfg)
    model = cfg.model
    if model.vocab_size is not None and model.vocab_size < vocab:
        raise ConfigError(
            f"model.vocab_size: {model.vocab_size} is smaller than the task's {vocab}"
        )
    if model.max_len is not None and model.max_len < length:
        raise ConfigError(
            f"model.max_len: {model.max_len} is shorter than the task's documents ({length} tokens)"
        )
    model = model.model_copy(
        update={
            "vocab_size": model.vocab_size if model.vocab_size is not None else vocab,
            "max_len": model.max_len if model.max_len is not None else length,
            "position_embedding": uses_position_embedding(model),
        }
    )
    if build_check:
        check_buildable(model, length)
    t = cfg.training
    if both := sorted(set(t.eval_splits) & set(t.eval_at_end)):
        raise ConfigError(
            f"training.eval_at_end: {both} already in training.eval_splits (evaluated at "
            "every evaluation); name a split in one of the two"
        )
    if t.stop_at_accuracy is not None and "dev" not in t.eval_splits:
        raise ConfigError(
            "training.stop_at_accuracy: reads the dev accuracy, but training.eval_splits "
            f"{t.eval_splits} has no 'dev'"
        )
    total = total_steps(cfg)
    # With an explicit step count, epochs would be a misleading number in the dumped config.
    epochs = t.epochs
    if epochs is None and t.steps is None:
        epochs = cfg.task.default_epochs
    eval_every = (
        t.eval_every if t.eval_every is not None else max(1, math.ceil(total / DEFAULT_EVALS))
    )
    training = t.model_copy(
        update={
            "epochs": epochs,
            "eval_every": eval_every,
            "checkpoint_every": t.checkpoint_every
            if t.checkpoint_every is not None
            else eval_every,
            "eval_batch_size": t.eval_batch_size if t.eval_batch_size is not None else t.batch_size,
        }
    )
    resolved = cfg.model_copy(
        update={"model": model, "training": training, "name": cfg.name or default_name(cfg)}
    )
    # Round-trip through validation so a resolved config is exactly what load_config returns.
    return validate(RunConfig, resolved.model_dump(mode="json"))


# --------------------------------------------------------------------------- YAML in and out


def parse_override(text: str) -> tuple[list[str], Any]:
    """``training.lr=1e-3`` -> (["training", "lr"], 0.001); the value is parsed as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(
            f"--set {text!r}: expected KEY=VALUE with a dotted key, e.g. training.lr=1e-3"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        raise ConfigError(f"--set {key}: cannot parse {raw!r} ({err.__class__.__name__})") from None
    return key.split("."), value


def set_field(data: dict[str, Any], path: list[str], value: Any) -> None:
    """Set the dotted field ``path`` of config ``data`` to ``value`` in place, making the
    mappings on the way (``--set`` names the field in the message where one is not a mapping)."""
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            where = ".".join(path[: i + 1])
            raise ConfigError(f"--set {'.'.join(path)}: {where} is not a mapping")
        node = child
    node[path[-1]] = value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``data`` with the ``a.b=value`` overrides applied, as a new mapping: the caller's (a
    sweep's base, shared by all its runs) must not carry one run's values into the next."""
    data = copy.deepcopy(data)
    for text in overrides:
        set_field(data, *parse_override(text))
    return data


def config_from_data(
    data: Any, overrides: list[str] | None = None, source: str = "config"
) -> RunConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: expected a mapping at the top level, got {type(data).__name__}"
        )
    data = apply_overrides(data, list(overrides or []))
    return validate(RunConfig, data)


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML run config, apply ``a.b=value`` overrides, and validate it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{path}: cannot read ({err.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (expected a YAML run config)") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}:{where} invalid YAML") from None
    return config_from_data(data, overrides, source=str(path))


def config_to_data(cfg: RunConfig) -> dict[str, Any]:
    data = cfg.model_dump(mode="json")
    if data["model"].get("layers") is None:
        # One architecture for every layer: written as before hybrids existed.
        del data["model"]["layers"]
    return data


def dump_yaml(cfg: RunConfig) -> str:
    return yaml.safe_dump(config_to_data(cfg), sort_keys=False, default_flow_style=False)
