"""The options a sweep's commands share (`sweep`, `reproduce`, and `intervene` for
--documents): their types and help once, and the checks they need beyond their type."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mecheval.errors import ConfigError

Workers = Annotated[
    int,
    typer.Option(
        help="local worker processes (torch threads split); where every run trains on one GPU, "
        "threads of this process that train their groups side by side on it"
    ),
]
Backend = Annotated[str, typer.Option(help="local | ray")]
Address = Annotated[str | None, typer.Option(help="Ray cluster address (default: start one)")]
Out = Annotated[Path, typer.Option(help="folder that holds experiment folders")]
RetryFailed = Annotated[bool, typer.Option("--retry-failed", help="rerun failed runs")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="no progress display")]
Documents = Annotated[
    str,
    typer.Option(
        help="documents the interventions average over: all (the paper's way) | key-dependent "
        "(leave out those answerable without the key: ATR answers that are the root's head)",
    ),
]


def check_documents(documents: str) -> str:
    if documents not in ("all", "key-dependent"):
        raise ConfigError(f"--documents: expected all or key-dependent, got {documents!r}")
    return documents


GroupSize = Annotated[
    int | None,
    typer.Option(
        help="most runs trained as one stacked model (same architecture and shape); "
        "default: 32 on a GPU, 1 on a CPU",
    ),
]
Device = Annotated[
    str | None, typer.Option(help="train every run on this device (cpu, cuda, cuda:1, mps)")
]
Compile = Annotated[
    bool,
    typer.Option(
        "--compile",
        help="train single runs through torch.compile (faster for Mamba and H3 on a CPU; "
        "stacks stay eager)",
    ),
]


def runtime_overrides(device: str | None, compile_: bool) -> dict[str, object]:
    """Settings that change where and how fast runs train, not what they compute: runs
    trained with other values still resume and skip (see training.run)."""
    overrides: dict[str, object] = {}
    if device is not None:
        overrides["training.device"] = device
    if compile_:
        overrides["training.compile"] = True
    return overrides
