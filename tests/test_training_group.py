"""Multi-model training (training/stacking/group.py, stacked.py): a group's run folders equal
one-by-one train() runs (weights to float32 tolerance, metrics rows, statuses), per-member
divergence, the stacked AdamW and per-model clipping against torch, grouping, skip and
resume."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file
from small_runs import TASK, config
from torch import nn

from mecheval.models import ARCHITECTURES, registry
from mecheval.models.mixers.base import Mixer
from mecheval.tasks import build_datasets
from mecheval.training import read_status, resolve, train
from mecheval.training.config import total_steps
from mecheval.training.stacking import group as group_module
from mecheval.training.stacking import group_trainer
from mecheval.training.stacking.group import GroupTrainer, groupable, train_group
from mecheval.training.stacking.stack_feed import StackedBatches
from mecheval.training.stacking.stacked import StackedAdamW, clip_grad_norms_, pad_stack
from mecheval.training.trainer import Trainer
from mecheval.training.turns import Baton

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def data():
    return build_datasets(resolve(config()).task)


def assert_same_run(group_dir: Path, single_dir: Path, rtol: float = 1e-4) -> None:
    """The folder a group member leaves equals train()'s: files, status fields, metrics rows
    (values to float tolerance) and final weights (float32 tolerance)."""
    assert sorted(p.name for p in group_dir.iterdir()) == sorted(
        p.name for p in single_dir.iterdir()
    )
    assert (group_dir / "config.yaml").read_text() == (single_dir / "config.yaml").read_text()
    sg, ss = read_status(group_dir), read_status(single_dir)
    assert sg.keys() == ss.keys()
    for key in ("state", "reason", "step", "total_steps"):
        assert sg[key] == ss[key], key
    fg, fs = pd.read_csv(group_dir / "metrics.csv"), pd.read_csv(single_dir / "metrics.csv")
    assert fg[["step", "split", "metric"]].equals(fs[["step", "split", "metric"]])
    torch.testing.assert_close(
        torch.tensor(fg["value"].values), torch.tensor(fs["value"].values), rtol=rtol, atol=1e-5
    )
    if ss["state"] == "done":
        wg, ws = (
            load_file(group_dir / "model.safetensors"),
            load_file(single_dir / "model.safetensors"),
        )
        assert wg.keys() == ws.keys()
        for key in wg:
            a, b = wg[key], ws[key]
            if key.endswith("mixer.qkv.bias"):
                # Softmax ignores a shift shared by all scores, so the key bias's gradient is
                # exactly zero in exact arithmetic: Adam normalises its rounding noise (which
                # differs between batched and single kernels) into steps of up to ~lr that
                # change no output. Compared loosely; the q and v parts are not.
                d = a.shape[0] // 3
                torch.testing.assert_close(a[d : 2 * d], b[d : 2 * d], rtol=0, atol=1e-3)
                a, b = torch.cat([a[:d], a[2 * d :]]), torch.cat([b[:d], b[2 * d :]])
            # atol 5e-5: Adam divides by sqrt(v), so where a gradient entry is tiny the ulp-level
            # difference between batched and single kernels becomes a weight difference of a
            # few 1e-5 after a few steps at lr 1e-2 (seen: 2.2e-5 on one DeltaNet weight).
            torch.testing.assert_close(
                a, b, rtol=rtol, atol=5e-5, msg=lambda m, key=key: f"{key}: {m}"
            )


@dataclass
class StackSpy:
    """What a train_group call really ran (recorded only while ``active``)."""

    active: bool = False
    #: one entry per stacked step (GroupTrainer.train_step): (step, members on the stack,
    #: the leading size of every parameter and loss each vmapped call inside it got)
    stacked: list[tuple[int, int, list[tuple[set[int], int]]]] = field(default_factory=list)
    vmapped: list[tuple[set[int], int]] = field(default_factory=list)  # vmapped calls
    single_steps: int = 0  # Trainer.train_step calls: a model trained on its own
    fallback: list[Path] = field(default_factory=list)  # run folders given to train()

    def sizes(self) -> list[int]:
        return [k for _, k, _ in self.stacked]

    def assert_stacked(self, total: int, sizes: list[int]) -> None:
        """Every step ran as one vmapped call over the live members (``sizes[step]`` of them),
        and no member trained alone, by train() or a Trainer's own step."""
        assert [step for step, _, _ in self.stacked] == list(range(total))
        assert self.sizes() == sizes
        for _, k, calls in self.stacked:
            assert calls == [({k}, k)]
        assert self.single_steps == 0 and self.fallback == []


@pytest.fixture
def spy(monkeypatch) -> StackSpy:
    """Spies on the stacked path (GroupTrainer.train_step and the vmapped gradient function
    group_trainer.py builds with ``torch.func.vmap``) and on the per-model ones (``train_run()`` as
    group.py calls it, ``Trainer.train_step``)."""
    spy = StackSpy()
    vmap, stacked_step = group_trainer.vmap, GroupTrainer.train_step
    single_step, single_train = Trainer.train_step, group_module.train_run

    def spying_vmap(fn, *args, **kwargs):
        batched = vmap(fn, *args, **kwargs)

        def call(params, *rest):
            grads, losses = batched(params, *rest)
            if spy.active:
                leading = {p.shape[0] for p in params.values()}
                leading |= {g.shape[0] for g in grads.values()}
                spy.vmapped.append((leading, losses.shape[0]))
            return grads, losses

        return call

    def spying_stacked_step(self):
        step, k, before = self.step, len(self.live), len(spy.vmapped)
        values = stacked_step(self)
        if spy.active:
            spy.stacked.append((step, k, spy.vmapped[before:]))
        return values

    def spying_single_step(self, *args, **kwargs):
        spy.single_steps += spy.active
        return single_step(self, *args, **kwargs)

    def spying_train(run, *args, **kwargs):
        if spy.active:
            spy.fallback.append(run.run_dir)
        return single_train(run, *args, **kwargs)

    monkeypatch.setattr(group_trainer, "vmap", spying_vmap)
    monkeypatch.setattr(GroupTrainer, "train_step", spying_stacked_step)
    monkeypatch.setattr(Trainer, "train_step", spying_single_step)
    monkeypatch.setattr(group_module, "train_run", spying_train)
    return spy


def spied_group(spy: StackSpy, cfgs, run_dirs, **kwargs) -> list[dict]:
    spy.active = True
    try:
        return train_group(cfgs, run_dirs, **kwargs)
    finally:
        spy.active = False


def run_both(tmp_path: Path, cfgs, data, spy: StackSpy, **kwargs) -> tuple[list[dict], list[dict]]:
    group = spied_group(
        spy, cfgs, [tmp_path / f"g{i}" for i in range(len(cfgs))], datasets=data, **kwargs
    )
    single = [train(cfg, tmp_path / f"s{i}", datasets=data) for i, cfg in enumerate(cfgs)]
    return group, single


# ---------------------------------------------------------------------------- equivalence


def test_attention_group_equals_one_by_one(tmp_path: Path, data, spy: StackSpy) -> None:
    cfgs = [
        config(lr=3e-3, seed=0),
        config(lr=1e-2, seed=1, weight_decay=0.1),
        config(lr=1e-3, seed=2, grad_clip=0.05),  # small enough to clip every step
    ]
    group, single = run_both(tmp_path, cfgs, data, spy)
    assert [s["state"] for s in group] == ["done"] * 3
    # Trained as one stack of three: a silent fallback to one run at a time (which the
    # comparison below would pass) shows up here.
    spy.assert_stacked(8, [3] * 8)
    for i in range(3):
        assert_same_run(tmp_path / f"g{i}", tmp_path / f"s{i}")
    # The members really differ (different lr/seed reached different weights).
    w0, w1 = (
        load_file(tmp_path / "g0" / "model.safetensors"),
        load_file(tmp_path / "g1" / "model.safetensors"),
    )
    assert not torch.allclose(w0["embedding.weight"], w1["embedding.weight"])


def assert_stack_equals_one_by_one(
    tmp_path: Path, data, arch: str, device: str, spy: StackSpy, steps: int = 4, **training
) -> None:
    """Two runs of ``steps`` steps, evaluated twice (``training`` overrides both), stacked
    leave the folders they leave alone."""
    every = steps // 2
    cfgs = [
        config(arch, lr=3e-3, seed=0, steps=steps, eval_every=every, device=device, **training),
        config(arch, lr=1e-2, seed=1, steps=steps, eval_every=every, device=device, **training),
    ]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        group, _ = run_both(tmp_path, cfgs, data, spy)
    # It trained as a group (a fallback to one-by-one would pass the comparison trivially).
    assert not [w for w in record if "cannot be vmapped" in str(w.message)], arch
    spy.assert_stacked(steps, [2] * steps)
    assert [s["state"] for s in group] == ["done", "done"]
    for i in range(2):
        assert_same_run(tmp_path / f"g{i}", tmp_path / f"s{i}")


@pytest.mark.parametrize("arch", sorted(set(ARCHITECTURES) - {"attention"}))
def test_group_equals_one_by_one(tmp_path: Path, data, arch: str, spy: StackSpy) -> None:
    assert_stack_equals_one_by_one(tmp_path, data, arch, "cpu", spy)


def test_extra_train_queries(tmp_path: Path, data, spy: StackSpy) -> None:
    cfgs = [config(train_queries=2, seed=0), config(train_queries=2, seed=1, lr=1e-2)]
    run_both(tmp_path, cfgs, data, spy)
    spy.assert_stacked(8, [2] * 8)
    for i in range(2):
        assert_same_run(tmp_path / f"g{i}", tmp_path / f"s{i}")


def test_dense_answers_of_mqar(tmp_path: Path, spy: StackSpy) -> None:
    """MQAR's training documents carry every query's position and answer (a [B, Q] pair
    per batch, different per member): the stacked loss takes them as Trainer.loss does."""
    task = {"kind": "mqar", "n_keys": 8, "n_values": 8, "n_pairs": 3, "seq_len": 14}
    task |= {"n_train": 64, "n_dev": 8, "n_test": 8}
    cfgs = [config(task=task, seed=0), config(task=task, seed=1, lr=1e-2)]
    mqar_data = build_datasets(resolve(cfgs[0]).task)
    assert "answer_positions" in mqar_data["train"].extras
    run_both(tmp_path, cfgs, mqar_data, spy)
    spy.assert_stacked(8, [2] * 8)
    for i in range(2):
        assert_same_run(tmp_path / f"g{i}", tmp_path / f"s{i}")


# ---------------------------------------------------------------------------- divergence


def test_one_member_diverges_others_finish(tmp_path: Path, data, spy: StackSpy) -> None:
    cfgs = [config(lr=3e-3, seed=0), config(lr=1e6, seed=1), config(lr=1e-2, seed=2)]
    group, single = run_both(tmp_path, cfgs, data, spy)
    assert [s["state"] for s in group] == ["done", "failed", "done"]
    assert single[1]["state"] == "failed"
    assert group[1]["reason"] == single[1]["reason"]
    assert group[1]["reason"].startswith("diverged: training loss is ")
    assert group[1]["step"] == single[1]["step"] < 8
    # Three on the stack up to the step whose loss diverged, then the other two, still stacked.
    failed_at = group[1]["step"]
    spy.assert_stacked(8, [3] * failed_at + [2] * (8 - failed_at))
    assert not (tmp_path / "g1" / "model.safetensors").exists()
    for i in range(3):
        assert_same_run(tmp_path / f"g{i}", tmp_path / f"s{i}")


def test_non_finite_weights_at_evaluation(tmp_path: Path, data, monkeypatch, spy: StackSpy) -> None:
    """A member whose weights turn non-finite (loss still finite) fails at the next evaluation
    with the Trainer's reason; the other member is unaffected."""
    cfgs = [config(seed=0), config(seed=1)]
    original = StackedAdamW.step

    def poison(self, params, *args):
        original(self, params, *args)
        if self.steps == 3 and self.size == 2:  # the step before the eval at 4 (counted after)
            params["final_norm.norm.bias"][1] = float("inf")  # slot 1: member 1

    monkeypatch.setattr(StackedAdamW, "step", poison)
    group = spied_group(spy, cfgs, [tmp_path / "g0", tmp_path / "g1"], datasets=data)
    assert group[0]["state"] == "done"
    assert group[1]["state"] == "failed"
    assert group[1]["reason"] == "diverged: non-finite weights at step 4"
    assert group[1]["step"] == 4
    spy.assert_stacked(8, [2] * 4 + [1] * 4)  # member 0 goes on alone, on the stack
    train(cfgs[0], tmp_path / "s0", datasets=data)
    assert_same_run(tmp_path / "g0", tmp_path / "s0")


# ---------------------------------------------------------------------------- optimizer


def test_stacked_adamw_equals_torch_adamw() -> None:
    torch.manual_seed(0)
    k = 3
    models = [nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2)) for _ in range(k)]
    lrs, decays = [1e-2, 3e-3, 1e-1], [0.0, 0.1, 0.5]
    references = [
        torch.optim.AdamW(
            [
                {"params": [p for p in m.parameters() if p.dim() >= 2], "weight_decay": wd},
                {"params": [p for p in m.parameters() if p.dim() < 2], "weight_decay": 0.0},
            ],
            lr=lr,
            betas=(0.8, 0.99),
            eps=1e-6,
        )
        for m, lr, wd in zip(models, lrs, decays, strict=True)
    ]
    names = [n for n, _ in models[0].named_parameters()]
    stacked = {
        n: torch.stack([dict(m.named_parameters())[n].detach() for m in models]) for n in names
    }
    matrices = [n for n in names if stacked[n].dim() >= 3]
    vectors = [n for n in names if n not in matrices]
    opt = StackedAdamW(stacked, [matrices, vectors], [decays, [0.0] * k], (0.8, 0.99), 1e-6)
    for step in range(6):
        factor = (step + 1) / 6  # a changing schedule, different per model through the base lr
        grads = {n: torch.randn_like(p) for n, p in stacked.items()}
        for i, (m, ref) in enumerate(zip(models, references, strict=True)):
            for group in ref.param_groups:
                group["lr"] = lrs[i] * factor
            for n, p in m.named_parameters():
                p.grad = grads[n][i].clone()
            ref.step()
        lr = torch.tensor([[lr * factor for lr in lrs]] * 2, dtype=torch.float64)
        bias1 = torch.tensor(1 - 0.8 ** (step + 1), dtype=torch.float64)
        bias2_sqrt = torch.tensor((1 - 0.99 ** (step + 1)) ** 0.5, dtype=torch.float64)
        opt.step(stacked, grads, lr, bias1, bias2_sqrt)
        opt.steps += 1
    for i, m in enumerate(models):
        for n, p in m.named_parameters():
            torch.testing.assert_close(stacked[n][i], p.detach(), msg=n)
    # And the models did move differently (a shared lr would fail the comparison above).
    assert not torch.allclose(stacked[names[0]][0], stacked[names[0]][2])


def test_per_model_clipping_equals_clip_grad_norm() -> None:
    torch.manual_seed(0)
    grads = {"a": torch.randn(3, 4, 5) * 3, "b": torch.randn(3, 7)}
    limits = [1.0, None, 100.0]
    expected = []
    for i, limit in enumerate(limits):
        parts = [grads["a"][i].clone(), grads["b"][i].clone()]
        params = [nn.Parameter(torch.zeros_like(g)) for g in parts]
        for p, g in zip(params, parts, strict=True):
            p.grad = g
        if limit is not None:
            nn.utils.clip_grad_norm_(params, limit)
        expected.append([p.grad for p in params])
    clip_grad_norms_(grads, limits)
    for i in range(3):
        torch.testing.assert_close(grads["a"][i], expected[i][0])
        torch.testing.assert_close(grads["b"][i], expected[i][1])
    assert torch.linalg.vector_norm(torch.cat([g[0].flatten() for g in grads.values()])) < 1.0001


# ---------------------------------------------------------------------------- grouping


def test_groupable_partitions() -> None:
    other_task = {**TASK, "n_pairs": 3}
    cfgs = [
        config(lr=1e-3),
        config(d_model=32),
        config(lr=1e-2, seed=4, weight_decay=0.1, grad_clip=1.0),
        config("mamba"),
        config(task=other_task),
        config(batch_size=8),
        config(d_model=32, seed=7),
        config(steps=9),
    ]
    assert groupable(cfgs) == [[0, 2], [1, 6], [3], [4], [5], [7]]
    assert groupable([config(seed=s) for s in range(5)], max_size=2) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="one group"):
        GroupTrainer([resolve(cfgs[0]), resolve(cfgs[1])], {}, [Path("a"), Path("b")])


# ---------------------------------------------------------------------------- skip, resume


def test_skips_finished_and_resumes_interrupted(tmp_path: Path, data) -> None:
    cfgs = [
        config(seed=0, steps=12, checkpoint_every=4),
        config(seed=1, steps=12, lr=1e-2, checkpoint_every=4),
    ]
    dirs = [tmp_path / "g0", tmp_path / "g1"]

    class Crash(RuntimeError):
        pass

    def crash_at_8(step, model, run_dir):
        if step == 8 and run_dir == dirs[1]:
            raise Crash("simulated crash")

    with pytest.raises(Crash):
        train_group(cfgs, dirs, datasets=data, callbacks=[crash_at_8])
    for d in dirs:
        status = read_status(d)
        assert status["state"] == "failed" and status["reason"].startswith("crashed")
        assert json.loads((d / "checkpoint" / "state.json").read_text())["step"] == 4
    # Resumed (as one stack) from the group's checkpoints: ends as uninterrupted runs.
    statuses = train_group(cfgs, dirs, datasets=data)
    assert [s["state"] for s in statuses] == ["done", "done"]
    for i, cfg in enumerate(cfgs):
        train(cfg, tmp_path / f"s{i}", datasets=data)
        assert_same_run(dirs[i], tmp_path / f"s{i}")
    # Finished: skipped, nothing rewritten.
    before = [(d / "status.json").stat().st_mtime_ns for d in dirs]
    again = train_group(cfgs, dirs, datasets=data)
    assert again == statuses
    assert [(d / "status.json").stat().st_mtime_ns for d in dirs] == before


def _interrupted_at_8(cfgs, dirs, data) -> None:
    """Train ``cfgs`` into ``dirs`` as a group, crashing at step 8's evaluation."""

    class Crash(RuntimeError):
        pass

    def crash_at_8(step, model, run_dir):
        if step == 8:
            raise Crash("simulated crash")

    with pytest.raises(Crash):
        train_group(cfgs, dirs, datasets=data, callbacks=[crash_at_8])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_an_interrupted_group_resumes_as_one_stack_bit_for_bit(
    tmp_path: Path, data, monkeypatch, device: str
) -> None:
    # Checkpoints every 3 steps, evaluations every 4: the stack resumes at step 6, between
    # two evaluations, with each member's running loss carried over. On CUDA the step is
    # captured anew at the resumed step.
    cfgs = [
        config(seed=s, steps=12, lr=lr, checkpoint_every=3, device=device)
        for s, lr in [(0, 3e-3), (1, 1e-2), (2, 1e-3)]
    ]
    whole = [tmp_path / f"whole{i}" for i in range(3)]
    train_group(cfgs, whole, datasets=data)
    dirs = [tmp_path / f"g{i}" for i in range(3)]
    _interrupted_at_8(cfgs, dirs, data)
    assert {json.loads((d / "checkpoint" / "state.json").read_text())["step"] for d in dirs} == {6}

    stacks: list[tuple[int, bool]] = []
    original = GroupTrainer.__init__

    def spy(self, cfgs, *args, resume=False, **kwargs):
        stacks.append((len(cfgs), resume))
        original(self, cfgs, *args, resume=resume, **kwargs)

    monkeypatch.setattr(GroupTrainer, "__init__", spy)
    statuses = train_group(cfgs, dirs, datasets=data)
    assert stacks == [(3, True)]
    assert [s["state"] for s in statuses] == ["done"] * 3
    for d, w in zip(dirs, whole, strict=True):
        assert (d / "model.safetensors").read_bytes() == (w / "model.safetensors").read_bytes()
        assert (d / "metrics.csv").read_bytes() == (w / "metrics.csv").read_bytes()


def test_a_group_with_an_unreadable_checkpoint_resumes_one_run_at_a_time(
    tmp_path: Path, data
) -> None:
    cfgs = [config(seed=s, steps=12, checkpoint_every=4) for s in (0, 1)]
    dirs = [tmp_path / f"g{i}" for i in range(2)]
    _interrupted_at_8(cfgs, dirs, data)
    (tensors,) = (dirs[1] / "checkpoint").glob("step-*.safetensors")
    tensors.write_bytes(b"\x00garbage")
    statuses = train_group(cfgs, dirs, datasets=data)
    assert [s["state"] for s in statuses] == ["done", "done"]
    assert "discarded_checkpoint" not in statuses[0]
    assert str(tensors) in statuses[1]["discarded_checkpoint"]
    # Each trained alone by train_run(): the first from the stack's checkpoint (so equal to a
    # single run to float tolerance), the second from step 0 (so exactly a single run).
    for i, cfg in enumerate(cfgs):
        train(cfg, tmp_path / f"s{i}", datasets=data)
    assert_same_run(dirs[0], tmp_path / "s0")
    for name in ("model.safetensors", "metrics.csv"):
        assert (dirs[1] / name).read_bytes() == (tmp_path / "s1" / name).read_bytes()


# ---------------------------------------------------------------------------- fallback


class InPlaceShift(Mixer):
    """Writes into a freshly allocated buffer in place: a pattern vmap cannot batch."""

    def __init__(self, d_model: int, options) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape[0], x.shape[1], x.shape[2])
        out[:, 1:] = x[:, :-1]
        return self.proj(out) + x


@pytest.fixture
def inplace_arch():
    registry.architecture("inplace-shift-test")(InPlaceShift)
    yield "inplace-shift-test"
    del registry.ARCHITECTURES["inplace-shift-test"]


def test_architecture_that_cannot_vmap_trains_one_by_one(
    tmp_path: Path, data, inplace_arch, spy: StackSpy
) -> None:
    cfgs = [config(inplace_arch, seed=0), config(inplace_arch, seed=1, lr=1e-2)]
    with pytest.warns(RuntimeWarning, match="inplace-shift-test cannot be vmapped"):
        group, single = run_both(tmp_path, cfgs, data, spy)
    assert [s["state"] for s in group] == ["done", "done"]
    # The fallback, as the spy sees it: no stacked step, each run trained alone by train().
    total = total_steps(resolve(cfgs[0]))
    assert spy.stacked == [] and spy.fallback == [tmp_path / "g0", tmp_path / "g1"]
    assert spy.single_steps == 2 * total
    for i in range(2):
        assert_same_run(tmp_path / f"g{i}", tmp_path / f"s{i}", rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_cuda_group_equals_one_by_one(
    tmp_path: Path, data, arch: str, spy: StackSpy, monkeypatch
) -> None:
    """Where it pays, on a GPU: a stack on CUDA leaves the run folders one-by-one CUDA runs
    leave, for every architecture (vmap batching rules differ between devices). Eager, so
    that the spy sees every vmapped call; the captured step is held to the eager one below."""
    monkeypatch.setenv("MECHEVAL_CUDA_GRAPH", "0")
    assert_stack_equals_one_by_one(tmp_path, data, arch, "cuda", spy)


# ---------------------------------------------------------------------------- the device feed


@pytest.mark.parametrize(
    "task",
    [TASK, {"kind": "atr", "n_train": 64, "n_dev": 16, "n_test": 16}],
    ids=["ar", "atr-lengths-vary"],
)
def test_stacked_batches_equal_each_members_batches(task: dict) -> None:
    """The stack's batches, gathered on the device at each step, are every member's own
    Trainer.batch_at (its seed's order, across epochs), cut to the stack's longest document
    as pad_stack cuts the members' batches."""
    cfgs = [config(task=task, seed=s, batch_size=8) for s in (0, 3, 7)]
    datasets = build_datasets(resolve(cfgs[0]).task)
    members = [Trainer(resolve(c), datasets, Path("unused")) for c in cfgs]
    feed = StackedBatches(datasets["train"], [0, 3, 7], 8, torch.device("cpu"))
    widths = set()
    for step in range(2 * members[0].per_epoch + 1):  # into a third epoch
        batches = [m.batch_at(step) for m in members]
        width = feed.load(step)
        tokens, query, answer = feed.inputs(width)
        assert torch.equal(tokens, pad_stack([b.tokens for b in batches]))
        assert torch.equal(query, torch.stack([b.query for b in batches]))
        assert torch.equal(answer, torch.stack([b.answer for b in batches]))
        widths.add(width)
    assert feed.fixed_width == (len(widths) == 1)
    if task["kind"] == "atr":
        assert len(widths) > 1  # the cut was exercised


def test_losses_read_every_few_steps_give_the_same_runs(tmp_path: Path, data, monkeypatch) -> None:
    """Off a CPU the host reads the losses every CHECK_EVERY steps; doing so on the CPU
    (every 5 steps) leaves the same run folders, byte for byte, as reading them at every
    step, a diverged member included: recorded at the step its loss diverged."""
    cfgs = [config(lr=3e-3, seed=0), config(lr=1e6, seed=1), config(lr=1e-2, seed=2)]
    train_group(cfgs, [tmp_path / f"every{i}" for i in range(3)], datasets=data)
    monkeypatch.setattr(group_trainer, "check_interval", lambda device: 5)
    statuses = train_group(cfgs, [tmp_path / f"fifth{i}" for i in range(3)], datasets=data)
    assert [s["state"] for s in statuses] == ["done", "failed", "done"]
    reads = [s for s in range(1, 9) if s % 5 == 0 or s % 4 == 0]  # and at each evaluation
    assert statuses[1]["step"] not in reads  # it diverged between two reads
    for i in range(3):
        for name in ("metrics.csv", "model.safetensors"):
            ours, reference = tmp_path / f"fifth{i}" / name, tmp_path / f"every{i}" / name
            assert ours.exists() == reference.exists()
            if ours.exists():
                assert ours.read_bytes() == reference.read_bytes(), (i, name)
        a, b = read_status(tmp_path / f"fifth{i}"), read_status(tmp_path / f"every{i}")
        assert (a["state"], a["reason"], a["step"]) == (b["state"], b["reason"], b["step"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_cuda_graph_step_equals_eager_step(tmp_path: Path, data, arch: str, monkeypatch) -> None:
    """On a GPU the stack's step is captured once and replayed; the replay leaves the
    parameters the eager step leaves (the same kernels, so the same bits)."""
    cfgs = [config(arch, lr=3e-3, seed=s, steps=12, eval_every=6, device="cuda") for s in (0, 1)]
    cfgs = [resolve(c) for c in cfgs]

    def trained(name: str) -> GroupTrainer:
        folders = [tmp_path / f"{name}{i}" for i in range(2)]
        for folder in folders:
            folder.mkdir()
        group = GroupTrainer(cfgs, data, folders)
        group.run()
        return group

    graphed = trained("graph")
    assert graphed.captured is not None and graphed.captured.failed is None
    assert graphed.captured.replaying
    monkeypatch.setenv("MECHEVAL_CUDA_GRAPH", "0")
    eager = trained("eager")
    assert eager.captured is None
    for name, p in eager.params.items():
        torch.testing.assert_close(graphed.params[name], p, rtol=0, atol=0, msg=name)


# ---------------------------------------------------------------------------- a lone run


def test_lone_run_on_a_cpu_trains_with_the_single_run_trainer(
    tmp_path: Path, data, spy: StackSpy
) -> None:
    """Where no CUDA graph replays its step, a lone run is train_run()'s: nothing stacked."""
    spied_group(spy, [config(lr=3e-3)], [tmp_path / "g0"], datasets=data)
    assert spy.stacked == [] and spy.fallback == [tmp_path / "g0"]


def test_lone_run_whose_step_replays_trains_as_a_stack_of_one(
    tmp_path: Path, data, spy: StackSpy, monkeypatch
) -> None:
    """Where its step would be replayed as a CUDA graph, a lone run trains as a stack of one
    (the captured step is the stack's) and leaves the folder train() leaves alone. Here on
    the CPU, eagerly: that the replay equals the eager step is held on CUDA below."""
    monkeypatch.setattr(group_module, "graphs_enabled", lambda device: True)
    monkeypatch.setattr(GroupTrainer, "replays", property(lambda self: True))
    cfg = config("mamba", lr=3e-3, seed=1)
    statuses, _ = run_both(tmp_path, [cfg], data, spy)
    assert statuses[0]["state"] == "done"
    spy.assert_stacked(total_steps(resolve(cfg)), [1] * total_steps(resolve(cfg)))
    assert_same_run(tmp_path / "g0", tmp_path / "s0")


def test_lone_run_whose_stack_would_not_replay_trains_alone(
    tmp_path: Path, data, spy: StackSpy, monkeypatch
) -> None:
    """A stack of one that would step eagerly (bf16, documents of varying width, graphs off)
    gains nothing over the single-run trainer: the run trains alone."""
    monkeypatch.setattr(group_module, "graphs_enabled", lambda device: True)
    spied_group(spy, [config(lr=3e-3)], [tmp_path / "g0"], datasets=data)
    assert spy.stacked == [] and spy.fallback == [tmp_path / "g0"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_cuda_lone_run_replays_its_step(
    tmp_path: Path, data, arch: str, spy: StackSpy, monkeypatch
) -> None:
    """On a GPU a lone run's step is captured and replayed (a stack of one), and the run
    leaves the folder the eager single-run trainer leaves, to float32 tolerance."""
    cfg = config(arch, lr=3e-3, seed=0, steps=12, eval_every=6, device="cuda")
    replayed: list[bool] = []
    run = GroupTrainer.run

    def spying_run(self, *args, **kwargs):
        run(self, *args, **kwargs)
        replayed.append(self.captured is not None and self.captured.replaying)

    monkeypatch.setattr(GroupTrainer, "run", spying_run)
    spied_group(spy, [cfg], [tmp_path / "g0"], datasets=data)
    assert replayed == [True] and spy.fallback == []
    monkeypatch.setenv("MECHEVAL_CUDA_GRAPH", "0")
    train(cfg, tmp_path / "s0", datasets=data)
    assert_same_run(tmp_path / "g0", tmp_path / "s0")


def test_lone_run_side_by_side_trains_alone(
    tmp_path: Path, data, spy: StackSpy, monkeypatch
) -> None:
    """A lone run in a thread taking turns with others on one card trains with the
    single-run trainer even where its step would replay (see _train_members)."""
    monkeypatch.setattr(group_module, "graphs_enabled", lambda device: True)
    monkeypatch.setattr(GroupTrainer, "replays", property(lambda self: True))
    baton = Baton()
    baton.take()
    try:
        spied_group(spy, [config(lr=3e-3)], [tmp_path / "g0"], datasets=data)
    finally:
        baton.give()
    assert spy.stacked == [] and spy.fallback == [tmp_path / "g0"]


@pytest.mark.parametrize("replays", [False, True], ids=["eager", "replayed"])
def test_a_lone_run_takes_the_single_run_trainer_unless_its_step_is_replayed(
    tmp_path: Path, monkeypatch, capsys, replays: bool
) -> None:
    """A sweep's lone run and `mecheval train`'s run go straight to train_run() where no CUDA
    graph replays their step (the stacking code is not entered); where one would, they go to
    train_runs() as a stack of one. Either way the run trains to the same end."""
    from small_runs import SWEEP_BASE, run_cli

    from mecheval.experiments import runners
    from mecheval.experiments.execution import jobs
    from mecheval.experiments.grid import SweepSpec

    entered: list[int] = []
    stack_runs = group_module.train_runs

    def spying(runs, **kwargs):
        entered.append(len(runs))
        return stack_runs(runs, **kwargs)

    monkeypatch.setattr(group_module, "train_runs", spying)
    monkeypatch.setattr(group_module, "replays_alone", lambda run: replays)
    spec = SweepSpec(name="lone", base=SWEEP_BASE, grid={"training.seed": [0]})
    (job,) = runners.make_jobs(spec, tmp_path, 1, None, False, None)
    assert jobs.execute_group([job])[0].state == "done"
    code, _, _ = run_cli(monkeypatch, capsys, "train", "--preset", "tiny", "--out", str(tmp_path))
    assert code == 0
    assert entered == ([1, 1] if replays else [])
    alone = train(job.run().cfg, tmp_path / "alone")  # the Python API's door
    assert read_status(Path(job.run_dir))["metrics"] == alone["metrics"]


def test_a_lone_run_asking_for_the_single_run_trainer_is_not_stacked(
    tmp_path: Path, monkeypatch
) -> None:
    """torch.compile and the fused kernels are the single-run trainer's: a lone run asking
    for them keeps it where its step would otherwise replay."""
    from mecheval.training.resolved import ResolvedRun

    monkeypatch.setattr(group_module, "graphs_enabled", lambda device: True)

    def lone(**training) -> ResolvedRun:
        return ResolvedRun.of(config(**training), tmp_path / "run")

    assert group_module.replays_alone(lone())
    assert not group_module.replays_alone(lone(compile=True))
    fused = lone()
    fused = ResolvedRun.of(
        fused.cfg.model_copy(
            update={"training": fused.cfg.training.model_copy(update={"kernels": "fused"})}
        ),
        tmp_path / "run",
    )
    assert not group_module.replays_alone(fused)
