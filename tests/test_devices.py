"""Every stage follows the model's device, checked on a CPU.

CI has no GPU, so the crash classes a GPU showed are guarded here by their CPU form:

- a tensor made without the model's device (on a GPU: indices on the CPU meeting tensors on
  the card). Under ``torch.device("meta")`` every tensor made without an explicit device is
  a meta tensor, and the first operation that meets one with the model's CPU tensors fails,
  as a CPU tensor meets a CUDA one;
- documents left on the CPU while the model is elsewhere: the engine must move them.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import yaml

from mecheval.interventions import interchange
from mecheval.models import ModelConfig, build_model
from mecheval.models.registry import BUILTIN_ARCHITECTURES
from mecheval.models.sites import state_site_names
from mecheval.tasks import ARConfig, Batch, build_datasets, corrupt

TASK = ARConfig(kind="ar", n_keys=8, n_values=8, n_pairs=3, n_train=0, n_dev=6, n_test=0)


def small_model(arch: str):
    torch.manual_seed(0)
    cfg = ModelConfig(
        architecture=arch, d_model=16, n_layers=2, vocab_size=TASK.vocab_size(), max_len=16
    )
    return build_model(cfg).eval()


def documents() -> tuple[Batch, Batch]:
    original = build_datasets(TASK)["dev"].batch(torch.arange(6))
    return original, corrupt(original, TASK, seed=3)


@pytest.mark.parametrize("arch", BUILTIN_ARCHITECTURES)
def test_the_engine_makes_every_tensor_on_the_models_device(arch: str) -> None:
    model = small_model(arch)
    original, corrupted = documents()
    sites = ["layers.1.input", "layers.0.mixer.output", *state_site_names(model)[:1]]
    expected = interchange(model, original, corrupted, sites=sites)
    with torch.device("meta"):
        measured = interchange(model, original, corrupted, sites=sites)
    pd.testing.assert_frame_equal(measured.table, expected.table)
    pd.testing.assert_frame_equal(measured.per_example, expected.per_example)


def test_the_engine_moves_the_documents_to_the_models_device(monkeypatch) -> None:
    model = small_model("attention")
    original, corrupted = documents()
    moved: list[tuple[int, torch.device]] = []
    to = Batch.to

    def spy(batch: Batch, device):
        moved.append((id(batch), torch.device(device)))
        return to(batch, device)

    monkeypatch.setattr(Batch, "to", spy)
    interchange(model, original, corrupted, sites=["layers.1.input"])
    assert (id(original), torch.device("cpu")) in moved
    assert (id(corrupted), torch.device("cpu")) in moved


def absent_devices() -> list[str]:
    """Devices this machine does not have: CUDA past its last card (every CUDA device on a
    machine without one), MPS off a Mac."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    absent = [f"cuda:{count}", "cuda:3"] if count < 4 else [f"cuda:{count}"]
    if not count:
        absent.insert(0, "cuda")
    if not torch.backends.mps.is_available():
        absent.append("mps")
    return absent


def files_under(folder) -> list:
    return sorted(p for p in folder.rglob("*")) if folder.exists() else []


@pytest.mark.parametrize("device", absent_devices())
@pytest.mark.parametrize("command", ["train", "sweep", "reproduce", "intervene"])
def test_a_device_this_machine_lacks_is_one_line_and_nothing_is_written(
    command: str, device: str, tmp_path, monkeypatch, capsys
) -> None:
    from small_runs import SWEEP_BASE, run_cli

    out = tmp_path / "runs"
    if command == "train":
        args = [
            "train",
            "--preset",
            "tiny",
            "--set",
            f"training.device={device}",
            "--out",
            str(out),
        ]
        field = "training.device"
    elif command == "sweep":
        base = {**SWEEP_BASE, "training": {**SWEEP_BASE["training"], "device": device}}
        spec = {"name": "s", "base": base, "grid": {"training.seed": [0, 1]}}
        (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
        args = ["sweep", str(tmp_path / "s.yaml"), "--out", str(out), "-q"]
        field = "training.device"
    elif command == "reproduce":
        # Without -q: the progress display must not start before the check.
        args = ["reproduce", "ar", "--preset", "tiny", "--device", device, "--out", str(out)]
        field = "training.device"
    else:
        code, _, err = run_cli(monkeypatch, capsys, "train", "--preset", "tiny", "--out", str(out))
        assert code == 0, err
        (run,) = out.iterdir()
        out = run
        args = ["intervene", str(run), "--device", device]
        field = "--device"
    before = files_under(out)
    code, stdout, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2
    assert err.startswith(f"error: {field}: {device!r}, but this machine has ")
    assert err.count("\n") == 1 and "Traceback" not in err + stdout
    assert files_under(out) == before


def test_a_sweep_runs_a_runs_interventions_on_the_device_it_trained_on(
    tmp_path, monkeypatch
) -> None:
    """The run trains on the CPU here; its job says cuda, as on a GPU machine: the
    interventions load the model there (the load is stopped before it needs a GPU)."""
    from small_runs import SWEEP_BASE

    from mecheval.experiments import mechanisms, runners
    from mecheval.experiments.execution import jobs
    from mecheval.experiments.grid import SweepSpec
    from mecheval.experiments.mechanisms import InterventionPlan

    spec = SweepSpec(name="d", base=SWEEP_BASE, grid={"training.seed": [0]})
    (job,) = runners.make_jobs(spec, tmp_path, 1, InterventionPlan(n_docs=4), False, None)
    assert jobs.execute_group([job])[0].state == "done"
    loaded = []

    def load_run(run_dir, device="cpu", cfg=None):
        loaded.append(str(device))
        raise RuntimeError("stopped before the load")

    monkeypatch.setattr(mechanisms, "load_run", load_run)
    (tmp_path / "d" / job.name / "interventions.csv").unlink()
    job.config["training"]["device"] = "cuda"
    outcome = jobs._finish(job, job.run(), None, "")
    assert loaded == ["cuda"]
    assert outcome.reason == "interventions: RuntimeError: stopped before the load"
