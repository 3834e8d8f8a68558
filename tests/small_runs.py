"""The small AR runs the training tests share (imported by test modules: pytest puts this
folder on sys.path): a task that builds in milliseconds and a config builder over it."""

from __future__ import annotations

from mecheval.training.config import RunConfig, config_from_data

TASK = {
    "kind": "ar",
    "n_keys": 8,
    "n_values": 8,
    "n_pairs": 2,
    "n_train": 320,
    "n_dev": 32,
    "n_test": 32,
    "seed": 3,
}


#: The base of the small sweeps (1-layer attention, 8 keys/values, 2 pairs, 64 documents).
SWEEP_BASE = {
    "task": {
        "kind": "ar",
        "n_keys": 8,
        "n_values": 8,
        "n_pairs": 2,
        "n_train": 64,
        "n_dev": 16,
        "n_test": 16,
    },
    "model": {"architecture": "attention", "d_model": 16, "n_layers": 1},
    "training": {"steps": 12, "batch_size": 8, "eval_every": 6, "threads": 1},
}


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``mecheval ARGS`` through its real entry point: (exit code, stdout, stderr)."""
    import sys

    import pytest

    from mecheval.cli import main

    monkeypatch.setattr(sys, "argv", ["mecheval", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    return exit_info.value.code or 0, out, err


def config(
    arch: str = "attention",
    d_model: int = 16,
    task: dict | None = None,
    model: dict | None = None,
    **training,
) -> RunConfig:
    data = {
        "task": task or TASK,
        "model": {"architecture": arch, "d_model": d_model, **(model or {})},
        "training": {"lr": 3e-3, "steps": 8, "eval_every": 4, "batch_size": 16, **training},
    }
    return config_from_data(data)
