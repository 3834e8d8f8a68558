"""Where a run came from: the software, the machine and the data it trained with.

A run folder's ``provenance.json`` holds one session per time the run was trained (a run
resumed after an interruption has several, possibly on different machines)::

    {"documents": "sha256:...",        the task's documents (every split, every tensor)
     "initial_weights": "sha256:...",  the model as initialised, before its first step
     "sessions": [{"started", "ended", "state", "step",
                   "mecheval", "commit", "dirty", "python", "torch", "cuda", "cudnn",
                   "triton", "host", "platform", "device", "device_name", "threads",
                   "precision", "compile", "kernels", "command"}, ...]}

Each session is written when it starts (``state`` "running", ``ended`` null) and completed
when it ends (done or failed, at ``step``); a session still "running" in a folder no process
trains was cut off. The fingerprints are of what the run computes from, so two
runs with equal fingerprints started from the same documents and weights whatever machine
made them.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # annotations only: provenance reads a config, it needs none of its code
    from mecheval.training.config import RunConfig

#: Environment variables that choose a training kernel (models/native.py, models/ops/).
KERNEL_VARIABLES = ("MECHEVAL_NATIVE", "MECHEVAL_TRITON")


def fingerprint(tensors: Mapping[str, torch.Tensor]) -> str:
    """``sha256:<hex>`` of named tensors: their names, dtypes, shapes and bytes, in name
    order (equal on every machine for equal values)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return f"sha256:{digest.hexdigest()}"


def documents_fingerprint(datasets: Mapping[str, Any]) -> str:
    """The fingerprint of every split's tensors (tokens, answers, roles, extras, trees)."""
    return fingerprint(
        {f"{split}/{name}": t for split, ds in datasets.items() for name, t in ds.tensors().items()}
    )


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def session(cfg: RunConfig) -> dict[str, Any]:
    """A session's record as it starts: the software, the machine, the settings."""
    t = cfg.training
    device = torch.device(t.device)
    return {
        "started": now(),
        "ended": None,
        "state": "running",
        "step": None,
        **software(),
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        "triton": _version("triton") if device.type == "cuda" else None,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "device": str(device),
        "device_name": device_name(device),
        "threads": torch.get_num_threads(),
        "precision": t.precision,
        "compile": t.compile,
        "kernels": {
            "training.kernels": t.kernels,
            **{name: os.environ[name] for name in KERNEL_VARIABLES if name in os.environ},
        },
        "command": list(sys.argv),
    }


@functools.cache
def software() -> dict[str, Any]:
    """mecheval's version and git commit (where it runs from a checkout), Python, torch."""
    commit, dirty = _git_state(Path(__file__).resolve().parents[3])
    return {
        "mecheval": _version("mecheval"),
        "commit": commit,
        "dirty": dirty,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def device_name(device: torch.device) -> str:
    """The card's name, or the CPU's model."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return _cpu_model()


@functools.cache
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git_state(root: Path) -> tuple[str | None, bool | None]:
    """(commit, whether the work tree differs from it) of the checkout at ``root``; (None,
    None) for an installed copy or without git."""
    if not (root / ".git").exists():
        return None, None
    try:
        commit = _git(root, "rev-parse", "HEAD")
        dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit, dirty


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
    )
    return done.stdout.strip()
