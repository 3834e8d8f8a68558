"""GPU paths of training (training.precision, training.compile): bf16 autocast covers the
training forward only (float32 weights, optimizer and evaluation), tf32 is a CUDA-only scope
that leaks nothing, compile changes speed, not results, and the CUDA parity checks a GPU
machine runs (skipped here without one)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file
from small_runs import config

from mecheval.errors import ConfigError
from mecheval.models import ARCHITECTURES, ModelConfig, build_model
from mecheval.tasks import build_datasets
from mecheval.training import Trainer, evaluate, load_run, read_status, resolve, train
from mecheval.training.config import load_config
from mecheval.training.folder import check_same_config
from mecheval.training.precision import tf32
from mecheval.training.stacking.group import groupable, train_group

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def data():
    return build_datasets(resolve(config()).task)


def precision_flags() -> dict[str, Any]:
    """Every global float32-precision setting train() could touch, read through the per-backend
    API (which, unlike the legacy getters, never raises on a mix of old and new settings)."""
    b = torch.backends
    return {
        "cuda.matmul": b.cuda.matmul.fp32_precision,
        "cudnn": b.cudnn.fp32_precision,
        "cudnn.conv": b.cudnn.conv.fp32_precision,
        "cudnn.rnn": b.cudnn.rnn.fp32_precision,
        "mkldnn": b.mkldnn.fp32_precision,
        "mkldnn.matmul": b.mkldnn.matmul.fp32_precision,
        "generic": b.fp32_precision,
    }


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "model.safetensors")


def bf16_valued(tensor: torch.Tensor) -> bool:
    """Whether every number of ``tensor`` is exactly a bfloat16 value."""
    return torch.equal(tensor, tensor.to(torch.bfloat16).to(tensor.dtype))


def metric(run_dir: Path, split: str, name: str) -> pd.Series:
    frame = pd.read_csv(run_dir / "metrics.csv")
    rows = frame[(frame["split"] == split) & (frame["metric"] == name)]
    return rows.set_index("step")["value"]


# ---------------------------------------------------------------------------- config


def test_defaults_are_the_fp32_eager_recipe() -> None:
    t = resolve(config()).training
    assert (t.precision, t.compile) == ("fp32", False)


@pytest.mark.parametrize("value", ["fp16", "BF16", "float32", 16])
def test_unknown_precision_is_a_one_line_config_error(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        config(precision=value)
    message = str(info.value)
    assert message.startswith("training.precision:")
    assert "\n" not in message


def test_precision_is_part_of_a_runs_identity_compile_is_not(tmp_path: Path, data) -> None:
    train(config(steps=2, eval_every=2), tmp_path, datasets=data)
    check_same_config(tmp_path, resolve(config(steps=2, eval_every=2, compile=True)))
    with pytest.raises(ConfigError, match="different config"):
        check_same_config(tmp_path, resolve(config(steps=2, eval_every=2, precision="bf16")))
    # A stack holds one precision: it is not a per-run field.
    cfgs = [config(seed=0), config(seed=1, precision="bf16"), config(seed=2)]
    assert groupable(cfgs) == [[0, 2], [1]]
    mixed = [config(seed=0, precision="bf16"), config(seed=1, precision="bf16-model")]
    assert groupable(mixed) == [[0], [1]]


# ---------------------------------------------------------------------------- bf16


def record_forwards(model: torch.nn.Module) -> list[tuple[bool, bool, torch.dtype]]:
    """(grad enabled, CPU autocast on, output dtype) of every forward of ``model``."""
    calls: list[tuple[bool, bool, torch.dtype]] = []

    def hook(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
        calls.append((torch.is_grad_enabled(), torch.is_autocast_enabled("cpu"), output.dtype))

    model.register_forward_hook(hook)
    return calls


def test_bf16_autocasts_the_training_forward_only(tmp_path: Path, data) -> None:
    cfg = resolve(config(precision="bf16", steps=4, eval_every=2))
    trainer = Trainer(cfg, data, tmp_path)
    calls = record_forwards(trainer.model)
    results = trainer.run()
    training = [c for c in calls if c[0]]
    evaluation = [c for c in calls if not c[0]]
    assert len(training) == 4 and evaluation
    assert all(c[1:] == (True, torch.bfloat16) for c in training)
    # Evaluation ran in float32 outside autocast, and the master weights stayed float32.
    assert all(c[1:] == (False, torch.float32) for c in evaluation)
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert all(
        t.dtype == torch.float32 for s in trainer.optimizer.state.values() for t in s.values()
    )
    assert results["dev"] == evaluate(trainer.model, data["dev"], 16)


def test_bf16_loss_is_close_to_fp32_but_not_equal(tmp_path: Path, data) -> None:
    trainers = {
        p: Trainer(resolve(config(precision=p)), data, tmp_path / p) for p in ("fp32", "bf16")
    }
    batch = trainers["fp32"].batch_at(0)
    logits = {}
    for p, trainer in trainers.items():
        calls: list[torch.Tensor] = []
        trainer.model.register_forward_hook(lambda m, i, out, calls=calls: calls.append(out))
        loss = trainer.loss(batch)
        assert loss.dtype == torch.float32  # the loss functions cast the logits
        logits[p] = calls[0].detach().float()
    difference = (logits["bf16"] - logits["fp32"]).abs().max().item()
    # bf16 keeps 8 significant bits: ~1e-3 on these O(1) logits, never 0 (autocast is on).
    assert 0 < difference < 2e-2


def test_bf16_training_tracks_fp32(tmp_path: Path, data) -> None:
    for p in ("fp32", "bf16"):
        cfg = config(precision=p, steps=20, eval_every=10)
        status = train(cfg, tmp_path / p, datasets=data)
        assert status["state"] == "done"
    fp32, bf16 = (metric(tmp_path / p, "train", "running_loss") for p in ("fp32", "bf16"))
    assert not fp32.equals(bf16)
    # Observed: ~1e-4 apart over 20 steps; the loss itself moves ~0.1 in that time.
    torch.testing.assert_close(
        torch.tensor(bf16.values), torch.tensor(fp32.values), rtol=0, atol=5e-3
    )
    saved = weights(tmp_path / "bf16")
    assert all(w.dtype == torch.float32 for w in saved.values())
    # The logged metrics are a float32 evaluation: re-evaluating the saved model reproduces them.
    cfg, model = load_run(tmp_path / "bf16")
    final = read_status(tmp_path / "bf16")["metrics"]
    for split in ("dev", "test"):
        again = evaluate(model, data[split], 16)
        assert again == pytest.approx(final[split], rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_bf16_step_runs_for_every_architecture(tmp_path: Path, data, arch: str) -> None:
    losses = {}
    for p in ("fp32", "bf16"):
        trainer = Trainer(resolve(config(arch, precision=p)), data, tmp_path / p)
        losses[p] = trainer.train_step(trainer.batch_at(0))
        grads = [q.grad for q in trainer.model.parameters() if q.grad is not None]
        assert grads and all(g.dtype == torch.float32 for g in grads)
    assert losses["bf16"] == pytest.approx(losses["fp32"], abs=5e-3)


@pytest.mark.parametrize("precision", ["bf16", "bf16-model"])
def test_bf16_group_trains_as_a_stack_close_to_single_runs(
    tmp_path: Path, data, precision: str
) -> None:
    cfgs = [
        config("mamba", precision=precision, seed=0),
        config("mamba", precision=precision, seed=1, lr=1e-2),
    ]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        group = train_group(cfgs, [tmp_path / f"g{i}" for i in range(2)], datasets=data)
    # The probe accepted the stack at bf16 tolerance (no fallback to one run at a time).
    assert not [w for w in record if "cannot be vmapped" in str(w.message)]
    assert [s["state"] for s in group] == ["done", "done"]
    for i, cfg in enumerate(cfgs):
        train(cfg, tmp_path / f"s{i}", datasets=data)
        g, s = (metric(tmp_path / f"{kind}{i}", "train", "running_loss") for kind in "gs")
        # Batched and single bf16 kernels round differently: close, not float32-equal.
        torch.testing.assert_close(
            torch.tensor(g.values), torch.tensor(s.values), rtol=0, atol=5e-3
        )
        if precision == "bf16-model":  # the stack rounds what it stores as a single run does
            for kind in "gs":
                saved = weights(tmp_path / f"{kind}{i}").values()
                assert all(w.dtype == torch.float32 and bf16_valued(w) for w in saved)
    # And the stack did train in bf16: its fp32 twin's losses differ.
    fp32 = [config("mamba", seed=0), config("mamba", seed=1, lr=1e-2)]
    train_group(fp32, [tmp_path / f"f{i}" for i in range(2)], datasets=data)
    for i in range(2):
        g, f = (metric(tmp_path / f"{kind}{i}", "train", "running_loss") for kind in "gf")
        assert not g.equals(f)


# ---------------------------------------------------------------------------- bf16-model


def test_bf16_model_stores_bfloat16_values_of_weights_gradients_and_moments(
    tmp_path: Path, data
) -> None:
    fp32 = Trainer(resolve(config("mamba")), data, tmp_path / "fp32")
    trainer = Trainer(resolve(config("mamba", precision="bf16-model")), data, tmp_path / "m")
    # The float32 init is not bfloat16-valued, so these checks can fail; the cast one is, and
    # it is the float32 init rounded (a model cast to bfloat16 after its init).
    assert not all(bf16_valued(p) for p in fp32.model.parameters())
    for p, q in zip(trainer.model.parameters(), fp32.model.parameters(), strict=True):
        assert p.dtype == torch.float32
        torch.testing.assert_close(p, q.to(torch.bfloat16).float(), rtol=0, atol=0)
    assert all(bf16_valued(b) for b in trainer.model.buffers() if b.is_floating_point())
    calls = record_forwards(trainer.model)
    for step in range(2):
        trainer.train_step(trainer.batch_at(step))
        trainer.step += 1
    assert [c[1:] for c in calls] == [(True, torch.bfloat16)] * 2  # under bf16 autocast
    grads = [p.grad for p in trainer.model.parameters()]
    moments = [t for s in trainer.optimizer.state.values() for k, t in s.items() if k != "step"]
    assert len(moments) == 2 * len(grads)
    for tensor in [*trainer.model.parameters(), *grads, *moments]:
        assert tensor.dtype == torch.float32 and bf16_valued(tensor)


def test_bf16_model_loses_an_update_below_half_a_bfloat16_step(tmp_path: Path, data) -> None:
    # AdamW moves each weight by about the LR: 1e-7 is below half a bfloat16 step of every
    # weight with |w| > 1e-4, so a bfloat16 model does not move those; float32 weights do.
    # (A weight at 0, a bias, moves in both: bfloat16 holds 1e-7 itself.)
    moved = {}
    for p in ("bf16", "bf16-model"):
        cfg = resolve(config(precision=p, lr=1e-7, warmup_fraction=0.0))
        trainer = Trainer(cfg, data, tmp_path / p)
        large = [q for q in trainer.model.parameters() if q.abs().min() > 1e-4]
        before = [q.detach().clone() for q in large]
        trainer.train_step(trainer.batch_at(0))
        moved[p] = [not torch.equal(a, b) for a, b in zip(large, before, strict=True)]
    assert moved["bf16"] and all(moved["bf16"])
    assert len(moved["bf16-model"]) == len(moved["bf16"]) and not any(moved["bf16-model"])


# ---------------------------------------------------------------------------- tf32


def test_tf32_on_cpu_is_a_no_op_and_leaks_nothing(tmp_path: Path, data) -> None:
    before = precision_flags()
    threads = torch.get_num_threads()
    for p in ("fp32", "tf32"):
        train(config(precision=p), tmp_path / p, datasets=data)
        assert precision_flags() == before
    assert torch.get_num_threads() == threads
    a, b = weights(tmp_path / "fp32"), weights(tmp_path / "tf32")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_tf32_scope_sets_and_restores_the_cuda_flags() -> None:
    # The flags are process-global and settable on a CPU-only build, so the scope's own
    # bookkeeping is testable without a GPU.
    cuda = torch.device("cuda")
    before = precision_flags()
    with tf32("tf32", cuda):
        inside = precision_flags()
    assert precision_flags() == before
    assert inside["cuda.matmul"] == inside["cudnn.conv"] == "tf32"
    # Only those two change: the CPU's oneDNN matmuls stay float32.
    changed = {k for k in before if inside[k] != before[k]}
    assert changed <= {"cuda.matmul", "cudnn.conv"}
    with pytest.raises(RuntimeError, match="boom"), tf32("tf32", cuda):
        raise RuntimeError("boom")
    assert precision_flags() == before
    for precision, device in (("fp32", cuda), ("bf16", cuda), ("tf32", torch.device("cpu"))):
        with tf32(precision, device):  # type: ignore[arg-type]
            assert precision_flags() == before


# ---------------------------------------------------------------------------- compile


def _same_runs(a: Path, b: Path, rtol: float = 1.3e-6, atol: float = 1e-5) -> None:
    fa, fb = pd.read_csv(a / "metrics.csv"), pd.read_csv(b / "metrics.csv")
    assert fa[["step", "split", "metric"]].equals(fb[["step", "split", "metric"]])
    torch.testing.assert_close(
        torch.tensor(fa["value"].values), torch.tensor(fb["value"].values), rtol=rtol, atol=atol
    )
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()  # the saved state dict is the plain module's
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=rtol, atol=atol, msg=key)


def test_compile_wires_the_training_forward_only(tmp_path: Path, data, monkeypatch) -> None:
    """The wiring, with torch.compile's tracing but no code generation (fast, no compiler):
    training goes through the compiled wrapper, evaluation and callbacks get the plain module,
    and the run equals an eager one."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    seen: list[torch.nn.Module] = []
    cfg = resolve(config(compile=True, steps=4, eval_every=2))
    trainer = Trainer(cfg, data, tmp_path / "t", callbacks=[lambda s, m, d: seen.append(m)])
    assert isinstance(trainer.train_model, torch._dynamo.eval_frame.OptimizedModule)
    assert trainer.train_model._orig_mod is trainer.model
    trainer.run()
    assert seen and all(m is trainer.model for m in seen)
    torch._dynamo.reset()
    train(config(compile=True, steps=4, eval_every=2), tmp_path / "c", datasets=data)
    train(config(steps=4, eval_every=2), tmp_path / "e", datasets=data)
    _same_runs(tmp_path / "c", tmp_path / "e")


def _cxx() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++"))


#: The README's torch.compile command as tests/test_doc_commands.py substitutes it (the tiny
#: preset, one architecture): run here, where its run is held to the eager one.
PAGE_COMPILE_COMMAND = "mecheval reproduce ar --preset tiny --compile --archs attention"


@pytest.mark.skipif(
    _cxx() is None,
    reason="torch.compile's CPU backend (inductor) needs a C++ compiler: no g++ or $CXX",
)
def test_the_pages_compiled_reproduce_equals_the_eager_one(tmp_path: Path, tiny_experiments):
    """The real thing (inductor, C++ kernels), as the README shows it: the compiled run of
    ``reproduce ar --compile`` equals the tiny catalog's eager run of the same config
    (tests/conftest.py) to float32 tolerance, and its report reads the same label."""
    from cli_processes import run_command

    result = run_command(PAGE_COMPILE_COMMAND, tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    compiled = tmp_path / "runs" / "ar-tiny" / "attention"
    eager = tiny_experiments["ar"].folder / "attention"
    assert read_status(compiled)["state"] == "done"
    assert load_config(compiled / "config.yaml").training.compile
    assert not load_config(eager / "config.yaml").training.compile
    check_same_config(compiled, load_config(eager / "config.yaml"))  # compile aside
    # Inductor fuses and reorders float32 arithmetic: equal to rounding, not bitwise.
    _same_runs(compiled, eager, rtol=1e-4, atol=1e-5)
    labels = [
        json.loads((run / "mechanism.json").read_text())["label"] for run in (compiled, eager)
    ]
    assert labels[0] == labels[1]


# ---------------------------------------------------------------------------- CUDA


@pytest.fixture
def strict_fp32():
    """Full float32 CUDA products (cuDNN convolutions default to TF32), restored after."""
    b = torch.backends
    saved = (b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision)
    b.cuda.matmul.fp32_precision = "ieee"
    b.cudnn.conv.fp32_precision = "ieee"
    try:
        yield
    finally:
        b.cuda.matmul.fp32_precision, b.cudnn.conv.fp32_precision = saved


@needs_cuda
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_cuda_forward_and_gradients_match_cpu(arch: str, strict_fp32) -> None:
    """Every architecture computes on CUDA what it computes on the CPU (its reference), to
    float32 tolerance: the forward logits and the answer-loss gradients. H3 and Hyena take
    the FFT long convolution on CUDA and the Toeplitz one on the CPU."""
    torch.manual_seed(0)
    cfg = ModelConfig(architecture=arch, d_model=32, vocab_size=19, max_len=12)
    cpu = build_model(cfg)
    gpu = build_model(cfg)
    gpu.load_state_dict(cpu.state_dict())
    gpu = gpu.cuda()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(3, 19, (8, 12), generator=g)
    answer = torch.randint(3, 19, (8,), generator=g)
    at = torch.full((8,), 11)
    out = {}
    for name, model, device in (("cpu", cpu, "cpu"), ("cuda", gpu, "cuda")):
        logits = model(tokens.to(device), at=at.to(device))
        loss = torch.nn.functional.cross_entropy(logits.float(), answer.to(device))
        loss.backward()
        grads = {n: p.grad.cpu() for n, p in model.named_parameters()}
        out[name] = (logits.detach().cpu(), grads)
    torch.testing.assert_close(out["cuda"][0], out["cpu"][0], rtol=1e-4, atol=1e-5)
    for n, grad in out["cpu"][1].items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(
            out["cuda"][1][n], grad, rtol=1e-3, atol=1e-6 + 1e-4 * scale, msg=n
        )


@needs_cuda
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_cuda_precisions_train_close_to_fp32(tmp_path: Path, data, arch: str) -> None:
    """fp32, tf32 and bf16 training on CUDA: each a few steps of the same run, losses within
    reduced-precision tolerance of fp32, float32 evaluation, and no flag left behind."""
    before = precision_flags()
    runs = {}
    for p in ("fp32", "tf32", "bf16"):
        cfg = config(arch, precision=p, device="cuda", steps=8, eval_every=4)
        status = train(cfg, tmp_path / p, datasets=data)
        assert status["state"] == "done", status.get("reason")
        assert precision_flags() == before
        runs[p] = metric(tmp_path / p, "train", "running_loss")
    for p in ("tf32", "bf16"):
        torch.testing.assert_close(
            torch.tensor(runs[p].values), torch.tensor(runs["fp32"].values), rtol=0, atol=3e-2
        )
    # Evaluation is float32: the saved bf16 model re-evaluates, on the CPU, to its metrics.
    _, model = load_run(tmp_path / "bf16")
    final = read_status(tmp_path / "bf16")["metrics"]["dev"]
    again = evaluate(model, data["dev"], 16)
    assert again["loss"] == pytest.approx(final["loss"], rel=1e-4, abs=1e-5)


@needs_cuda
def test_cuda_tf32_scope_is_live_during_training_only(tmp_path: Path, data) -> None:
    """The TF32 scope is entered around each training step on CUDA, and only there."""
    cfg = resolve(config(precision="tf32", device="cuda", steps=2, eval_every=2))
    seen: list[tuple[bool, str]] = []
    trainer = Trainer(cfg, data, tmp_path)
    trainer.model.register_forward_hook(
        lambda m, i, o: seen.append(
            (torch.is_grad_enabled(), torch.backends.cuda.matmul.fp32_precision)
        )
    )
    before = torch.backends.cuda.matmul.fp32_precision
    trainer.run()
    assert {p for grad, p in seen if grad} == {"tf32"}
    assert {p for grad, p in seen if not grad} == {before}


@pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("triton") is None,
    reason="needs CUDA, and triton for torch.compile's GPU kernels",
)
def test_cuda_compiled_run_equals_eager_run(tmp_path: Path, data, strict_fp32) -> None:
    torch._dynamo.reset()
    for name, flag in (("c", True), ("e", False)):
        cfg = config(compile=flag, device="cuda", steps=4, eval_every=2)
        train(cfg, tmp_path / name, datasets=data)
    _same_runs(tmp_path / "c", tmp_path / "e", rtol=1e-4, atol=1e-5)
