"""The C kernels (models/native.py, models/csrc): built once and cached, absent without harm,
and numerically the function their PyTorch forms compute, at the edges of float32 too."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mecheval.models import ModelConfig, build_model, native
from mecheval.models.ops.selective_scan import selective_scan, selective_scan_reference


@pytest.fixture
def fresh_native(tmp_path: Path, monkeypatch):
    """A process-fresh loader with its own cache folder."""
    monkeypatch.setenv("MECHEVAL_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setattr(native, "_reasons", {})
    return tmp_path / "native"


def needs_compiler() -> None:
    if native.library("selective_scan", torch.float32) is None:
        pytest.skip(f"C kernel unavailable: {native.unavailable('selective_scan')}")


def test_builds_once_into_the_cache_and_reuses_it(fresh_native: Path, monkeypatch) -> None:
    needs_compiler()
    builds = list(fresh_native.glob("selective_scan-f32-*.so"))
    assert len(builds) == 1 and not list(fresh_native.glob("tmp*"))
    stamp = builds[0].stat().st_mtime_ns
    monkeypatch.setattr(native, "_loaded", {})  # as a new process would
    assert native.library("selective_scan", torch.float32) is not None
    assert builds[0].stat().st_mtime_ns == stamp
    assert list(fresh_native.glob("selective_scan-f32-*.so")) == builds


def test_a_changed_header_is_a_new_build(fresh_native: Path, tmp_path: Path, monkeypatch) -> None:
    """The cache key covers the headers the sources include, not the source file alone."""
    needs_compiler()
    sources = tmp_path / "csrc"
    shutil.copytree(native.SOURCES, sources)
    monkeypatch.setattr(native, "SOURCES", sources)
    monkeypatch.setattr(native, "_loaded", {})
    assert native.library("long_conv", torch.float32) is not None
    header = sources / "real.h"
    header.write_text(header.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(native, "_loaded", {})
    assert native.library("long_conv", torch.float32) is not None
    assert len(list(fresh_native.glob("long_conv-f32-*.so"))) == 2


@pytest.mark.parametrize("compiler", ["/nonexistent/cc", "false"])
def test_without_a_working_compiler_the_torch_form_runs(
    fresh_native: Path, monkeypatch, capsys, compiler: str
) -> None:
    monkeypatch.setenv("CC", compiler)
    assert native.library("selective_scan", torch.float32) is None
    reason = native.unavailable("selective_scan")
    assert "not found" in reason if compiler.startswith("/") else "failed on" in reason
    said = capsys.readouterr().err.splitlines()
    assert said == [
        f"mecheval: C kernels unavailable ({reason}); their PyTorch forms run instead "
        "(same functions, slower on a CPU)"
    ]
    assert native.library("selective_scan", torch.float64) is None
    assert native.library("long_conv", torch.float32) is None
    if compiler.startswith("/"):  # the same cause is said once per process, not per kernel
        assert capsys.readouterr().err == ""
    assert not list(fresh_native.glob("*.so")) and not list(fresh_native.glob("tmp*"))
    # Mamba still trains, through the PyTorch adjoint.
    torch.manual_seed(0)
    model = build_model(ModelConfig(architecture="mamba", d_model=16, vocab_size=12, max_len=9))
    tokens = torch.randint(0, 12, (3, 9))
    loss = F.cross_entropy(model(tokens, at=torch.full((3,), 8)), torch.tensor([1, 2, 3]))
    loss.backward()
    assert all(p.grad is not None for p in model.layers[0].mixer.parameters())


def test_switched_off_by_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("MECHEVAL_NATIVE", "0")
    assert native.library("selective_scan", torch.float32) is None
    assert native.unavailable("selective_scan") == "MECHEVAL_NATIVE=0"


def _inputs(dtype, log_delta_scale: float, seed: int = 11):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 35, 40, generator=g, dtype=dtype)
    delta = torch.exp(log_delta_scale * torch.randn(3, 35, 40, generator=g, dtype=dtype))
    A = -torch.exp(2 * torch.randn(40, 16, generator=g, dtype=dtype))
    B, C = torch.randn(2, 3, 35, 16, generator=g, dtype=dtype)
    return [t.requires_grad_() for t in (x, delta, A, B, C)]


@pytest.mark.parametrize("log_delta_scale", [0.5, 3.0])
def test_float32_kernel_against_float64_reference(log_delta_scale: float) -> None:
    """The float32 build (its own exp) against the float64 reference, with decays from ~1 down
    to far below float32's smallest normal (delta * A reaches -1e5 at scale 3)."""
    needs_compiler()
    D = torch.zeros(40, dtype=torch.float64)
    inputs = _inputs(torch.float32, log_delta_scale)
    reference_inputs = [t.detach().double().requires_grad_() for t in inputs]
    got = selective_scan(*inputs, D.float())
    ref = selective_scan_reference(*reference_inputs, D)
    assert torch.isfinite(got).all()
    scale = ref.detach().abs().max()
    torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-5 * float(scale))
    w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    g_got = torch.autograd.grad((got * w.float()).sum(), inputs)
    g_ref = torch.autograd.grad((ref * w).sum(), reference_inputs)
    for a, b in zip(g_got, g_ref, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-3, atol=1e-4 * float(b.abs().max()))


def test_the_vectorised_build_equals_the_scalar_one_bit_for_bit(
    fresh_native: Path, monkeypatch
) -> None:
    """-fno-trapping-math lets gcc vectorise the scan's loops; every output and gradient is
    the build without it (loops kept scalar) bit for bit, decays below float32's normals and
    a NaN included."""
    needs_compiler()
    x, delta, A, B, C = _inputs(torch.float32, 3.0)
    with torch.no_grad():
        delta[1, 4, 20] = float("nan")
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(6))

    def scan() -> list[torch.Tensor]:
        monkeypatch.setattr(native, "_loaded", {})
        y = selective_scan(x, delta, A, B, C, torch.zeros(40))
        return [y.detach(), *torch.autograd.grad((y * w).sum(), (x, delta, A, B, C))]

    vectorised = scan()
    monkeypatch.setattr(
        native, "FLAGS", tuple(f for f in native.FLAGS if f != "-fno-trapping-math")
    )
    scalar = scan()
    assert len(list(fresh_native.glob("selective_scan-f32-*.so"))) == 2  # two builds ran
    for a, b in zip(vectorised, scalar, strict=True):
        assert torch.equal(a.isnan(), b.isnan())
        assert torch.equal(a.nan_to_num(), b.nan_to_num())


def test_nan_reaches_the_output_and_the_gradients() -> None:
    """A diverging run must show up as NaN (training records it as failed), not be clamped
    away by the kernel's exp: a NaN decay rate (A) reaches its channel's outputs only through
    exp, a NaN delta from its position on."""
    needs_compiler()
    x, delta, A, B, C = _inputs(torch.float32, 0.5)
    with torch.no_grad():
        A[7, 3] = float("nan")
        delta[1, 4, 20] = float("nan")
    y = selective_scan(x, delta, A, B, C, torch.zeros(40))
    assert torch.isnan(y[:, :, 7]).all()
    assert torch.isnan(y[1, 4:, 20]).all() and not torch.isnan(y[1, :4, 20]).any()
    assert not torch.isnan(y[0, :, 8:]).any()
    y.sum().backward()
    assert torch.isnan(A.grad[7]).any() and torch.isnan(delta.grad[1, :5, 20]).any()
