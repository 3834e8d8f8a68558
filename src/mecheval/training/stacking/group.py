"""Train a group of same-shaped runs in one process, with one set of kernels for all of them.

Why: a sweep trains many runs that differ only in their recipe's numbers (the paper tunes 5
learning rates per architecture and width, then repeats seeds). At the paper's sizes one model
leaves most of a CPU (or a GPU) idle and the per-op overhead dominates, so K models whose
parameters are stacked along a leading dimension can train faster together than one after
another: every kernel does K models' work for one launch (how much faster depends on the
device: see the end of this docstring).

How: each member is an ordinary :class:`~mecheval.training.trainer.Trainer` (init from its
seed, its own data order, metrics log, evaluation, callbacks, checkpoints); only the training
step is replaced. Parameters are stacked with ``torch.func.stack_module_state``; one
``vmap(grad_and_value(functional_call(...)))`` computes every member's loss and gradient on its
own batch (members with different seeds see different documents); gradients are clipped per
member (each model's own norm) and :class:`~mecheval.training.stacking.stacked.StackedAdamW` applies
AdamW with each member's own learning rate (read from its own LambdaLR, so the schedule is the
single-run code) and weight decay; that arithmetic lives in stacked.py, the run folders in
folder.py (the same life cycle as a single run's). At each evaluation a member's slice is
copied back into its Trainer's model and the Trainer's own ``evaluate_now`` runs, so metrics,
``metrics.csv`` and callbacks are computed by exactly the single-run code. A member's run
folder ends up as :func:`~mecheval.training.run.train` would leave it (config.yaml,
status.json with the same fields, metrics.csv, model.safetensors, checkpoint/ in the same
format), equal to a one-by-one run up to float rounding: batched kernels sum in another order
(tests/test_training_group.py holds it to float32 tolerance). A member's
``wall_time`` is the group's wall time up to its end, the honest cost of getting that run.

Which runs group (:func:`groupable`): identical resolved configs except :data:`PER_RUN_FIELDS`
(``training.lr``, ``seed``, ``weight_decay``, ``grad_clip``, ``keep_checkpoint``) and the name.

Divergence is per member: a member whose training loss is non-finite (or whose weights are
non-finite at an evaluation) is marked failed in its own status.json with the Trainer's reason text
("diverged: training loss is nan at step N") and dropped from the stack; the others go on.

Resume: the group writes each member's checkpoint in the single-run format. Runs whose
checkpoints are at the same step (an interrupted group's) resume as one stack: each member's
Trainer restores its own checkpoint, and the stack starts from their weights, AdamW moments,
schedules and running losses, ending as the uninterrupted group would, bit for bit. A lone run
with a checkpoint, or one whose checkpoint cannot be read, resumes with ``train_run()``.
Finished members are skipped.

Architectures that cannot be vmapped (a mixer writing in place into a freshly allocated
buffer, Python control flow on tensor values, an autograd.Function without a vmap rule) are
detected by a probe before training -- one vmapped forward and backward on two documents,
compared with plain autograd per model -- and their group is trained one run at a time with
``train_run()`` instead, with a warning naming the error.
Every built-in architecture passes the probe (tests/test_training_group.py stacks each and
holds it to its one-by-one runs), with three costs of speed, not correctness:

* CPU ``scaled_dot_product_attention`` (forward and backward; attention) and
  ``unfold_backward`` (the CPU Toeplitz long convolution) have no batching rule: vmap runs
  them slice by slice.
* Mamba's scan on a CPU (a Python loop over time in an autograd.Function with a generated
  vmap rule) works on [K, ...] intermediates K times larger.
* ``functional_call`` mis-restores a submodule reachable under two names (the implicit
  filter's shared ``Sin``), leaving a vmapped tensor in it; the group therefore calls a
  private copy of a member's model, never the member's own.

A stack pays where small models leave a device idle (a GPU, many cores): there the step runs
on the device from batch to update and is replayed as one CUDA graph (group_trainer.py,
stack_feed.py, captured.py); a lone run there trains as a stack of one for that replay
(:func:`replays_alone` says where). On a CPU, batching a compute-bound step adds no parallelism:
sweeps there train one run at a time unless asked (docs/performance.md has the figures and
benchmarks/bench_training.py measures them).
"""

from __future__ import annotations

import contextlib
import json
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mecheval.training.checkpoint import CorruptCheckpoint, checkpoint_step, has_checkpoint
from mecheval.training.config import RunConfig
from mecheval.training.folder import RunFolder
from mecheval.training.provenance import documents_fingerprint, fingerprint
from mecheval.training.reporter import ReporterFactory, null_reporter
from mecheval.training.resolved import ResolvedRun
from mecheval.training.run import crash_reason, train_run
from mecheval.training.stacking.captured import graphs_enabled
from mecheval.training.stacking.group_trainer import GroupTrainer
from mecheval.training.stacking.grouping import group_key, groupable
from mecheval.training.threads import torch_threads
from mecheval.training.trainer import Callback
from mecheval.training.turns import taking_turns

# Probe outcomes per group key (None: vmaps), so a sweep probes each shape once per process.
_PROBED: dict[str, str | None] = {}


# ----------------------------------------------------------------------------- run folders


def _vmap_error(group: GroupTrainer) -> str | None:
    key = group_key(group.cfgs[0])
    if key not in _PROBED:
        _PROBED[key] = group.probe()
    return _PROBED[key]


def _train_members(
    runs: Sequence[ResolvedRun],
    datasets: Mapping[str, Any],
    callbacks: Sequence[Callback],
    reporter_for: ReporterFactory,
    use_vmap: bool,
    resume: bool = False,
) -> list[dict[str, Any]]:
    """Train one group into its run folders: no member finished, and none with a checkpoint
    or (``resume``) every one with a checkpoint at the same step."""

    def one_by_one() -> list[dict[str, Any]]:
        return [
            train_run(run, callbacks, datasets=datasets, reporter=reporter_for([run.cfg]))
            for run in runs
        ]

    alone = len(runs) == 1
    if (alone and not replays_alone(runs[0])) or not use_vmap:
        return one_by_one()
    folders = [run.folder() for run in runs]
    with contextlib.ExitStack() as held:
        for folder in folders:  # before a checkpoint is read
            held.enter_context(folder.locked())
        group = _stack(
            [run.cfg for run in runs], datasets, folders, callbacks, reporter_for, resume
        )
        # A lone run stacks only to be replayed as a CUDA graph: unreplayed, a stack of one
        # is the single-run trainer's step with extra work.
        if group is not None and (group.replays or not alone):
            return _train_stack(group, folders)
    return one_by_one()


def replays_alone(run: ResolvedRun) -> bool:
    """Whether a lone run trains as a stack of one, its step replayed as a CUDA graph: on a
    device that replays, not side by side with other threads (captured stacks of one trained
    wrongly there: docs/performance.md), and not asking for what only the single-run trainer
    does (``training.compile``, fused kernels)."""
    t = run.cfg.training
    return (
        graphs_enabled(torch.device(run.device))
        and not taking_turns()
        and not t.compile
        and t.kernels == "reference"
    )


def _stack(
    cfgs: Sequence[RunConfig],
    datasets: Mapping[str, Any],
    folders: Sequence[RunFolder],
    callbacks: Sequence[Callback],
    reporter_for: ReporterFactory,
    resume: bool,
) -> GroupTrainer | None:
    """The group's stacked trainer, or None where its runs train one at a time: a member's
    checkpoint cannot be restored (``train_run()`` then discards it, saying so, and trains
    that run from step 0), or the architecture does not vmap (warned here)."""
    try:
        group = GroupTrainer(
            cfgs, datasets, [f.path for f in folders], callbacks, reporter_for(cfgs), resume=resume
        )
    except CorruptCheckpoint:
        return None
    error = _vmap_error(group)
    if error is not None:
        warnings.warn(
            f"train_group: {cfgs[0].model.architecture} cannot be vmapped ({error}); "
            + (
                "training it eagerly (no CUDA graph)"
                if len(cfgs) == 1
                else f"training its {len(cfgs)} runs one at a time"
            ),
            RuntimeWarning,
            stacklevel=4,
        )
        return None
    return group


def _train_stack(group: GroupTrainer, folders: Sequence[RunFolder]) -> list[dict[str, Any]]:
    start = time.perf_counter()
    documents = documents_fingerprint(group.members[0].datasets)
    for folder, member in zip(folders, group.members, strict=True):
        folder.prepare()
        # A resumed member holds its checkpoint's weights: its first session recorded its own.
        initial = None if group.resumed else fingerprint(member.model.state_dict())
        folder.running(documents, initial)

    def diverged(k: int) -> dict[str, Any]:
        member, err = group.members[k], group.failed[k]
        return folders[k].failed(
            err.reason,
            step=err.step,
            wall_time=member.wall_time(start),
            metrics=member.last_results,
        )

    try:
        group.run(start)
    except BaseException as err:
        # As train_run(): not a property of the configs; a later call resumes from checkpoints.
        reason = crash_reason(err)
        for k in group.live:
            member = group.members[k]
            folders[k].failed(reason, step=member.step, wall_time=member.wall_time(start))
        for k in group.failed:
            diverged(k)
        raise
    return [
        diverged(k)
        if k in group.failed
        else folders[k].done(
            member.model.state_dict(),
            step=member.step,
            wall_time=member.wall_time(start),
            metrics=member.last_results,
            **member.stop_note(),
        )
        for k, member in enumerate(group.members)
    ]


def train_group(
    cfgs: Sequence[RunConfig],
    run_dirs: Sequence[str | Path],
    *,
    callbacks: Sequence[Callback] = (),
    datasets: Mapping[str, Any] | None = None,
    cache_dir: Path | None = None,
    max_group: int | None = None,
    use_vmap: bool = True,
    reporter_for: ReporterFactory | None = None,
) -> list[dict[str, Any]]:
    """:func:`train_runs` of ``cfgs[i]`` resolved into ``run_dirs[i]``."""
    if len(cfgs) != len(run_dirs):
        raise ValueError(f"train_group: {len(cfgs)} configs but {len(run_dirs)} run folders")
    runs = [ResolvedRun.of(cfg, d, cache_dir) for cfg, d in zip(cfgs, run_dirs, strict=True)]
    return train_runs(
        runs,
        callbacks=callbacks,
        datasets=datasets,
        max_group=max_group,
        use_vmap=use_vmap,
        reporter_for=reporter_for,
    )


def train_runs(
    runs: Sequence[ResolvedRun],
    *,
    callbacks: Sequence[Callback] = (),
    datasets: Mapping[str, Any] | None = None,
    max_group: int | None = None,
    use_vmap: bool = True,
    reporter_for: ReporterFactory | None = None,
) -> list[dict[str, Any]]:
    """Train every run as :func:`~mecheval.training.run.train_run` would, grouping
    compatible runs (:func:`groupable`) into one stacked model each; return the statuses in
    input order.

    Finished runs are skipped; runs with checkpoints at one step resume as one stack (before
    the runs that start from step 0); a group whose architecture does not vmap (or
    ``use_vmap=False``) trains one run at a time. ``datasets`` (shared by all runs, which
    must then have one task) saves rebuilding them; ``max_group`` caps the stack size.
    ``reporter_for(cfgs)`` gives the reporter of each stack or single run (default: no
    progress display). A crash (or a callback raising) marks the unfinished members of the
    group ``crashed`` and propagates, as ``train_run()`` does.
    """
    if len({run.run_dir.resolve() for run in runs}) != len(runs):
        raise ValueError("train_group: two runs share a run folder")
    for run in runs:
        run.check_machine()
    folders = [run.folder() for run in runs]
    reporter_for = reporter_for or null_reporter
    statuses: list[dict[str, Any] | None] = [folder.check() for folder in folders]
    built: dict[str, Mapping[str, Any]] = {}

    def data_for(run: ResolvedRun) -> Mapping[str, Any]:
        if datasets is not None:
            return datasets
        key = json.dumps(run.cfg.task.model_dump(mode="json"), sort_keys=True)
        if key not in built:
            from mecheval.tasks import build_datasets

            built[key] = build_datasets(run.cfg.task, cache_dir=run.cache_dir)
        return built[key]

    # Runs to resume, by their checkpoint's step (a stack resumes at one step), then the fresh.
    at_step: dict[int, list[int]] = {}
    for i, folder in enumerate(folders):
        if statuses[i] is not None:
            continue
        step = (
            checkpoint_step(folder.checkpoint_dir) if has_checkpoint(folder.checkpoint_dir) else 0
        )
        if step is None:  # unreadable: train_run() discards it, saying so
            statuses[i] = train_run(
                runs[i], callbacks, datasets=data_for(runs[i]), reporter=reporter_for([runs[i].cfg])
            )
        else:
            at_step.setdefault(step, []).append(i)
    for step in sorted(at_step, key=lambda s: (s == 0, s)):
        pending = at_step[step]
        for group in groupable([runs[i].cfg for i in pending], max_size=max_group):
            indices = [pending[j] for j in group]
            members = [runs[i] for i in indices]
            with torch_threads(members[0].cfg.training.threads):
                results = _train_members(
                    members, data_for(members[0]), callbacks, reporter_for, use_vmap, step > 0
                )
            for i, status in zip(indices, results, strict=True):
                statuses[i] = status
    assert all(s is not None for s in statuses)
    return statuses  # type: ignore[return-value]
