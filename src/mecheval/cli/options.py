"""The options of the sweep commands (`sweep`, `reproduce`, and `intervene` for --documents):
their types and help once, and the checks they need beyond their type."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mecheval.errors import ConfigError

Workers = Annotated[
    int,
    typer.Option(
        help="local worker processes (torch threads split); where every run trains on one GPU, "
        "threads of this process that train their groups side by side on it (a sweep of "
        "lone runs there trains them one after another, each step replayed as a CUDA graph)"
    ),
]
Backend = Annotated[str, typer.Option(help="local | ray")]
Address = Annotated[str | None, typer.Option(help="Ray cluster address (default: start one)")]
Out = Annotated[Path, typer.Option(help="folder that holds experiment folders")]
RetryFailed = Annotated[
    bool,
    typer.Option(
        "--retry-failed", help="train diverged runs again (a crashed run resumes on any rerun)"
    ),
]
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


# `reproduce`'s cut of an experiment's grid, and its overrides.
Archs = Annotated[
    str | None,
    typer.Option(
        help="comma-separated architectures instead of the paper's seven; 'all': every "
        "registered one the experiment can train (the built-ins beyond the paper, plugins); "
        "an experiment about named architectures (mamba-conv, mamba3-conv, ...) runs the "
        "ones given among its own",
    ),
]
Tasks = Annotated[
    str | None,
    typer.Option(
        help="task-matrix only: comma-separated task kinds instead of its nine "
        "(ar,noisy_ar,overwrite_ar,mqar,compositional_mqar,reverse_ar,stacked_mqar,"
        "parity,s3; atr too)",
    ),
]
Widths = Annotated[
    str | None,
    typer.Option(
        help="comma-separated model widths: run only these of the grid's "
        "(paper: 16,32,64,128,256; quick and tiny have one width, 64 and 16)",
    ),
]
Lrs = Annotated[
    str | None,
    typer.Option(
        help="comma-separated peak LRs: run only these of the grid's, compared as numbers "
        "(1e-3 = 0.001); at quick and tiny, where the LR is not swept, only the one LR "
        "the runs use (quick AR tunes it per architecture: choose one with --archs)",
    ),
]
Seeds = Annotated[
    str | None,
    typer.Option(
        help="comma-separated training seeds: the paper trains one seed (0) per "
        "configuration; other seeds add a seed axis (run names then end in -sN)",
    ),
]
Sets = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="override a field of every run, e.g. --set model.n_layers=1 (repeatable); "
        "the runs go to their own folder, OUT/<experiment>-<preset>-L1 (training.threads, "
        "device, compile and kernels keep the experiment's folder); not a field the grid varies",
    ),
]


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
