"""C kernels for the CPU, compiled on first use (``models/csrc``).

Where a mixer's training step on a CPU is bound by many small PyTorch calls in a loop over
time (Mamba's selective scan: a few operations per step and per layer, forward and
backward), one C function that walks the loop does the same arithmetic without the calls.
The source ships with the package; the first process that needs a kernel compiles it with
the machine's C compiler (``$CC``, else ``cc``; ~0.2 s) for this CPU (``-march=native``)
into a cache folder (``$MECHEVAL_CACHE``, else ``$XDG_CACHE_HOME/mecheval``, else
``~/.cache/mecheval``), named by a hash of the source and the folder's headers, the flags,
the compiler and the CPU, and written atomically (temp file, then rename), so parallel
workers share one build.

Nothing depends on it: without a compiler, when the build fails, or with
``MECHEVAL_NATIVE=0`` in the environment, :func:`library` returns None (the reason is in
:func:`unavailable`; one line on stderr says it once per process) and the callers run their
PyTorch code, which computes the same function (tests/test_native.py holds each kernel to
its PyTorch reference in float64). Results of the two paths differ by float rounding only,
which a training run amplifies, so a run's digits depend on whether a compiler was found,
as they already depend on the CPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

SOURCES = Path(__file__).parent / "csrc"

#: Flags of every build; the float64 build adds ``-DREAL_DOUBLE`` (the sources' ``real`` type).
#: ``-fno-trapping-math``: without it gcc keeps the selective scan's loops scalar (a float
#: comparison in exp_r might trap, so it is not if-converted); no trap is ever enabled, and
#: every result is bit for bit the scalar loops' (tests/test_native.py), about 3.5x faster.
FLAGS = (
    "-O3",
    "-march=native",
    "-fopenmp-simd",
    "-fno-trapping-math",
    "-fPIC",
    "-shared",
    "-std=c11",
)

#: The kernels in csrc/, one source file each.
KERNELS = ("selective_scan", "vandermonde", "long_conv", "shift_kernel", "gla")

#: dtype -> the build's suffix and extra flag.
_BUILDS = {torch.float32: ("f32", ()), torch.float64: ("f64", ("-DREAL_DOUBLE",))}

_loaded: dict[tuple[str, torch.dtype], ctypes.CDLL | None] = {}
_reasons: dict[str, str] = {}


def enabled() -> bool:
    return os.environ.get("MECHEVAL_NATIVE", "1") != "0"


def library(name: str, dtype: torch.dtype) -> ctypes.CDLL | None:
    """The compiled ``csrc/{name}.c`` for ``dtype`` (float32 or float64), or None where it
    cannot be had (then :func:`unavailable` says why)."""
    if not enabled():
        return None
    if dtype not in _BUILDS:
        return None
    key = (name, dtype)
    if key not in _loaded:
        _loaded[key] = _build(name, dtype)
    return _loaded[key]


def for_training(name: str, *tensors: torch.Tensor) -> ctypes.CDLL | None:
    """The kernel library ``name`` where a training step may use it on ``tensors``: CPU
    tensors of one float dtype of which one needs a gradient, outside torch.func transforms
    (a vmapped stack of runs keeps the PyTorch form, which has a batching rule) and
    torch.compile. Evaluation and interventions (no gradient) always run the PyTorch form,
    so their numbers do not depend on whether a compiler was found."""
    first = tensors[0]
    usable = (
        first.device.type == "cpu"
        and all(t.device == first.device and t.dtype == first.dtype for t in tensors)
        and any(t.requires_grad for t in tensors)
        and torch.is_grad_enabled()
        and not any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors)
        and not torch.compiler.is_compiling()
    )
    return library(name, first.dtype) if usable else None


def unavailable(name: str) -> str | None:
    """Why :func:`library` returns None for ``name``, if it does."""
    return "MECHEVAL_NATIVE=0" if not enabled() else _reasons.get(name)


def cache_dir() -> Path:
    if os.environ.get("MECHEVAL_CACHE"):
        return Path(os.environ["MECHEVAL_CACHE"]) / "native"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mecheval" / "native"


def _build(name: str, dtype: torch.dtype) -> ctypes.CDLL | None:
    suffix, extra = _BUILDS[dtype]
    source = SOURCES / f"{name}.c"
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return _fail(name, f"no C compiler: {os.environ.get('CC', 'cc')} not found")
    flags = [*FLAGS, *extra]
    digest = hashlib.sha256()
    headers = [h.read_bytes() for h in sorted(SOURCES.glob("*.h"))]  # included by the sources
    for part in (source.read_bytes(), *headers, " ".join(flags).encode(), compiler.encode()):
        digest.update(part)
    digest.update(_cpu().encode())
    target = cache_dir() / f"{name}-{suffix}-{digest.hexdigest()[:16]}.so"
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
            os.close(fd)
            try:
                subprocess.run(
                    [compiler, *flags, "-o", tmp, str(source), "-lm"],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return ctypes.CDLL(str(target))
    except subprocess.CalledProcessError as err:
        first = (err.stderr or "").strip().splitlines()[:1]
        return _fail(name, f"{compiler} failed on {source.name}: {' '.join(first)}")
    except OSError as err:
        return _fail(name, f"cannot build or load {target}: {err}")


def _fail(name: str, reason: str) -> None:
    if reason not in _reasons.values():  # one line per process and cause, not per kernel
        print(
            f"mecheval: C kernels unavailable ({reason}); their PyTorch forms run instead "
            "(same functions, slower on a CPU)",
            file=sys.stderr,
        )
    _reasons[name] = reason
    return None


def _cpu() -> str:
    """What -march=native depends on: the CPU's feature flags where Linux lists them."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def autograd_function(
    name: str,
    sizes: Callable[..., tuple[int, ...]],
    output: Callable[..., torch.Tensor],
) -> type[torch.autograd.Function]:
    """An autograd Function over ``csrc/{name}.c``, whose ``{name}_forward`` takes (sizes...,
    inputs..., output) and ``{name}_backward`` (sizes..., inputs..., output gradient, input
    gradients...). ``sizes(*inputs)`` gives the integers, ``output(*inputs)`` allocates the
    output; integer inputs (a length) pass through ``sizes`` only and get no gradient. Apply
    it to contiguous tensors, where :func:`for_training` allowed."""

    def forward(ctx, *inputs):  # type: ignore[no-untyped-def]
        tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
        lib = library(name, tensors[0].dtype)
        result = output(*inputs)
        dims = sizes(*inputs)
        call(getattr(lib, f"{name}_forward"), *dims, *tensors, result)
        ctx.save_for_backward(*tensors)
        ctx.dims = dims
        ctx.is_tensor = [isinstance(x, torch.Tensor) for x in inputs]
        return result

    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        tensors = ctx.saved_tensors
        lib = library(name, grad.dtype)
        grads = [torch.empty_like(t) for t in tensors]
        call(getattr(lib, f"{name}_backward"), *ctx.dims, *tensors, grad.contiguous(), *grads)
        per_input = iter(grads)
        return tuple(next(per_input) if flag else None for flag in ctx.is_tensor)

    # Built with type() so that profiles name the nodes Native_<name> / Native_<name>Backward.
    methods = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    return type(f"Native_{name}", (torch.autograd.Function,), methods)


def call(function: ctypes._CFuncPtr, *args: int | torch.Tensor) -> None:
    """Call a kernel: integers go as int64, tensors (contiguous, on the CPU) as pointers to
    their data. Every kernel returns 0, or non-zero when it could not allocate its buffers."""
    converted = [
        ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else ctypes.c_int64(a)
        for a in args
    ]
    if function(*converted):
        raise MemoryError(f"{function.__name__}: out of memory for its buffers")
