"""Which runs may train as one stack (:func:`groupable`): identical resolved configs except
the fields each member keeps its own (:data:`PER_RUN_FIELDS`) and the name."""

from __future__ import annotations

import json
from collections.abc import Sequence

from mecheval.training.config import RunConfig, config_to_data

#: Training fields that may differ within a group: each member gets its own value.
PER_RUN_FIELDS = ("lr", "seed", "weight_decay", "grad_clip", "keep_checkpoint")


def group_key(cfg: RunConfig) -> str:
    """What members of a group share: the (resolved) config without name and per-run
    fields."""
    data = config_to_data(cfg)
    data.pop("name", None)
    for key in PER_RUN_FIELDS:
        data["training"].pop(key, None)
    return json.dumps(data, sort_keys=True)


def groupable(cfgs: Sequence[RunConfig], max_size: int | None = None) -> list[list[int]]:
    """Partition ``cfgs`` (resolved configs, as a :class:`ResolvedRun` holds; by index, in
    order of first appearance) into groups that can train together: same task, model, batch
    size, steps, schedule shape, evaluation and ``train_queries``; lr, seed, weight decay and
    clipping may differ. ``max_size`` splits larger groups into chunks (memory grows with the
    group)."""
    if max_size is not None and max_size < 1:
        raise ValueError(f"max_size: expected >= 1, got {max_size}")
    groups: dict[str, list[int]] = {}
    for index, cfg in enumerate(cfgs):
        groups.setdefault(group_key(cfg), []).append(index)
    out: list[list[int]] = []
    for members in groups.values():
        size = max_size or len(members)
        out.extend(members[i : i + size] for i in range(0, len(members), size))
    return out
