"""How a sweep's worker processes start (experiments/execution/pool.py): on Linux, forked from
a server that imported torch and mecheval once, yet each with the sweep's environment, folder
and import path as they are when the pool starts, as a freshly spawned worker would have."""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest
from small_runs import SWEEP_BASE

from mecheval.experiments.execution import pool
from mecheval.experiments.grid import SweepSpec
from mecheval.experiments.runners import run_sweep

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux")


def what_a_worker_sees(names: list[str]) -> dict:
    return {
        "imported": [name for name in names if name in sys.modules],
        "variable": os.environ.get("MECHEVAL_TEST_VARIABLE"),
        "folder": os.getcwd(),
        "path": list(sys.path),
    }


def _worker(context) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(
        max_workers=1,
        mp_context=context,
        initializer=pool._init_worker,
        initargs=(os.getpid(), None, dict(os.environ), os.getcwd(), list(sys.path)),
    )


@linux_only
def test_a_worker_arrives_with_torch_imported_and_the_sweeps_settings_of_now(
    tmp_path, monkeypatch
) -> None:
    context = pool._worker_context()
    assert context.get_start_method() == "forkserver"
    # The server is running now, started with the settings of before: a worker must not
    # inherit those.
    monkeypatch.setenv("MECHEVAL_TEST_VARIABLE", "set after the server started")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    names = ["torch", "torch._dynamo", pool.__name__]
    with _worker(context) as executor:
        seen = executor.submit(what_a_worker_sees, names).result(timeout=120)
    # Preloaded by the server: unpickling this test's function imports torch and the pool
    # module, but torch._dynamo only the preload (or an optimizer) imports.
    assert seen["imported"] == names
    assert seen["variable"] == "set after the server started"
    assert seen["folder"] == str(tmp_path)
    assert seen["path"] == list(sys.path)


@linux_only
def test_a_sweep_whose_environment_changed_trains_with_the_new_one(tmp_path, monkeypatch) -> None:
    """A kernel switch set between two sweeps of one process reaches the second one's
    workers (their runs record it in provenance.json)."""
    spec = SweepSpec.model_validate(
        {"name": "s", "base": SWEEP_BASE, "grid": {"training.lr": [1e-3, 2e-3]}}
    )
    monkeypatch.delenv("MECHEVAL_NATIVE", raising=False)
    run_sweep(spec, tmp_path / "before", workers=2)
    monkeypatch.setenv("MECHEVAL_NATIVE", "0")
    run_sweep(spec, tmp_path / "after", workers=2)
    for out, expected in ((tmp_path / "before", None), (tmp_path / "after", "0")):
        records = sorted((out / "s").glob("*/provenance.json"))
        assert len(records) == 2
        for record in records:
            session = json.loads(record.read_text())["sessions"][-1]
            assert session["kernels"].get("MECHEVAL_NATIVE") == expected, record
