"""Optional fused CUDA kernels (models/kernels.py): the layout adapters checked on a CPU
against stand-ins written in the kernels' own channels-first layout, the fall-backs, the
config checks, and (where CUDA and the packages are present) parity with the reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import vmap

from mecheval.errors import ConfigError
from mecheval.models import ModelConfig, build_model, kernels
from mecheval.models.mixers.modules import ShortConv
from mecheval.models.ops.selective_scan import selective_scan, selective_scan_reference
from mecheval.training.config import config_from_data


def scan_channels_first(u, delta, A, B, C, D):
    """mamba-ssm's documented contract, as a loop: u, delta [b, d, L]; A [d, n]; B, C
    [b, n, L]; D [d] -> [b, d, L] (written here independently of the module's code)."""
    b, d, length = u.shape
    h = u.new_zeros(b, d, A.shape[1])
    out = []
    for t in range(length):
        dt = delta[:, :, t, None]
        h = torch.exp(dt * A) * h + dt * B[:, None, :, t] * u[:, :, t, None]
        out.append((h * C[:, None, :, t]).sum(-1) + D * u[:, :, t])
    return torch.stack(out, dim=-1)


def conv_channels_first(x, weight, bias=None, activation=None):
    """causal-conv1d's documented contract: x [b, d, L], weight [d, width] -> [b, d, L]."""
    assert activation is None
    width = weight.shape[1]
    return F.conv1d(x, weight[:, None], bias, padding=width - 1, groups=x.shape[1])[
        ..., : x.shape[-1]
    ]


@pytest.fixture
def stand_ins(monkeypatch):
    """Pretend CPU tensors are on a device with the kernels, which count their calls."""
    calls = {"scan": 0, "conv": 0}

    def scan(*args):
        calls["scan"] += 1
        return scan_channels_first(*args)

    def conv(*args, **kwargs):
        calls["conv"] += 1
        return conv_channels_first(*args, **kwargs)

    monkeypatch.setattr(kernels, "_on_device", lambda x: True)
    monkeypatch.setattr(kernels, "_selective_scan_impl", scan)
    monkeypatch.setattr(kernels, "_causal_conv1d_impl", conv)
    return calls


def scan_inputs(batch=3, length=7, d=6, n=4, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, length, d, generator=g, dtype=dtype)
    delta = F.softplus(torch.randn(batch, length, d, generator=g, dtype=dtype))
    A = -torch.rand(d, n, generator=g, dtype=dtype)
    B = torch.randn(batch, length, n, generator=g, dtype=dtype)
    C = torch.randn(batch, length, n, generator=g, dtype=dtype)
    D = torch.randn(d, generator=g, dtype=dtype)
    return x, delta, A, B, C, D


def test_scan_adapter_matches_the_reference(stand_ins) -> None:
    args = scan_inputs()
    with kernels.fused_kernels():
        fused = selective_scan(*args)
    assert stand_ins["scan"] == 1
    torch.testing.assert_close(fused, selective_scan_reference(*args))
    # Outside the context the module's own code runs.
    selective_scan(*args)
    assert stand_ins["scan"] == 1


def test_conv_adapter_matches_shortconv(stand_ins) -> None:
    torch.manual_seed(0)
    conv = ShortConv(5, 4).double()
    x = torch.randn(2, 9, 5, dtype=torch.float64)
    with kernels.fused_kernels():
        fused = conv(x)
    assert stand_ins["conv"] == 1
    torch.testing.assert_close(fused, conv(x))
    assert stand_ins["conv"] == 1
    # A width the kernel lacks falls back.
    wide = ShortConv(5, 6).double()
    with kernels.fused_kernels():
        wide(x)
    assert stand_ins["conv"] == 1


def test_mamba_model_through_the_stand_ins_equals_the_reference(stand_ins) -> None:
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(architecture="mamba", d_model=16, n_layers=2, vocab_size=20, max_len=12)
    ).double()
    tokens = torch.randint(0, 20, (3, 10))
    with kernels.fused_kernels():
        fused = model(tokens)
    assert stand_ins["scan"] == 2 and stand_ins["conv"] == 2  # one of each per layer
    torch.testing.assert_close(fused, model(tokens))


def test_no_fused_kernel_under_vmap(stand_ins) -> None:
    args = scan_inputs()
    stacked = [torch.stack([a, a]) for a in args]
    with kernels.fused_kernels():
        out = vmap(selective_scan)(*stacked)
    assert stand_ins["scan"] == 0
    torch.testing.assert_close(out[1], selective_scan_reference(*args))


def test_fused_kernels_on_a_cpu_is_a_one_line_config_error(tmp_path) -> None:
    from mecheval.tasks import build_datasets
    from mecheval.training import Trainer, resolve

    data = {
        "task": {"kind": "ar", "n_keys": 8, "n_values": 8, "n_pairs": 2, "n_train": 32},
        "model": {"architecture": "mamba", "d_model": 8},
        "training": {"steps": 2, "batch_size": 8, "kernels": "fused"},
    }
    cfg = resolve(config_from_data(data))
    with pytest.raises(ConfigError, match="training.kernels") as err:
        Trainer(cfg, build_datasets(cfg.task), tmp_path)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="training.kernels"):
        config_from_data({**data, "training": {"kernels": "triton"}})


needs_scan = pytest.mark.skipif(
    not torch.cuda.is_available() or not kernels.available()["selective_scan"],
    reason="needs CUDA and mamba-ssm",
)
needs_conv = pytest.mark.skipif(
    not torch.cuda.is_available() or not kernels.available()["causal_conv1d"],
    reason="needs CUDA and causal-conv1d",
)


@needs_scan
def test_cuda_selective_scan_kernel_matches_the_reference() -> None:
    args = [a.float().cuda().requires_grad_() for a in scan_inputs(batch=4, length=35, d=32)]
    with kernels.fused_kernels():
        fused = selective_scan(*args)
    reference = selective_scan(*args)
    torch.testing.assert_close(fused, reference, rtol=1e-4, atol=1e-5)
    weights = torch.randn_like(reference)
    grads_fused = torch.autograd.grad((fused * weights).sum(), args)
    grads_reference = torch.autograd.grad((reference * weights).sum(), args)
    for name, a, b in zip(
        ["x", "delta", "A", "B", "C", "D"], grads_fused, grads_reference, strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, msg=name)


@needs_conv
def test_cuda_causal_conv1d_kernel_matches_shortconv() -> None:
    conv = ShortConv(32, 4).cuda()
    x = torch.randn(4, 35, 32, device="cuda", requires_grad=True)
    with kernels.fused_kernels():
        fused = conv(x)
    reference = conv(x)
    torch.testing.assert_close(fused, reference, rtol=1e-4, atol=1e-5)
    grads_fused = torch.autograd.grad(fused.square().sum(), [x, conv.weight, conv.bias])
    grads_reference = torch.autograd.grad(reference.square().sum(), [x, conv.weight, conv.bias])
    for a, b in zip(grads_fused, grads_reference, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@needs_scan
def test_cuda_fused_training_tracks_the_reference(tmp_path) -> None:
    from mecheval.training import read_status, train

    def run(name: str, kernel: str) -> dict:
        data = {
            "task": {"kind": "ar", "n_keys": 8, "n_values": 8, "n_pairs": 2, "n_train": 320},
            "model": {"architecture": "mamba", "d_model": 16},
            "training": {
                "steps": 8,
                "batch_size": 16,
                "eval_every": 4,
                "device": "cuda",
                "kernels": kernel,
            },
        }
        train(config_from_data(data), tmp_path / name)
        return read_status(tmp_path / name)["metrics"]["dev"]

    fused, reference = run("f", "fused"), run("r", "reference")
    assert fused["loss"] == pytest.approx(reference["loss"], rel=1e-3)
