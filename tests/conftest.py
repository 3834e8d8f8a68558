import json
import os
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels (models/ops/*_triton.py) run under Triton's interpreter on the CPU; the
    # flag must be set before triton is first imported, which is why it is set here.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config) -> None:
    """Under pytest-xdist, each worker process runs on a share of the cores of its own (the
    commands it starts too: a sweep's threads follow the cores its process may use), so
    that a test's subprocess never competes for a core with another worker's test."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker and count > 1 and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) >= count:
            os.sched_setaffinity(0, cores[int(worker.removeprefix("gw")) :: count])


#: Test modules handed out first: their tests are the longest (the tiny catalog, the pages'
#: commands), so that under pytest-xdist the workers end on short tests, not one on a long
#: one while the other waits.
LONGEST_FIRST = ("test_doc_commands.py", "test_reproduce_all.py")


#: Fixtures that make a test end-to-end (marked ``slow``): every registered experiment
#: trained at the tiny preset, and a local Ray cluster.
SLOW_FIXTURES = {"tiny_experiments", "local_ray"}


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if SLOW_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # stable: order kept


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


@dataclass(frozen=True)
class Reproduced:
    """What ``mecheval reproduce NAME --preset tiny -q`` did: its exit code and
    output, and the folder it wrote (``runs/NAME-tiny``)."""

    exit_code: int
    output: str
    folder: Path


@dataclass(frozen=True)
class TinyExperiments:
    """Every registered experiment at the tiny preset, each run the first time it is asked
    for: ``experiments[name]``, or all of them with :meth:`runs`."""

    root: Path

    def __getitem__(self, name: str) -> Reproduced:
        with self._lock(name):  # one process runs it, others wait
            self._run_once(name)
        done = json.loads(self._record(name).read_text())
        return Reproduced(done["exit_code"], done["output"], self.root / "runs" / f"{name}-tiny")

    def runs(self) -> Path:
        """The --out folder, every experiment finished in it (and the data cache)."""
        from filelock import Timeout

        from mecheval.experiments.catalog import list_experiments

        # Under pytest-xdist, workers that all want every experiment share them out: each
        # runs the next one no other worker is running, then waits for those others ran.
        # The largest grids first, so that no worker ends waiting on a long one.
        others = []
        for experiment in sorted(list_experiments(), key=lambda e: -_grid_size(e)):
            lock = self._lock(experiment.name)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                others.append(experiment.name)
                continue
            try:
                self._run_once(experiment.name)
            finally:
                lock.release()
        for name in others:
            self[name]
        return self.root / "runs"

    def _lock(self, name: str):
        from filelock import FileLock

        return FileLock(str(self.root / f"{name}.lock"))

    def _record(self, name: str) -> Path:
        return self.root / "results" / f"{name}.json"

    def _run_once(self, name: str) -> None:
        """Run the experiment unless it has run (the caller holds its lock)."""
        record = self._record(name)
        if not record.exists():
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(json.dumps(_reproduce(name, self.root / "runs")))


def _grid_size(experiment) -> int:
    """How many runs ``experiment``'s grid has at the tiny preset."""
    from mecheval.experiments.grid import expand

    return len(expand(experiment.sweep("tiny")))


@pytest.fixture(scope="session")
def tiny_experiments(tmp_path_factory) -> TinyExperiments:
    """Every registered experiment at the tiny preset, run once per test session as a user
    starts it (``mecheval reproduce NAME --preset tiny``) into one folder: the
    end-to-end tests (tests/test_reproduce_all.py) read what each printed and wrote, and the
    pages' commands (tests/test_doc_commands.py) start from its finished runs, so that a
    ``reproduce`` there reports instead of training again. Under pytest-xdist the workers
    share the folder: the first to ask for an experiment runs it, another waits for it."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by the session's workers
    return TinyExperiments(base / "tiny-experiments")


def _reproduce(name: str, out: Path) -> dict:
    from typer.testing import CliRunner

    from mecheval.cli import _register, app

    _register()
    # One worker: in this process (the worker pool's path has tests of its own,
    # tests/test_experiments.py), without two fresh interpreters per experiment.
    args = ["reproduce", name, "--preset", "tiny", "-q", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    output = result.output
    if result.exception is not None and result.exit_code not in (0, 1):
        output += "".join(traceback.format_exception(result.exception))
    return {"exit_code": result.exit_code, "output": output}
