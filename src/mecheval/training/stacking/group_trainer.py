"""The stacked trainer of a group (see group.py for what a group is and why): K same-shaped
runs, each an ordinary Trainer, whose training step is one vmapped call over their stacked
parameters, on the device from batch to update (replayed as a CUDA graph on a GPU)."""

from __future__ import annotations

import contextlib
import copy
import functools
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.func import grad_and_value, stack_module_state, vmap

from mecheval.tasks import Batch
from mecheval.tasks.batch import ANSWER_POSITIONS, ANSWERS
from mecheval.training.checkpoint import save_checkpoint
from mecheval.training.config import RunConfig, warmup_steps
from mecheval.training.metrics import answer_loss, multi_answer_loss
from mecheval.training.precision import (
    BF16_AUTOCAST,
    autocast,
    round_to_bf16,
    rounding_eps,
    stores_bf16,
    tf32,
)
from mecheval.training.reporter import NullReporter, Reporter
from mecheval.training.schedule import lr_factor
from mecheval.training.stacking.captured import CapturedStep, graphs_enabled
from mecheval.training.stacking.grouping import group_key
from mecheval.training.stacking.stack_feed import LossWatch, StackedBatches, check_interval
from mecheval.training.stacking.stacked import (
    Functional,
    GradClip,
    StackedAdamW,
    StepTables,
    Tensors,
    pad_stack,
)
from mecheval.training.trainer import Callback, Diverged, Trainer
from mecheval.training.turns import pass_turn


def query_loss(
    model: Any, tokens: torch.Tensor, query: torch.Tensor, answer: torch.Tensor
) -> torch.Tensor:
    """``answer_loss`` on one stack slot's batch, given as tensors (vmap maps tensors)."""
    return answer_loss(model, Batch(tokens, answer, {"query": query}))


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
        resume: bool = False,
    ) -> None:
        if len({group_key(cfg) for cfg in cfgs}) != 1:
            raise ValueError("GroupTrainer: the configs do not form one group (see groupable)")
        self.cfgs = list(cfgs)
        self.members = _members(cfgs, datasets, run_dirs, callbacks, resume)
        self.resumed = resume
        self.reporter = reporter or NullReporter()
        first = self.members[0]
        # One task, batch size and device: every member evaluates on the same batches.
        for member in self.members[1:]:
            member.eval_batches = first.eval_batches
        self.t = first.t
        self.total = first.total
        self.step = first.step
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
        self.optimizer = self._stacked_optimizer()
        if resume:
            self._take_moments()
        self._step_numbers()
        self.feed = self._stacked_feed()
        self.captured: CapturedStep | None = None
        # Captured where every step has one shape, and not under bf16 autocast, whose cache of
        # cast weights a graph must not keep (torch's CUDA-graph notes).
        self._capture = (
            graphs_enabled(self.device)
            and self.feed is not None
            and self.feed.fixed_width
            and self.t.precision not in BF16_AUTOCAST
        )
        self._width = 0
        self._gradient_functions()

    @property
    def replays(self) -> bool:
        """Whether the step is (to be) replayed as a CUDA graph."""
        return self._capture

    def _gradient_functions(self) -> None:
        """Each member's gradient and loss, vmapped over the stack: at the query; at extra
        query positions shared by every member; at every answer of a document, per member."""
        at_query = functools.partial(self._loss, query_loss)
        at_positions = functools.partial(self._loss, multi_answer_loss)
        self._grad_fn = vmap(grad_and_value(at_query))
        self._grad_fn_multi = vmap(grad_and_value(at_positions), in_dims=(0, 0, 0, None, 0))
        self._grad_fn_dense = vmap(grad_and_value(at_positions))

    def _stacked_optimizer(self) -> StackedAdamW:
        """The param groups (names, decay) exactly as make_optimizer built each member's."""
        first = self.members[0]
        names = {id(p): n for n, p in first.model.named_parameters()}
        groups = [[names[id(p)] for p in g["params"]] for g in first.optimizer.param_groups]
        decay = [
            [m.optimizer.param_groups[g]["weight_decay"] for m in self.members]
            for g in range(len(groups))
        ]
        return StackedAdamW(self.params, groups, decay, self.t.betas, self.t.eps)

    def _step_numbers(self) -> None:
        """Every per-step number on the device (see stack_feed.py and captured.py)."""
        first = self.members[0]
        total, warmup = self.total, warmup_steps(first.cfg)
        self.tables = StepTables(
            lambda s: lr_factor(s, total, warmup), total, self.t.betas, self.device
        )
        self.base_lr = torch.tensor(
            [[g["initial_lr"] for g in m.optimizer.param_groups] for m in self.members],
            dtype=torch.float64,
        ).T.to(self.device)  # [G, K]
        self.clip = GradClip([m.t.grad_clip for m in self.members], self.device)
        self.watch = LossWatch([m.ceiling for m in self.members], self.device)
        self.watch.start_from([(m.loss_sum, m.loss_count) for m in self.members])
        self.count = torch.full((1,), self.step, dtype=torch.long, device=self.device)
        self.check_every = check_interval(self.device)

    def _stacked_feed(self) -> StackedBatches | None:
        """The batches gathered on the device, unless the step draws extra queries on the
        host."""
        train_set = self.members[0].train_set
        if ANSWER_POSITIONS in train_set.extras or self.t.train_queries == 1:
            seeds = [m.t.seed for m in self.members]
            return StackedBatches(train_set, seeds, self.t.batch_size, self.device)
        return None

    @torch.no_grad()
    def _take_moments(self) -> None:
        """The members' restored AdamW state into the stack's (then dropped from theirs)."""
        for k, member in enumerate(self.members):
            for name, p in member.model.named_parameters():
                state = member.optimizer.state.get(p, {})
                if "exp_avg" in state:
                    self.optimizer.exp_avg[name][k].copy_(state["exp_avg"])
                    self.optimizer.exp_avg_sq[name][k].copy_(state["exp_avg_sq"])
            member.optimizer.state.clear()
        self.optimizer.steps = self.step

    # ------------------------------------------------------------------ the vmapped step
    def _loss(
        self,
        loss: Callable[..., torch.Tensor],
        params: Tensors,
        buffers: Tensors,
        *inputs: torch.Tensor,
    ) -> torch.Tensor:
        """``loss(model, *inputs)`` with the stack slot's parameters; autocast inside the
        differentiated function covers the forward only, as in Trainer.loss: grad_and_value
        runs the backward after this returns."""
        model = Functional(self.shell, params, buffers)
        with autocast(self.t.precision, self.device):
            return loss(model, *inputs)

    @contextlib.contextmanager
    def _precision(self) -> Iterator[None]:
        """The step's precision, as Trainer.train_step's: TF32 over forward and backward, bf16
        autocast over the forward (inside :meth:`_loss`)."""
        with warnings.catch_warnings(), tf32(self.t.precision, self.device):
            # vmap's per-slice fallback for ops without a batching rule: slower, still right.
            warnings.filterwarnings("ignore", message="There is a performance drop")
            yield

    def grads_and_losses(
        self, params: Tensors, buffers: Tensors, batches: Sequence[Batch], step: int
    ) -> tuple[Tensors, torch.Tensor]:
        """Every stacked model's gradient and loss on its own batch (``batches[k]``, on the
        host's side: the probe, and steps that draw extra queries), in ``training.precision``.
        ``training.compile`` is not applied: the stack trains eagerly (its results are the
        same; only single runs are compiled)."""
        with self._precision():
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
            grads, losses = self.grads_and_losses(params, buffers, batches, self.step)
        except Exception as err:  # noqa: BLE001 - any failure means "cannot vmap"
            return f"{type(err).__name__}: {err}"
        finally:
            self.live = saved_live
        for j, k in enumerate(live):
            member = self.members[k]
            model = member.model
            model.zero_grad(set_to_none=True)
            # At the group's step, as the vmapped call, in the same precision; through the
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

    def record_failure(self, slot: int, err: Diverged) -> None:
        self.failed[self.live[slot]] = err
        self.members[self.live[slot]].metrics.flush()

    def take_off(self, slots: Sequence[int]) -> None:
        """Remove stack ``slots`` from the stack (their members keep their last sync)."""
        dropped = set(slots)
        keep = [j for j in range(len(self.live)) if j not in dropped]
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.params = {n: p[index] for n, p in self.params.items()}
        self.buffers = {n: b[index] for n, b in self.buffers.items()}
        self.optimizer.keep(index)
        self.base_lr = self.base_lr[:, index]
        for part in (self.clip, self.watch, self.feed):
            if part is not None:
                part.keep(index)
        self.captured = None  # its tensors are gone: the next step captures anew
        self.live = [self.live[j] for j in keep]

    # ------------------------------------------------------------------ the step
    def _update(self, grads: Tensors, losses: torch.Tensor) -> None:
        """Everything of a step after the gradients, on the device: watch the losses, clip,
        AdamW at the step's factors, count the step."""
        self.watch.add(losses, self.count)
        stored = stores_bf16(self.t.precision)  # as Trainer.train_step rounds them
        if stored:
            round_to_bf16(grads.values())
        self.clip(grads)
        factor, bias1, bias2_sqrt = self.tables.at(self.count)
        self.optimizer.step(self.params, grads, self.base_lr * factor, bias1, bias2_sqrt)
        if stored:
            moments = [*self.optimizer.exp_avg.values(), *self.optimizer.exp_avg_sq.values()]
            round_to_bf16([*self.params.values(), *moments])
        self.count.add_(1)

    def _device_step(self) -> None:
        """A whole step from device tensors only (what a captured graph replays)."""
        assert self.feed is not None
        grad_fn = self._grad_fn_dense if self.feed.dense else self._grad_fn
        with self._precision():
            grads, losses = grad_fn(self.params, self.buffers, *self.feed.inputs(self._width))
        self._update(grads, losses)

    def train_step(self) -> None:
        """One optimizer step of every live member (their losses stay on the device until
        :meth:`check` reads them)."""
        step = self.step
        if self.feed is None:
            batches = [self.members[k].batch_at(step) for k in self.live]
            grads, losses = self.grads_and_losses(self.params, self.buffers, batches, step)
            self._update(grads, losses)
        else:
            self._width = self.feed.load(step)
            if self._capture:
                if self.captured is None:
                    self.captured = CapturedStep(self._device_step)
                self.captured()
                if self.captured.failed is not None:
                    self._capture = False  # the rest of the run steps eagerly, as it just did
                    self.reporter.warn(
                        f"{self.cfgs[0].model.architecture}: the training step could not be "
                        f"captured as a CUDA graph ({self.captured.failed}); training it eagerly"
                    )
            else:
                self._device_step()
        self.optimizer.steps += 1
        with warnings.catch_warnings():
            # Each member's LambdaLR is stepped without its (unused) torch optimizer stepping.
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            for k in self.live:
                self.members[k].scheduler.step()

    def check(self) -> None:
        """Read the losses back: give each member its running loss, report progress, and take
        the diverged members off the stack (recorded at the step they diverged)."""
        for k, (total, count) in zip(self.live, self.watch.sums(), strict=True):
            self.members[k].loss_sum, self.members[k].loss_count = total, count
        diverged = self.watch.diverged()
        if diverged:
            for j, err in diverged:
                self.record_failure(j, err)
            self.take_off([j for j, _ in diverged])
        if self.live:
            self.reporter.step(self.step, float(self.watch.last.mean()))

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
        self.watch.reset_sums()  # each member's Trainer.evaluate_now reset its own

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
            if not self.resumed:  # as Trainer.run: not again at a checkpoint's step
                self.evaluate_now()
            while self.step < self.total and self.live:
                self.train_step()
                self.step += 1
                evaluate = self.step % self.t.eval_every == 0 or self.step == self.total
                save = self.step % self.t.checkpoint_every == 0 and self.step < self.total
                if evaluate or save or self.step % self.check_every == 0:
                    self.check()
                if evaluate and self.live:
                    self.evaluate_now()
                    if self.live:
                        self.reporter.evaluated(self.step, self.members[self.live[0]].last_results)
                if save and self.live:
                    self.save_checkpoints(start)
                pass_turn()  # stacks side by side on one GPU: the next one launches its step
            for j in range(len(self.live)):
                self.sync(j)
        finally:
            self.reporter.stop()
            for member in self.members:
                member.trackers.close()


def _members(
    cfgs: Sequence[RunConfig],
    datasets: Mapping[str, Any],
    run_dirs: Sequence[Path],
    callbacks: Sequence[Callback],
    resume: bool,
) -> list[Trainer]:
    """One trainer per run. Resumed: every member restores its own checkpoint (weights, AdamW
    moments, schedule, running loss, metrics), as Trainer.run would, and the stack starts from
    there."""
    members = [
        Trainer(cfg, datasets, Path(run_dir), callbacks, NullReporter())
        for cfg, run_dir in zip(cfgs, run_dirs, strict=True)
    ]
    if resume:
        for member in members:
            if not member.resume():
                raise ValueError(f"GroupTrainer: {member.checkpoint_dir}: no checkpoint")
        if len({member.step for member in members}) != 1:
            raise ValueError("GroupTrainer: the members' checkpoints are at different steps")
    return members
