import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels (models/ops/*_triton.py) run under Triton's interpreter on the CPU; the
    # flag must be set before triton is first imported, which is why it is set here.
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _deterministic_threads():
    # Two cores on CI: one thread per test process keeps timings stable and results exact.
    torch.set_num_threads(1)
    yield


@pytest.fixture(params=["native", "torch"])
def kernel_path(request, monkeypatch) -> str:
    """Which form of a training-step kernel runs: the C kernel (models/native.py) or its
    PyTorch form (with MECHEVAL_NATIVE=0; also what a vmapped stack of runs uses)."""
    from mecheval.models import native

    if request.param == "native":
        for name in native.KERNELS:
            if native.library(name, torch.float32) is None:
                pytest.skip(f"C kernel {name} unavailable: {native.unavailable(name)}")
    else:
        monkeypatch.setenv("MECHEVAL_NATIVE", "0")
    return request.param


@pytest.fixture
def native_calls(monkeypatch) -> list[str]:
    """The C functions called during the test, in order."""
    from mecheval.models import native

    calls: list[str] = []
    real = native.call

    def spy(function, *args):
        calls.append(function.__name__)
        return real(function, *args)

    monkeypatch.setattr(native, "call", spy)
    return calls
