"""Train a group of same-shaped runs in one process, with one set of kernels for all of them.

Why: a sweep trains many runs that differ only in their recipe's numbers (the paper tunes 5
learning rates per architecture and width, then repeats seeds). At the paper's sizes one model
leaves most of a CPU (or a GPU) idle and the per-op overhead dominates, so K models whose
parameters are stacked along a leading dimension can train faster together than one after
another: every kernel does K models' work for one launch (how much faster depends on the
device; see the end of this docstring).

How: each member is an ordinary :class:`~mecheval.training.trainer.Trainer` (init from its
seed, its own data order, metrics log, evaluation, callbacks, checkpoints); only the training
step is replaced. Parameters are stacked with ``torch.func.stack_module_state``; one
``vmap(grad_and_value(functional_call(...)))`` computes every member's loss and gradient on its
own batch (members with different seeds see different documents); gradients are clipped per
member (each model's own norm) and :class:`~mecheval.training.stacked.StackedAdamW` applies
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

Resume is kept simple: the group writes each member's checkpoint in the single-run format, and
a member that has a checkpoint (an interrupted group or run) is resumed alone by ``train_run()``.
Finished members are skipped.

Architectures that cannot be vmapped (a mixer writing in place into a freshly allocated
buffer, Python control flow on tensor values, an autograd.Function without a vmap rule) are
detected by a probe before training -- one vmapped forward and backward on two documents,
compared with plain autograd per model -- and their group is trained one run at a time with
``train_run()`` instead, with a warning naming the error.
With torch 2.13 seven architectures are known to pass (attention, baseconv, based, deltanet,
h3, hyena, mamba), with three caveats that cost speed, not correctness:

* CPU ``scaled_dot_product_attention`` (forward and backward; attention) and
  ``unfold_backward`` (the CPU Toeplitz long convolution) have no batching rule: vmap runs
  them slice by slice.
* Mamba's scan (a Python loop over time in an autograd.Function with a generated vmap rule)
  works on [K, ...] intermediates K times larger (likely falling out of the CPU cache; its
  broadcast multiplies dominate the profile): on one CPU thread a group of 5 trains Mamba
  ~0.6x as fast as one model at a time.
* ``functional_call`` mis-restores a submodule reachable under two names (the implicit
  filter's shared ``Sin``), leaving a vmapped tensor in it; the group therefore calls a
  private copy of a member's model, never the member's own.

On a CPU the gain is small (one thread: 0.6-1.2x; two threads: 1.1-1.3x, see
benchmarks/bench_training.py): batching a compute-bound step adds no parallelism there. The
win is where small models leave a device idle (a GPU, many cores).
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.func import grad_and_value, stack_module_state, vmap

from mecheval.tasks import Batch
from mecheval.tasks.batch import ANSWER_POSITIONS, ANSWERS
from mecheval.training.checkpoint import has_checkpoint, save_checkpoint
from mecheval.training.config import RunConfig, check_device, config_to_data
from mecheval.training.folder import RunFolder
from mecheval.training.metrics import answer_loss, multi_answer_loss
from mecheval.training.precision import autocast, rounding_eps, tf32
from mecheval.training.reporter import NullReporter, Reporter, ReporterFactory, null_reporter
from mecheval.training.resolved import ResolvedRun
from mecheval.training.run import crash_reason, train_run
from mecheval.training.stacked import (
    Functional,
    StackedAdamW,
    Tensors,
    clip_grad_norms_,
    pad_stack,
)
from mecheval.training.threads import torch_threads
from mecheval.training.trainer import Callback, Diverged, Trainer, divergence

#: Training fields that may differ within a group: each member gets its own value.
PER_RUN_FIELDS = ("lr", "seed", "weight_decay", "grad_clip", "keep_checkpoint")

# Probe outcomes per group key (None: vmaps), so a sweep probes each shape once per process.
_PROBED: dict[str, str | None] = {}


# ----------------------------------------------------------------------------- grouping


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


# ----------------------------------------------------------------------------- the group


class GroupTrainer:
    """K same-shaped runs trained in lockstep; see the module docstring.

    ``cfgs`` must be resolved and pairwise :func:`groupable`; ``run_dirs`` one per config.
    """

    def __init__(
        self,
        cfgs: Sequence[RunConfig],
        datasets: Mapping[str, Any],
        run_dirs: Sequence[Path],
        callbacks: Sequence[Callback] = (),
        reporter: Reporter | None = None,
    ) -> None:
        if len({group_key(cfg) for cfg in cfgs}) != 1:
            raise ValueError("GroupTrainer: the configs do not form one group (see groupable)")
        self.cfgs = list(cfgs)
        self.members = [
            Trainer(cfg, datasets, Path(run_dir), callbacks, NullReporter())
            for cfg, run_dir in zip(cfgs, run_dirs, strict=True)
        ]
        self.reporter = reporter or NullReporter()
        first = self.members[0]
        # One task, batch size and device: every member evaluates on the same batches.
        for member in self.members[1:]:
            member.eval_batches = first.eval_batches
        self.t = first.t
        self.total = first.total
        self.step = 0
        self.live = list(range(len(self.members)))  # members still training, in stack order
        self.failed: dict[int, Diverged] = {}
        # A private copy is the shell every functional call runs through: functional_call
        # restores a module reachable under two names (the implicit filter's shared Sin) in
        # the wrong order and leaves a vmapped tensor in it, so it must not be a member's model.
        self.shell = copy.deepcopy(first.model)
        params, buffers = stack_module_state([m.model for m in self.members])
        self.params: Tensors = {n: p.detach() for n, p in params.items()}
        self.buffers: Tensors = buffers
        self.device = first.device
        self._index = torch.arange(len(self.members), device=self.device)
        # The param groups (names, decay) exactly as make_optimizer built each member's.
        names = {id(p): n for n, p in first.model.named_parameters()}
        groups = [[names[id(p)] for p in g["params"]] for g in first.optimizer.param_groups]
        decay = [
            [m.optimizer.param_groups[g]["weight_decay"] for m in self.members]
            for g in range(len(groups))
        ]
        self.optimizer = StackedAdamW(self.params, groups, decay, self.t.betas, self.t.eps)
        self._grad_fn = vmap(grad_and_value(self._loss))
        self._grad_fn_multi = vmap(grad_and_value(self._multi_loss), in_dims=(0, 0, 0, None, 0))
        self._grad_fn_dense = vmap(grad_and_value(self._multi_loss))

    # ------------------------------------------------------------------ the vmapped step
    def _loss(
        self,
        params: Tensors,
        buffers: Tensors,
        tokens: torch.Tensor,
        query: torch.Tensor,
        answer: torch.Tensor,
    ) -> torch.Tensor:
        model = Functional(self.shell, params, buffers)
        # Autocast inside the differentiated function covers the forward only, as in
        # Trainer.loss: grad_and_value runs the backward after this returns.
        with autocast(self.t.precision, self.device):
            return answer_loss(model, Batch(tokens, answer, {"query": query}))  # type: ignore[arg-type]

    def _multi_loss(
        self,
        params: Tensors,
        buffers: Tensors,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        answers: torch.Tensor,
    ) -> torch.Tensor:
        model = Functional(self.shell, params, buffers)
        with autocast(self.t.precision, self.device):
            return multi_answer_loss(model, tokens, positions, answers)  # type: ignore[arg-type]

    def grads_and_losses(
        self, params: Tensors, buffers: Tensors, batches: Sequence[Batch], step: int
    ) -> tuple[Tensors, torch.Tensor]:
        """Every stacked model's gradient and loss on its own batch (``batches[k]``), in
        ``training.precision`` as Trainer.train_step (TF32 over forward and backward, bf16
        autocast over the forward). ``training.compile`` is not applied: the stack trains
        eagerly (its results are the same; only single runs are compiled)."""
        with warnings.catch_warnings(), tf32(self.t.precision, self.device):
            # vmap's per-slice fallback for ops without a batching rule: slower, still right.
            warnings.filterwarnings("ignore", message="There is a performance drop")
            if ANSWER_POSITIONS in batches[0].extras:
                # Every answer of each document (MQAR), at each member's own positions.
                return self._grad_fn_dense(
                    params,
                    buffers,
                    pad_stack([b.tokens for b in batches]),
                    torch.stack([b.extras[ANSWER_POSITIONS] for b in batches]),
                    torch.stack([b.extras[ANSWERS] for b in batches]),
                )
            if self.t.train_queries == 1:
                return self._grad_fn(
                    params,
                    buffers,
                    pad_stack([b.tokens for b in batches]),
                    torch.stack([b.query for b in batches]),
                    torch.stack([b.answer for b in batches]),
                )
            # The same extra queries as Trainer.loss: drawn from (member seed, step).
            extended = [
                self.cfgs[0].task.extend_queries(
                    b,
                    self.t.train_queries,
                    self.members[k].query_generator(step),
                )
                for k, b in zip(self.live, batches, strict=True)
            ]
            positions = extended[0][1]
            if any(not torch.equal(e[1], positions) for e in extended):
                raise ValueError("train_queries: members' query positions differ")
            return self._grad_fn_multi(
                params,
                buffers,
                torch.stack([e[0] for e in extended]),
                positions,
                torch.stack([e[2] for e in extended]),
            )

    def probe(self) -> str | None:
        """None if the vmapped step matches plain autograd per model on two documents of two
        members, else why not (the error, or the largest mismatch)."""
        live = self.live[:2]
        index = torch.tensor(live, device=self.device)
        params = {n: p[index] for n, p in self.params.items()}
        buffers = {n: b[index] for n, b in self.buffers.items()}
        batches = [self.members[k].batch_at(0).select(slice(0, 2)) for k in live]
        saved_live = self.live
        self.live = live
        try:
            grads, losses = self.grads_and_losses(params, buffers, batches, 0)
        except Exception as err:  # noqa: BLE001 - any failure means "cannot vmap"
            return f"{type(err).__name__}: {err}"
        finally:
            self.live = saved_live
        for j, k in enumerate(live):
            member = self.members[k]
            model = member.model
            model.zero_grad(set_to_none=True)
            # At member.step == 0, as the vmapped call, in the same precision; through the
            # plain module, so that a compile=True group compiles nothing just to probe.
            with tf32(member.t.precision, member.device):
                loss = member.loss(batches[j], model)
                loss.backward()
            eps = rounding_eps(member.t.precision, member.device)
            try:
                loss_rtol = 1e-4 if eps is None else 4 * eps
                torch.testing.assert_close(losses[j], loss.detach(), rtol=loss_rtol, atol=1e-5)
                for name, p in model.named_parameters():
                    rtol, atol = 1e-3, 1e-5
                    if eps is not None:
                        # In bf16 (or TF32) batched and single kernels round differently
                        # summed activations, so they agree to a few ulps of each gradient's
                        # scale, not to float32 tolerance; a mis-vmapped op is off by the
                        # gradient's own size.
                        rtol, atol = 4 * eps, 1e-5 + 4 * eps * float(p.grad.abs().max())
                    torch.testing.assert_close(grads[name][j], p.grad, rtol=rtol, atol=atol)
            except AssertionError as err:
                return f"vmapped gradients differ from autograd: {str(err).splitlines()[0]}"
            finally:
                model.zero_grad(set_to_none=True)
        return None

    @torch.no_grad()
    def sync(self, j: int) -> Trainer:
        """Copy stack slot ``j`` into its member's model (for evaluation and saving)."""
        member = self.members[self.live[j]]
        for name, p in member.model.named_parameters():
            p.copy_(self.params[name][j])
        member.step = self.step
        return member

    def fail(self, slots: Sequence[int], errors: Sequence[Diverged]) -> None:
        """Record the members in stack ``slots`` as diverged and take them off the stack."""
        for j, err in zip(slots, errors, strict=True):
            self.record_failure(j, err)
        self.take_off(slots)

    def record_failure(self, slot: int, err: Diverged) -> None:
        self.failed[self.live[slot]] = err
        self.members[self.live[slot]].metrics.flush()

    def take_off(self, slots: Sequence[int]) -> None:
        """Remove stack ``slots`` from the stack (their members keep their last sync)."""
        dropped = set(slots)
        keep = [j for j in range(len(self.live)) if j not in dropped]
        self._index = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.params = {n: p[self._index] for n, p in self.params.items()}
        self.buffers = {n: b[self._index] for n, b in self.buffers.items()}
        self.optimizer.keep(self._index)
        self.live = [self.live[j] for j in keep]

    def train_step(self) -> list[float]:
        """One optimizer step of every live member; returns their (pre-step) losses."""
        step = self.step
        batches = [self.members[k].batch_at(step) for k in self.live]
        grads, losses = self.grads_and_losses(self.params, self.buffers, batches, step)
        values = losses.tolist()
        stops = [
            divergence(v, step + 1, self.members[k].ceiling)
            for v, k in zip(values, self.live, strict=True)
        ]
        bad = [j for j, stop in enumerate(stops) if stop is not None]
        if bad:
            self.fail(bad, [stops[j] for j in bad])  # type: ignore[misc]
            if not self.live:
                return []
            grads = {n: g[self._index] for n, g in grads.items()}
            values = [v for j, v in enumerate(values) if j not in set(bad)]
        members = [self.members[k] for k in self.live]
        clip_grad_norms_(grads, [m.t.grad_clip for m in members])
        lrs = [
            [m.optimizer.param_groups[g]["lr"] for m in members]
            for g in range(len(members[0].optimizer.param_groups))
        ]
        self.optimizer.step(self.params, grads, lrs)
        with warnings.catch_warnings():
            # Each member's LambdaLR is stepped without its (unused) torch optimizer stepping.
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            for m in members:
                m.scheduler.step()
        return values

    # ------------------------------------------------------------------ evaluation, state
    def evaluate_now(self) -> None:
        """Each live member's Trainer.evaluate_now on its own weights; drop the diverged, and
        (after step 0, as Trainer.run) those at their ``training.stop_at_accuracy``."""
        diverged: list[tuple[int, Diverged]] = []
        reached: list[int] = []
        for j in range(len(self.live)):
            member = self.sync(j)
            try:
                member.evaluate_now()
            except Diverged as err:
                diverged.append((j, err))
                continue
            if self.step > 0 and member.reached_target():
                reached.append(j)
        for j, err in diverged:
            self.record_failure(j, err)
        if diverged or reached:
            self.take_off([j for j, _ in diverged] + reached)

    def save_checkpoints(self, start: float) -> None:
        """Each live member's checkpoint in the single-run format, so ``train_run()`` resumes it."""
        for j in range(len(self.live)):
            member = self.sync(j)
            opt = member.optimizer
            for name, p in member.model.named_parameters():
                opt.state[p] = {
                    "step": torch.tensor(float(self.optimizer.steps)),
                    "exp_avg": self.optimizer.exp_avg[name][j].clone(),
                    "exp_avg_sq": self.optimizer.exp_avg_sq[name][j].clone(),
                }
            save_checkpoint(
                member.checkpoint_dir,
                self.step,
                member.model,
                opt,
                member.scheduler,
                member.scalars(member.wall_time(start)),
            )
            opt.state.clear()

    def run(self, start: float | None = None) -> None:
        """Train every member to the end, to its divergence (see :attr:`failed`) or to its
        ``training.stop_at_accuracy``."""
        start = time.perf_counter() if start is None else start
        self.reporter.start(self.total, self.step)
        try:
            self.evaluate_now()
            while self.step < self.total and self.live:
                values = self.train_step()
                self.step += 1
                for k, value in zip(self.live, values, strict=True):
                    self.members[k].loss_sum += value
                    self.members[k].loss_count += 1
                if values:
                    self.reporter.step(self.step, sum(values) / len(values))
                if self.step % self.t.eval_every == 0 or self.step == self.total:
                    self.evaluate_now()
                    if self.live:
                        self.reporter.evaluated(self.step, self.members[self.live[0]].last_results)
                if self.step % self.t.checkpoint_every == 0 and self.step < self.total:
                    self.save_checkpoints(start)
            for j in range(len(self.live)):
                self.sync(j)
        finally:
            self.reporter.stop()


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
) -> list[dict[str, Any]]:
    """Train one group (no member finished, none with a checkpoint) into its run folders."""
    cfgs = [run.cfg for run in runs]

    def one_by_one() -> list[dict[str, Any]]:
        return [
            train_run(run, callbacks, datasets=datasets, reporter=reporter_for([run.cfg]))
            for run in runs
        ]

    if len(cfgs) == 1 or not use_vmap:
        return one_by_one()
    folders = [run.folder() for run in runs]
    group = GroupTrainer(cfgs, datasets, [f.path for f in folders], callbacks, reporter_for(cfgs))
    error = _vmap_error(group)
    if error is not None:
        warnings.warn(
            f"train_group: {cfgs[0].model.architecture} cannot be vmapped ({error}); "
            f"training its {len(cfgs)} runs one at a time",
            RuntimeWarning,
            stacklevel=3,
        )
        del group
        return one_by_one()

    with contextlib.ExitStack() as held:
        for folder in folders:
            held.enter_context(folder.locked())
        return _train_stack(group, folders)


def _train_stack(group: GroupTrainer, folders: Sequence[RunFolder]) -> list[dict[str, Any]]:
    start = time.perf_counter()
    for folder in folders:
        folder.prepare()
        folder.running()

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

    Finished runs are skipped; a run with a checkpoint is resumed alone by ``train_run()``;
    a group whose architecture does not vmap (or ``use_vmap=False``) trains one run at a
    time. ``datasets`` (shared by all runs, which must then have one task) saves rebuilding
    them; ``max_group`` caps the stack size. ``reporter_for(cfgs)`` gives the reporter of
    each stack or single run (default: no progress display). A crash (or a callback
    raising) marks the unfinished members of the group ``crashed`` and propagates, as
    ``train_run()`` does.
    """
    if len({run.run_dir.resolve() for run in runs}) != len(runs):
        raise ValueError("train_group: two runs share a run folder")
    for device in {run.device for run in runs}:
        check_device(device)
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

    fresh: list[int] = []
    for i, folder in enumerate(folders):
        if statuses[i] is not None:
            continue
        if has_checkpoint(folder.checkpoint_dir):
            statuses[i] = train_run(
                runs[i], callbacks, datasets=data_for(runs[i]), reporter=reporter_for([runs[i].cfg])
            )
        else:
            fresh.append(i)
    for group in groupable([runs[i].cfg for i in fresh], max_size=max_group):
        indices = [fresh[j] for j in group]
        members = [runs[i] for i in indices]
        with torch_threads(members[0].cfg.training.threads):
            results = _train_members(
                members, data_for(members[0]), callbacks, reporter_for, use_vmap
            )
        for i, status in zip(indices, results, strict=True):
            statuses[i] = status
    assert all(s is not None for s in statuses)
    return statuses  # type: ignore[return-value]
