"""Which jobs train together and in what order: groups of same-shaped runs stacked into one
model (on a GPU), the slowest groups first (so a pool is not left waiting on one started
last), and the share of a GPU each group asks a Ray cluster for.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

from mecheval.errors import ConfigError
from mecheval.experiments.execution.jobs import Job, Outcome
from mecheval.training.config import RunConfig
from mecheval.training.folder import is_finished, peek_status

#: The most runs stacked into one model on a GPU when --group-size is not given.
GPU_GROUP_SIZE = 32


def step_seconds(cfg: RunConfig) -> float:
    """One training step of ``cfg``'s (resolved) model at its batch shape (a typical batch's padded
    length, not the longest document), timed on one thread."""

    import torch

    from mecheval.models import build_model
    from mecheval.training.threads import torch_threads

    with torch_threads(1):
        with torch.random.fork_rng(devices=[]):
            model = build_model(cfg.model)
            length = cfg.task.typical_length(cfg.training.batch_size)
            tokens = torch.randint(0, cfg.model.vocab_size or 2, (cfg.training.batch_size, length))
            at = torch.full((cfg.training.batch_size,), length - 1)
            times = []
            for _ in range(3):  # the first is a warm-up
                start = time.perf_counter()
                model(tokens, at=at).logsumexp(-1).sum().backward()
                times.append(time.perf_counter() - start)
        return min(times[1:])


def estimated_seconds(jobs: Sequence[Job]) -> dict[str, float]:
    """Each job's training time, estimated as a step timed once per model shape times the
    run's steps; a finished run costs nothing."""
    from mecheval.training.config import total_steps

    per_shape: dict[str, float] = {}
    costs = {}
    for job in jobs:
        if is_finished(peek_status(Path(job.run_dir))):
            costs[job.name] = 0.0
            continue
        try:
            cfg = RunConfig.model_validate(job.config)
            shape = json.dumps([job.config["model"], cfg.training.batch_size], sort_keys=True)
            if shape not in per_shape:
                per_shape[shape] = step_seconds(cfg)
            costs[job.name] = per_shape[shape] * total_steps(cfg)
        except Exception:
            # A model that cannot take a step here fails in its worker, where the reason is
            # recorded; it must not end the sweep before any run starts.
            costs[job.name] = 0.0
    return costs


def longest_first(groups: Sequence[Sequence[Job]]) -> list[list[Job]]:
    """Groups of jobs by decreasing estimated training time (their runs' sum: a stack does
    every member's arithmetic), so that a pool of workers is not left waiting on one slow
    group started last."""
    costs = estimated_seconds([job for group in groups for job in group])
    return sorted(
        (list(group) for group in groups), key=lambda group: -sum(costs[j.name] for j in group)
    )


def auto_group_size(jobs: Sequence[Job]) -> int:
    """Stack runs only on a GPU: one small model leaves a GPU idle, while on a CPU a stack
    trains no faster than its runs one by one (docs/performance.md)."""
    return GPU_GROUP_SIZE if on_gpu(jobs) else 1


def on_gpu(jobs: Sequence[Job]) -> bool:
    return any(job.device.startswith("cuda") for job in jobs)


def group_jobs(jobs: Sequence[Job], group_size: int) -> list[list[Job]]:
    """Jobs partitioned into groups of at most ``group_size`` runs that train as one stacked
    model (same architecture and shapes, any LR/seed/decay/clipping: see
    ``mecheval.training.stacking.group.groupable``), in the order of the jobs."""
    if group_size < 1:
        raise ConfigError(f"--group-size: expected >= 1, got {group_size}")
    if group_size == 1:
        return [[job] for job in jobs]
    from mecheval.training.stacking.group import groupable

    by_worker: dict[tuple, list[Job]] = {}
    for job in jobs:  # a stack shares one worker's settings too
        by_worker.setdefault((job.threads, job.plan, job.cache_dir, job.plugins), []).append(job)
    groups = []
    for members in by_worker.values():
        cfgs = [RunConfig.model_validate(job.config) for job in members]
        groups += [[members[i] for i in g] for g in groupable(cfgs, max_size=group_size)]
    position = {job.name: i for i, job in enumerate(jobs)}
    return sorted(groups, key=lambda group: position[group[0].name])


def in_job_order(
    jobs: Sequence[Job], groups: Sequence[Sequence[Job]], results: Sequence[Sequence[Outcome]]
) -> list[Outcome]:
    done = {
        job.name: outcome
        for group, outcomes in zip(groups, results, strict=True)
        for job, outcome in zip(group, outcomes, strict=True)
    }
    return [done[job.name] for job in jobs]


def gpu_share(groups: Sequence[Sequence[Job]], cards: float) -> float:
    """The share of a GPU each group on one asks Ray for: a whole card while there are no
    more such groups than the cluster's ``cards``; else 1/k of one, k the groups each card
    then holds, so that they all train at once (Ray's CPU requests still cap how many run
    together). 0 where no group trains on a GPU."""
    gpu_groups = sum(1 for group in groups if on_gpu(group))
    if not gpu_groups:
        return 0.0
    if cards <= 0:
        raise ConfigError(
            "training.device: cuda, but the Ray cluster declares no GPU "
            "(start its nodes with --num-gpus, or ray.init(num_gpus=N))"
        )
    if gpu_groups <= cards:
        return 1.0
    return math.floor(1e4 / math.ceil(gpu_groups / cards)) / 1e4  # Ray's resource precision
