"""The training loop: answer-only cross-entropy, AdamW, warm-up + cosine, periodic evals and
checkpoints, exact resume.

Reproducibility: the model is initialised from ``training.seed``; the data order of epoch
``e`` is a permutation drawn from a generator seeded by (``training.seed``, ``e``) only, so the
batch at any step is a pure function of the config and a resumed run sees the same batches
as an uninterrupted one. Nothing else in the loop draws random numbers (no dropout), and the
global RNG state is checkpointed anyway, so that a mixer that does draw stays reproducible.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mecheval.models import LanguageModel, build_model
from mecheval.models.kernels import fused_kernels, require_fused
from mecheval.tasks import Batch
from mecheval.tasks.base import torch_generator
from mecheval.training.checkpoint import (
    CorruptCheckpoint,
    has_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from mecheval.training.config import RunConfig, config_to_data, total_steps, warmup_steps
from mecheval.training.folder import CHECKPOINT_DIR, METRICS_FILE
from mecheval.training.metrics import (
    MetricsLog,
    answer_loss,
    eval_batches,
    evaluate_batches,
    multi_answer_loss,
)
from mecheval.training.precision import (
    autocast,
    optimizer_moments,
    round_to_bf16,
    stores_bf16,
    tf32,
)
from mecheval.training.reporter import NullReporter, Reporter
from mecheval.training.schedule import make_scheduler
from mecheval.training.trackers import Trackers, scalars
from mecheval.training.turns import pass_turn

#: ``(step, model, run_dir) -> scalars or None``, called after each evaluation (step 0 and the
#: end included); how higher stages (e.g. interventions) hook into training without being
#: imported. What it returns (tag -> value) goes to the run's trackers (trackers.py).
Callback = Callable[[int, LanguageModel, Path], Mapping[str, float] | None]

# Separate random streams derived from training.seed, so that no use disturbs another.
_ORDER_STREAM = 0x0DA7A
_QUERY_STREAM = 0x0E7A9


class Diverged(RuntimeError):
    def __init__(self, step: int, reason: str) -> None:
        super().__init__(reason)
        self.step = step
        self.reason = reason


#: A training loss above this many times a uniform guess's (ln of the vocabulary size) is an
#: explosion: a run that learns never comes near it (an untrained model sits at about 1x),
#: while a run at a far too high LR can stay finite there and look "done" (attention at
#: lr=1e3 reached a dev loss of 8.6e6).
EXPLODED_LOSS_FACTOR = 10.0


def loss_ceiling(vocab_size: int) -> float:
    return EXPLODED_LOSS_FACTOR * math.log(max(vocab_size, 2))


def divergence(value: float, step: int, ceiling: float) -> Diverged | None:
    """Why the training loss ``value`` of optimizer step ``step`` (1-based) ends the run, or
    None: non-finite, or exploded past ``ceiling`` (:func:`loss_ceiling`)."""
    if not math.isfinite(value):
        return Diverged(step, f"diverged: training loss is {value} at step {step}")
    if value > ceiling:
        return Diverged(
            step,
            f"diverged: training loss {value:.3g} at step {step} exceeds {ceiling:.3g} "
            f"({EXPLODED_LOSS_FACTOR:g}x a uniform guess's)",
        )
    return None


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The permutation of ``n`` train documents used in ``epoch``: a function of (seed, epoch)."""
    return torch.randperm(n, generator=torch_generator(seed, epoch, _ORDER_STREAM, two_words=True))


def init_model(cfg: RunConfig) -> LanguageModel:
    """Build the model from ``training.seed`` without disturbing the caller's global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.training.seed)
        return build_model(cfg.model)


def make_optimizer(model: nn.Module, cfg: RunConfig) -> torch.optim.AdamW:
    t = cfg.training
    # Decay matrices only (the usual convention); the paper uses no decay at all.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": t.weight_decay},
        {"params": rest, "weight_decay": 0.0},
    ]
    # foreach: torch picks it only for CUDA tensors, yet on a CPU it gives the same bits as the
    # default per-tensor loop at ~15% less optimizer time, which these tiny models notice.
    return torch.optim.AdamW(groups, lr=t.lr, betas=t.betas, eps=t.eps, foreach=True)


class Trainer:
    """One run's training state and loop. ``cfg`` must be resolved (see ``config.resolve``)."""

    def __init__(
        self,
        cfg: RunConfig,
        datasets: Mapping[str, Any],
        run_dir: Path,
        callbacks: Sequence[Callback] = (),
        reporter: Reporter | None = None,
    ) -> None:
        self.cfg = cfg
        self.ceiling = loss_ceiling(cfg.model.vocab_size or 2)
        self.t = cfg.training
        self.datasets = datasets
        self.train_set = datasets["train"]
        self.run_dir = run_dir
        self.callbacks = tuple(callbacks)
        self.reporter = reporter or NullReporter()
        self.device = torch.device(self.t.device)
        if self.t.kernels == "fused":
            require_fused(self.device)
        self.total = total_steps(cfg)
        if len(self.train_set) < self.t.batch_size:
            raise ValueError(
                f"train set has {len(self.train_set)} documents, fewer than one batch "
                f"({self.t.batch_size})"
            )
        # Partial batches are dropped so that every step sees batch_size documents.
        self.per_epoch = len(self.train_set) // self.t.batch_size
        self.model = init_model(cfg).to(self.device)
        if stores_bf16(self.t.precision):  # as a model cast to bfloat16 after its init
            round_to_bf16([*self.model.parameters(), *self.model.buffers()])
        # The training forward may go through a compiled wrapper; it shares the model's
        # parameters, and everything else (evaluation, callbacks, checkpoints, the saved
        # state dict) uses the plain module, whose keys and eager semantics never change.
        # torch.compile is lazy: nothing is compiled until the first training step.
        self.train_model: nn.Module = torch.compile(self.model) if self.t.compile else self.model
        self.optimizer = make_optimizer(self.model, cfg)
        self.scheduler = make_scheduler(self.optimizer, self.total, warmup_steps(cfg))
        self.metrics = MetricsLog(run_dir / METRICS_FILE)
        self.trackers = Trackers(self.t.log, run_dir, config_to_data(cfg))
        self.step = 0
        self.loss_sum = 0.0  # running training loss since the last evaluation
        self.loss_count = 0
        self.wall_before = 0.0  # wall time spent in earlier sessions of this run
        self.last_results: dict[str, dict[str, float]] = {}
        self._order: tuple[int, torch.Tensor] | None = None

    # ------------------------------------------------------------------ data
    def batch_at(self, step: int) -> Batch:
        epoch, position = divmod(step, self.per_epoch)
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, epoch_order(len(self.train_set), self.t.seed, epoch))
        size = self.t.batch_size
        indices = self._order[1][position * size : (position + 1) * size]
        return self.train_set.batch(indices).to(self.device)

    @functools.cached_property
    def eval_batches(self) -> dict[str, list[Batch]]:
        """Each evaluation split's batches, on the device: made once per run (every
        evaluation reads the same documents), not sliced and copied again at each one."""
        assert self.t.eval_batch_size is not None
        return {
            split: eval_batches(self.datasets[split], self.t.eval_batch_size, self.device)
            for split in (*self.t.eval_splits, *self.t.eval_at_end)
        }

    # ------------------------------------------------------------------ state
    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / CHECKPOINT_DIR

    def scalars(self, wall: float) -> dict[str, Any]:
        epoch, position = divmod(self.step, self.per_epoch)
        return {
            "step": self.step,
            "epoch": epoch,
            "position": position,
            "loss_sum": self.loss_sum,
            "loss_count": self.loss_count,
            "wall_time": wall,
            "last_results": self.last_results,
        }

    def resume(self) -> bool:
        """Restore the last checkpoint if there is one; return whether it did."""
        if not has_checkpoint(self.checkpoint_dir):
            return False
        step, scalars = load_checkpoint(
            self.checkpoint_dir, self.model, self.optimizer, self.scheduler
        )
        if divmod(step, self.per_epoch) != (scalars["epoch"], scalars["position"]):
            raise CorruptCheckpoint(
                f"{self.checkpoint_dir}: data position does not match step {step}"
            )
        self.step = step
        self.loss_sum = float(scalars["loss_sum"])
        self.loss_count = int(scalars["loss_count"])
        self.wall_before = float(scalars["wall_time"])
        self.last_results = scalars["last_results"]
        # Rows written after the checkpoint will be written again, identically.
        self.metrics = MetricsLog.read(self.run_dir / METRICS_FILE)
        self.metrics.truncate(step)
        self.trackers.resumed_at(step)
        return True

    # ------------------------------------------------------------------ loop
    def query_generator(self, step: int) -> torch.Generator:
        """Draws step ``step``'s extra training queries: from (seed, step) alone, so a resumed
        run, or the same run trained in a group, extends its batches identically."""
        return torch_generator(self.t.seed, step, _QUERY_STREAM, two_words=True)

    def loss(self, batch: Batch, model: nn.Module | None = None) -> torch.Tensor:
        """The training loss on ``batch`` (forward under ``training.precision``'s autocast;
        float32 either way, as the loss functions cast the logits), through ``model``
        (default: :attr:`train_model`, compiled if ``training.compile``)."""
        model = self.train_model if model is None else model
        with (
            autocast(self.t.precision, self.device),
            fused_kernels(self.t.kernels == "fused"),
        ):
            if self.t.train_queries == 1:
                return answer_loss(model, batch)
            generator = self.query_generator(self.step)
            extend = self.cfg.task.extend_queries
            tokens, positions, answers = extend(batch, self.t.train_queries, generator)
            return multi_answer_loss(model, tokens, positions, answers)

    def train_step(self, batch: Batch) -> float:
        self.model.train()
        # TF32 covers the forward and the backward (whose products it speeds up as much);
        # the optimizer step does no matmuls, and evaluation runs outside, in float32.
        with tf32(self.t.precision, self.device):
            loss = self.loss(batch)
            value = loss.item()
            stop = divergence(value, self.step + 1, self.ceiling)
            if stop is not None:
                raise stop
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        stored = stores_bf16(self.t.precision)
        if stored:
            round_to_bf16(p.grad for p in self.model.parameters())
        if self.t.grad_clip is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.t.grad_clip)
        self.optimizer.step()
        if stored:
            round_to_bf16([*self.model.parameters(), *optimizer_moments(self.optimizer)])
        self.scheduler.step()
        return value

    def evaluate_now(self) -> None:
        step = self.step
        if not all(torch.isfinite(p).all() for p in self.model.parameters()):
            raise Diverged(step, f"diverged: non-finite weights at step {step}")
        train: dict[str, float] = {}
        if self.loss_count:
            train["running_loss"] = self.loss_sum / self.loss_count
        train["lr"] = self.optimizer.param_groups[0]["lr"]
        self.metrics.add(step, "train", train)
        self.loss_sum, self.loss_count = 0.0, 0
        results: dict[str, dict[str, float]] = {}
        for split in self.t.eval_splits:
            results[split] = evaluate_batches(self.model, self.eval_batches[split])
            self.metrics.add(step, split, results[split])
        self.last_results = results
        if self.t.eval_at_end and (step == self.total or (step > 0 and self.reached_target())):
            for split in self.t.eval_at_end:
                results[split] = evaluate_batches(self.model, self.eval_batches[split])
                self.metrics.add(step, split, results[split])
        self.metrics.flush()
        self.reporter.evaluated(step, results)
        logged = scalars({"train": train, **results})
        if self.callbacks:
            self.model.eval()
            try:
                for callback in self.callbacks:
                    logged.update(callback(step, self.model, self.run_dir) or {})
            finally:
                self.model.train()
        self.trackers.log(step, logged)

    def reached_target(self) -> bool:
        """Whether the last evaluation's dev accuracy reached ``training.stop_at_accuracy``."""
        target = self.t.stop_at_accuracy
        if target is None:
            return False
        return self.last_results.get("dev", {}).get("accuracy", 0.0) >= target

    def stop_note(self) -> dict[str, str]:
        """The status note of a run that stopped at its target before its last step."""
        if self.step >= self.total:
            return {}
        accuracy = self.last_results["dev"]["accuracy"]
        return {
            "stopped_early": f"stopped at step {self.step} of {self.total}: dev accuracy "
            f"{accuracy:.4f} >= training.stop_at_accuracy {self.t.stop_at_accuracy:g}"
        }

    def run(self, clock: Callable[[], float] = time.perf_counter) -> dict[str, dict[str, float]]:
        """Train to the end, or to the first evaluation that reaches
        ``training.stop_at_accuracy`` (resuming if a checkpoint exists); return the final
        eval results.

        Raises :class:`Diverged` on a non-finite loss or weights.
        """
        start = clock()
        resumed = self.resume()
        self.reporter.start(self.total, self.step)
        try:
            if not resumed:
                self.evaluate_now()
            while self.step < self.total:
                loss = self.train_step(self.batch_at(self.step))
                self.step += 1
                self.loss_sum += loss
                self.loss_count += 1
                self.reporter.step(self.step, loss)
                if self.step % self.t.eval_every == 0 or self.step == self.total:
                    self.evaluate_now()
                    if self.reached_target():
                        break
                if self.step % self.t.checkpoint_every == 0 and self.step < self.total:
                    save_checkpoint(
                        self.checkpoint_dir,
                        self.step,
                        self.model,
                        self.optimizer,
                        self.scheduler,
                        self.scalars(self.wall_time(start, clock)),
                    )
                pass_turn()  # runs side by side on one GPU (training/turns.py)
        except Diverged:
            # Keep what was measured up to the divergence.
            self.metrics.flush()
            raise
        finally:
            self.reporter.stop()
            self.trackers.close()
        return self.last_results

    def wall_time(self, start: float, clock: Callable[[], float] = time.perf_counter) -> float:
        return self.wall_before + (clock() - start)
