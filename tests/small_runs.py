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
