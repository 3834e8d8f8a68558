"""Named base configs: ``paper`` (the paper's scale), ``quick`` (minutes on a laptop CPU) and
``tiny`` (seconds: a smoke test of the whole pipeline, e.g. in CI; its models learn little).

A preset is plain config data for (task kind, architecture); ``--set`` overrides apply on top.
Each task defines its presets beside its generator (``Task.presets``, e.g. tasks/ar.py); see
docs/quick-preset.md for how the ``quick`` numbers were measured.
"""

from __future__ import annotations

import copy
from typing import Any

from mecheval.errors import ConfigError
from mecheval.tasks import TASKS

PRESETS = ("paper", "quick", "tiny")


def check_preset(name: str) -> None:
    if name not in PRESETS:
        raise ConfigError(f"--preset: unknown {name!r} (expected one of: {', '.join(PRESETS)})")


def preset(name: str, task: str, architecture: str = "attention") -> dict[str, Any]:
    """Config data (not yet validated) for preset ``name`` on task kind ``task``."""
    check_preset(name)
    if task not in TASKS:
        raise ConfigError(f"--task: unknown {task!r} (expected one of: {', '.join(TASKS)})")
    spec = TASKS[task]
    if name not in spec.presets:
        raise ConfigError(f"--preset: task {task!r} has no {name!r} preset")
    data = copy.deepcopy(dict(spec.presets[name]))
    data["model"]["architecture"] = architecture
    if name == "quick" and architecture in spec.quick_lrs:
        data["training"]["lr"] = spec.quick_lrs[architecture]
    return data
