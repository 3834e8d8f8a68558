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

from mecheval.experiments.execution import pool, server
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
    context = server.worker_context()
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


def test_the_server_module_imports_nothing_heavy_and_preloads_the_pool() -> None:
    """A command starts the server before it imports torch (cli/experiments.py), so the
    module that starts it must not import torch itself; what it preloads is the pool."""
    import subprocess

    probe = (
        "import sys; import mecheval.experiments.execution.server as s; "
        "print(sorted(m for m in ('torch', 'pandas', 'mecheval.training') if m in sys.modules))"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert shown.strip() == "[]"
    assert [pool.__name__, "torch._dynamo"] == server.WORKER_PRELOAD


@pytest.mark.parametrize(
    ("args", "starts"),
    [
        (["--workers", "2"], True),
        (["--workers", "1"], False),
        (["--workers", "2", "--backend", "ray"], False),
    ],
)
def test_a_sweep_on_worker_processes_starts_their_server_before_it_plans(
    tmp_path, monkeypatch, capsys, args, starts
) -> None:
    """The server's imports take seconds; started before the runs are planned, they run on
    another core meanwhile. Only where the local pool will be used: not for --workers 1 nor
    for Ray."""
    from small_runs import run_cli

    from mecheval.experiments import runners

    calls: list[str] = []
    monkeypatch.setattr(server, "worker_context", lambda: calls.append("server"))

    def plan_and_stop(*_args, **_kwargs):
        calls.append("plan")
        raise SystemExit(5)

    monkeypatch.setattr(runners, "plan_sweep", plan_and_stop)
    monkeypatch.setattr(runners, "check_options", lambda *a: None)  # Ray need not be here
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({"name": "s", "base": SWEEP_BASE, "grid": {"training.lr": [1e-3]}}))
    code, _, _ = run_cli(monkeypatch, capsys, "sweep", str(spec), "--out", str(tmp_path), *args)
    assert code == 5
    assert calls == (["server", "plan"] if starts else ["plan"])
