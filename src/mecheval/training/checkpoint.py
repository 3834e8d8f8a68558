"""Training-state checkpoints: tensors in safetensors, scalars in JSON; never pickle.

Layout of ``<run>/checkpoint/``::

    step-000500.safetensors   model.*, optim.<param>.<key>, rng.* tensors
    state.json                step, the tensor file's name, optimizer param groups,
                              scheduler state, and the trainer's own scalars

``state.json`` is the commit point: the tensor file is written first under a new name, then
``state.json`` is atomically replaced to point at it, then older tensor files are removed.
A crash at any moment leaves a consistent checkpoint (the old or the new one).

A checkpoint damaged some other way (a truncated or overwritten file, a disk error) raises
:class:`CorruptCheckpoint`, a one-line message naming the file, before anything is restored:
``training.run.train`` then discards it and trains the run again from step 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from mecheval.errors import first_line
from mecheval.io import atomic_save_safetensors, atomic_write_json, read_json
from mecheval.models.backbone import model_device

FORMAT = 1
STATE_FILE = "state.json"

#: The fields of ``state.json`` and their JSON types.
_STATE_FIELDS: dict[str, type] = {
    "step": int,
    "tensors": str,
    "param_groups": list,
    "optim_scalars": dict,
    "scheduler": dict,
    "trainer": dict,
}


class CorruptCheckpoint(ValueError):
    """A checkpoint that cannot be restored; the message is one line naming the file."""


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        raise TypeError("tensors belong in the safetensors file")
    return value


def rng_tensors(device: torch.device) -> dict[str, torch.Tensor]:
    tensors = {"rng.torch": torch.get_rng_state()}
    if device.type == "cuda":
        tensors["rng.cuda"] = torch.cuda.get_rng_state(device)
    return tensors


def restore_rng(tensors: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(tensors["rng.torch"])
    if device.type == "cuda" and "rng.cuda" in tensors:
        torch.cuda.set_rng_state(tensors["rng.cuda"], device)


def save_checkpoint(
    folder: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scalars: dict[str, Any],
) -> Path:
    """Write the full training state at ``step``; ``scalars`` must be JSON-serialisable."""
    folder.mkdir(parents=True, exist_ok=True)
    device = model_device(model)
    tensors: dict[str, torch.Tensor] = {f"model.{k}": v for k, v in model.state_dict().items()}
    opt = optimizer.state_dict()
    optim_scalars: dict[str, dict[str, Any]] = {}
    for index, state in opt["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{index}.{key}"] = value
            else:
                optim_scalars.setdefault(str(index), {})[key] = value
    tensors.update(rng_tensors(device))
    name = f"step-{step:09d}.safetensors"
    atomic_save_safetensors(folder / name, tensors, metadata={"format": str(FORMAT)})
    sched = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    atomic_write_json(
        folder / STATE_FILE,
        {
            "format": FORMAT,
            "step": step,
            "tensors": name,
            "param_groups": _jsonable(opt["param_groups"]),
            "optim_scalars": _jsonable(optim_scalars),
            "scheduler": _jsonable(sched),
            "trainer": _jsonable(scalars),
        },
    )
    for old in folder.glob("step-*.safetensors"):
        if old.name != name:
            old.unlink(missing_ok=True)
    return folder / STATE_FILE


def has_checkpoint(folder: Path) -> bool:
    return (folder / STATE_FILE).is_file()


def checkpoint_step(folder: Path) -> int | None:
    """The step of the checkpoint in ``folder`` as its ``state.json`` says, or None if that
    cannot be read (the checkpoint is not checked further: see :func:`read_checkpoint`)."""
    try:
        step = read_json(folder / STATE_FILE).get("step")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) and step > 0 else None


def read_checkpoint(
    folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``state.json`` and the tensors of the checkpoint in ``folder``, checked against the
    model and optimizer they are to be restored into; nothing is modified.

    Raises :class:`CorruptCheckpoint` if a file is unreadable, truncated or inconsistent.
    """
    state_path = folder / STATE_FILE
    meta = _read_state(state_path)
    tensor_path = folder / meta["tensors"]
    try:
        tensors = load_file(tensor_path)
    except (OSError, SafetensorError) as err:
        raise CorruptCheckpoint(f"{tensor_path}: unreadable ({first_line(err)})") from None
    _check_tensors(tensor_path, tensors, model, optimizer)
    if len(meta["param_groups"]) != len(optimizer.param_groups):
        raise CorruptCheckpoint(f"{state_path}: {len(meta['param_groups'])} param groups")
    return meta, tensors


def _read_state(state_path: Path) -> dict[str, Any]:
    """``state.json``, checked for its format, its fields and its tensor file's name."""
    try:
        meta = read_json(state_path)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptCheckpoint(f"{state_path}: unreadable ({first_line(err)})") from None
    if not isinstance(meta, dict):
        raise CorruptCheckpoint(f"{state_path}: expected a JSON object")
    if meta.get("format") != FORMAT:
        raise CorruptCheckpoint(
            f"{state_path}: unsupported checkpoint format {meta.get('format')!r}"
        )
    for key, kind in _STATE_FIELDS.items():
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise CorruptCheckpoint(f"{state_path}: field {key!r} missing or not {kind.__name__}")
    name = meta["tensors"]
    if Path(name).name != name or not name.endswith(".safetensors"):
        raise CorruptCheckpoint(f"{state_path}: bad tensor file name {name!r}")
    return meta


def _check_tensors(
    tensor_path: Path,
    tensors: dict[str, torch.Tensor],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
) -> None:
    """The model's tensors by name, shape and dtype, the RNG state, and each optimizer
    tensor's parameter index and shape."""
    expected = model.state_dict()
    saved = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    if saved.keys() != expected.keys():
        missing = sorted(expected.keys() - saved.keys())
        extra = sorted(saved.keys() - expected.keys())
        what = f"missing model.{missing[0]}" if missing else f"unexpected model.{extra[0]}"
        raise CorruptCheckpoint(f"{tensor_path}: not this model's checkpoint ({what})")
    for key, value in saved.items():
        if value.shape != expected[key].shape or value.dtype != expected[key].dtype:
            raise CorruptCheckpoint(
                f"{tensor_path}: model.{key} is {value.dtype} {tuple(value.shape)}, "
                f"expected {expected[key].dtype} {tuple(expected[key].shape)}"
            )
    if "rng.torch" not in tensors:
        raise CorruptCheckpoint(f"{tensor_path}: no rng.torch state")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for key, value in tensors.items():
        if not key.startswith("optim."):
            continue
        parts = key.split(".", 2)
        if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) >= len(params):
            raise CorruptCheckpoint(f"{tensor_path}: unexpected tensor {key}")
        if value.dim() > 0 and value.shape != params[int(parts[1])].shape:
            raise CorruptCheckpoint(f"{tensor_path}: {key} has shape {tuple(value.shape)}")


def load_checkpoint(
    folder: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[int, dict[str, Any]]:
    """Restore model, optimizer, scheduler and RNG in place; return (step, trainer scalars).

    The checkpoint is read and checked whole first (:func:`read_checkpoint`): a corrupt one
    raises :class:`CorruptCheckpoint` with nothing restored."""
    meta, tensors = read_checkpoint(folder, model, optimizer)
    device = model_device(model)
    model.load_state_dict(
        {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    )
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    for index, values in meta["optim_scalars"].items():
        state.setdefault(int(index), {}).update(values)
    groups = meta["param_groups"]
    for group in groups:
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    optimizer.load_state_dict({"state": state, "param_groups": groups})
    scheduler.load_state_dict(dict(meta["scheduler"], lr_lambdas=[None] * len(groups)))
    restore_rng(tensors, device)
    return int(meta["step"]), meta["trainer"]


def remove_checkpoint(folder: Path) -> None:
    # The commit point goes first, so a crash midway leaves no checkpoint rather than a
    # state.json pointing at a deleted tensor file.
    (folder / STATE_FILE).unlink(missing_ok=True)
    for path in folder.glob("step-*.safetensors"):
        path.unlink(missing_ok=True)
    for path in folder.glob(".*.tmp"):
        path.unlink(missing_ok=True)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
