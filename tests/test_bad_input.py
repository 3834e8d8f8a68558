"""Malformed input, as a new user would give it: each case runs `mecheval ...` through its real
entry point and must end with exit status 2, exactly one line on stderr (``error: ...``) that
names the field, flag or file, no traceback (any exception other than SystemExit escaping
``main`` fails the test), and the working folder byte for byte as it was: nothing written,
nothing half-written.

The cases work in a copy of one finished tiny run (``att``, attention, AR) and of a finished
two-run experiment (``exp/s``), damaged as each case says.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from small_runs import SWEEP_BASE, run_cli

from mecheval.errors import ConfigError
from mecheval.experiments.grid import SweepSpec
from mecheval.experiments.runners import run_sweep
from mecheval.models.registry import ARCHITECTURES, parse_options
from mecheval.training import train
from mecheval.training.config import config_from_data
from mecheval.training.presets import preset


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A folder holding the finished run ``att`` and the finished experiment ``exp/s``."""
    root = tmp_path_factory.mktemp("finished")
    train(config_from_data(preset("tiny", "ar", "attention"), ["training.steps=4"]), root / "att")
    spec = SweepSpec(name="s", base=SWEEP_BASE, grid={"training.lr": [1e-3, 3e-3]})
    run_sweep(spec, root / "exp")
    return root


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        if p.is_file()
        else ""
        for p in sorted(folder.rglob("*"))
    }


# ------------------------------------------------------------------------- damage to files
def write(relative: str, content: str | bytes) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)

    return damage


def truncate(relative: str, keep: int) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        path = root / relative
        path.write_bytes(path.read_bytes()[:keep])

    return damage


def remove(relative: str) -> Callable[[Path], None]:
    return lambda root: (root / relative).unlink()


def replace_text(relative: str, old: str, new: str) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        path = root / relative
        text = path.read_text()
        assert old in text, (relative, old)
        path.write_text(text.replace(old, new))

    return damage


def sweep_file(spec: dict) -> Callable[[Path], None]:
    return write("spec.yaml", yaml.safe_dump(spec))


GOOD_SWEEP = {"name": "t", "base": SWEEP_BASE, "grid": {"training.lr": [1e-3]}}
GARBAGE = os.urandom(64).replace(b"\n", b"x")
PICKLE = pickle.dumps({"weight": [1.0, 2.0]})


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    #: what the one stderr line must contain: the field, flag or file it names
    names: str
    damage: Callable[[Path], None] | None = None


TINY = ("train", "--preset", "tiny", "--out", "runs", "-q")
MAMBA = (*TINY, "--arch", "mamba")
NOISY = (*TINY, "--task", "noisy_ar")
OVERWRITE = (*TINY, "--task", "overwrite_ar")
MQAR = (*TINY, "--task", "mqar")
COMPOSITIONAL = (*TINY, "--task", "compositional_mqar")
REPRO = ("reproduce", "ar", "--preset", "tiny", "--out", "runs", "-q")

CASES = [
    # ---- train: the config, before any run folder exists
    Case(
        "mixer option out of range", (*MAMBA, "--set", "model.mixer.d_conv=0"), "model.mixer.d_conv"
    ),
    Case("mixer option unknown", (*MAMBA, "--set", "model.mixer.nosuch=1"), "model.mixer.nosuch"),
    Case(
        "mixer state size zero", (*MAMBA, "--set", "model.mixer.d_state=0"), "model.mixer.d_state"
    ),
    Case("mixer expand zero", (*MAMBA, "--set", "model.mixer.expand=0"), "model.mixer.expand"),
    Case("lr nan", (*TINY, "--set", "training.lr=nan"), "training.lr"),
    Case("lr inf", (*TINY, "--set", "training.lr=inf"), "training.lr"),
    Case("lr .inf (YAML)", (*TINY, "--set", "training.lr=.inf"), "training.lr"),
    Case("lr negative", (*TINY, "--set", "training.lr=-1"), "training.lr"),
    Case("lr not a number", (*TINY, "--set", "training.lr=abc"), "training.lr"),
    Case("grad clip inf", (*TINY, "--set", "training.grad_clip=inf"), "training.grad_clip"),
    Case("eps nan", (*TINY, "--set", "training.eps=nan"), "training.eps"),
    Case(
        "stop accuracy above one",
        (*TINY, "--set", "training.stop_at_accuracy=1.5"),
        "training.stop_at_accuracy",
    ),
    Case(
        "stop accuracy without dev",
        (*TINY, "--set", "training.stop_at_accuracy=0.9", "--set", "training.eval_splits=[test]"),
        "training.stop_at_accuracy",
    ),
    Case(
        "a split both every time and at the end",
        (*TINY, "--set", "training.eval_at_end=[test]"),
        "training.eval_at_end",
    ),
    Case("beta out of range", (*TINY, "--set", "training.betas=[0.9,1.5]"), "training.betas"),
    Case("n_train below one batch", (*TINY, "--set", "task.n_train=8"), "training.batch_size"),
    Case("batch size zero", (*TINY, "--set", "training.batch_size=0"), "training.batch_size"),
    Case("steps negative", (*TINY, "--set", "training.steps=-1"), "training.steps"),
    Case("eval_every zero", (*TINY, "--set", "training.eval_every=0"), "training.eval_every"),
    Case(
        "warmup above one",
        (*TINY, "--set", "training.warmup_fraction=2"),
        "training.warmup_fraction",
    ),
    Case("device unknown", (*TINY, "--set", "training.device=tpu"), "training.device"),
    Case("d_model zero", (*TINY, "--set", "model.d_model=0"), "model.d_model"),
    Case("d_model text", (*TINY, "--set", "model.d_model=abc"), "model.d_model"),
    Case("n_layers zero", (*TINY, "--set", "model.n_layers=0"), "model.n_layers"),
    Case("vocab below the task's", (*TINY, "--set", "model.vocab_size=3"), "model.vocab_size"),
    Case("max_len below the task's", (*TINY, "--set", "model.max_len=2"), "model.max_len"),
    Case("more pairs than keys", (*TINY, "--set", "task.n_pairs=1000"), "task.n_pairs"),
    Case("noise fraction one", (*NOISY, "--set", "task.noise_fraction=1"), "task.noise_fraction"),
    Case(
        "noise fraction negative",
        (*NOISY, "--set", "task.noise_fraction=-0.1"),
        "task.noise_fraction",
    ),
    Case("more slots than keys", (*NOISY, "--set", "task.n_slots=1000"), "task.n_slots"),
    Case("more queries than pairs", (*MQAR, "--set", "task.n_queries=3"), "task.n_queries"),
    Case("sequence too short for the pairs", (*MQAR, "--set", "task.seq_len=7"), "task.seq_len"),
    Case("power law exponent zero", (*MQAR, "--set", "task.power_a=0"), "task.power_a"),
    Case("grid not square", (*COMPOSITIONAL, "--set", "task.n_pairs=3"), "task.n_pairs"),
    Case("key token unknown", (*COMPOSITIONAL, "--set", "task.corrupt=both"), "task.corrupt"),
    Case("more updates than pairs", (*OVERWRITE, "--set", "task.n_updates=3"), "task.n_updates"),
    Case(
        "more pairs than keys (overwrite)", (*OVERWRITE, "--set", "task.n_pairs=9"), "task.n_pairs"
    ),
    Case(
        "query share above one", (*OVERWRITE, "--set", "task.query_updated=2"), "task.query_updated"
    ),
    Case("unknown training field", (*TINY, "--set", "training.lrr=1"), "training.lrr"),
    Case("unknown task field", (*TINY, "--set", "task.nosuch=1"), "task.nosuch"),
    Case("--set without =", (*TINY, "--set", "training.lr"), "--set"),
    Case("--set into a value", (*TINY, "--set", "training.lr.x=1"), "--set"),
    Case("architecture unknown", (*TINY, "--arch", "nosuch"), "model.architecture"),
    Case("task unknown", (*TINY, "--task", "nosuch"), "--task"),
    Case("preset unknown", ("train", "--preset", "nosuch", "--out", "runs"), "--preset"),
    Case("preset and config", ("train", "c.yaml", "--preset", "tiny"), "--preset"),
    Case("neither preset nor config", ("train",), "--preset"),
    Case("name ..", (*TINY, "--name", ".."), "name"),
    Case("name .", (*TINY, "--name", "."), "name"),
    Case("name with a slash", (*TINY, "--name", "../x"), "name"),
    Case("name absolute", (*TINY, "--name", "/tmp/x"), "name"),
    Case("name empty", (*TINY, "--name", ""), "name"),
    Case("--out is a file", ("train", "--preset", "tiny", "--out", "att/config.yaml"), "--out"),
    Case("config file missing", ("train", "nosuch.yaml"), "nosuch.yaml"),
    Case("config file garbage", ("train", "c.yaml"), "c.yaml", write("c.yaml", "{{{: [")),
    Case("config file a list", ("train", "c.yaml"), "c.yaml", write("c.yaml", "- 1\n")),
    Case("config file binary", ("train", "c.yaml"), "c.yaml", write("c.yaml", GARBAGE)),
    Case("config file a folder", ("train", "att"), "att"),
    Case("unknown option", ("train", "--bogus"), "--bogus"),
    # ---- train on an existing run folder
    Case(
        "resume with another config",
        ("train", "--preset", "tiny", "--out", ".", "--name", "att", "--set", "training.lr=0.1"),
        "att",
    ),
    # ---- intervene on damaged or mismatched run folders
    Case("intervene: no folder", ("intervene", "nosuch"), "nosuch"),
    Case(
        "intervene: no weights",
        ("intervene", "att"),
        "model.safetensors",
        remove("att/model.safetensors"),
    ),
    Case(
        "intervene: empty weights",
        ("intervene", "att"),
        "model.safetensors",
        write("att/model.safetensors", b""),
    ),
    Case(
        "intervene: truncated weights",
        ("intervene", "att"),
        "model.safetensors",
        truncate("att/model.safetensors", 400),
    ),
    Case(
        "intervene: garbage weights",
        ("intervene", "att"),
        "model.safetensors",
        write("att/model.safetensors", GARBAGE),
    ),
    Case(
        "intervene: pickle as weights",
        ("intervene", "att"),
        "model.safetensors",
        write("att/model.safetensors", PICKLE),
    ),
    Case(
        "intervene: config of another size",
        ("intervene", "att"),
        "model.safetensors",
        replace_text("att/config.yaml", "d_model: 16", "d_model: 32"),
    ),
    Case(
        "intervene: config of another architecture",
        ("intervene", "att"),
        "model.safetensors",
        replace_text("att/config.yaml", "architecture: attention", "architecture: mamba"),
    ),
    Case(
        "intervene: garbage config",
        ("intervene", "att"),
        "att/config.yaml",
        write("att/config.yaml", "{{{"),
    ),
    Case(
        "intervene: garbage status",
        ("intervene", "att"),
        "att/status.json",
        write("att/status.json", "{{{"),
    ),
    Case(
        "intervene: status not an object",
        ("intervene", "att"),
        "att/status.json",
        write("att/status.json", "[1]"),
    ),
    Case("intervene: unknown site", ("intervene", "att", "--sites", "nosuch"), "--sites"),
    Case("intervene: unknown role", ("intervene", "att", "--roles", "nosuch"), "--roles"),
    Case("intervene: unknown documents", ("intervene", "att", "--documents", "x"), "--documents"),
    Case("intervene: zero documents", ("intervene", "att", "-n", "0"), "-n"),
    Case("intervene: split", ("intervene", "att", "--split", "train"), "--split"),
    Case("intervene: no argument", ("intervene",), "run_dir"),
    # ---- results on damaged experiments
    Case("results: no folder", ("results", "nosuch"), "nosuch"),
    Case("results: no runs inside", ("results", "att"), "att"),
    Case(
        "results: garbage config",
        ("results", "exp/s"),
        "config.yaml",
        write("exp/s/lr1e-3/config.yaml", "{{{"),
    ),
    Case(
        "results: config not a mapping",
        ("results", "exp/s"),
        "config.yaml",
        write("exp/s/lr1e-3/config.yaml", "3"),
    ),
    Case(
        "results: binary metrics",
        ("results", "exp/s"),
        "metrics.csv",
        write("exp/s/lr1e-3/metrics.csv", GARBAGE),
    ),
    Case(
        "results: metrics of another table",
        ("results", "exp/s"),
        "metrics.csv",
        write("exp/s/lr1e-3/metrics.csv", "a,b\n1,2\n"),
    ),
    Case(
        "results: garbage interventions",
        ("results", "exp/s"),
        "interventions.csv",
        write("exp/s/lr1e-3/interventions.csv", "x\n1\n"),
    ),
    Case("results: unknown format", ("results", "exp/s", "--format", "xls"), "--format"),
    # ---- sweep specs
    Case("sweep: missing file", ("sweep", "nosuch.yaml"), "nosuch.yaml"),
    Case("sweep: garbage YAML", ("sweep", "spec.yaml"), "spec.yaml", write("spec.yaml", "{{{")),
    Case("sweep: binary file", ("sweep", "spec.yaml"), "spec.yaml", write("spec.yaml", GARBAGE)),
    Case(
        "sweep: unknown top-level key",
        ("sweep", "spec.yaml"),
        "sweep.gridd",
        sweep_file({**GOOD_SWEEP, "gridd": {}}),
    ),
    Case(
        "sweep: misspelt per_architecture entry",
        ("sweep", "spec.yaml", "--out", "runs"),
        "sweep.per_architecture.atention",
        sweep_file({**GOOD_SWEEP, "per_architecture": {"atention": {"training.lr": 0.1}}}),
    ),
    Case(
        "sweep: unknown base section with a preset",
        ("sweep", "spec.yaml", "--out", "runs"),
        "sweep.base.trainng",
        sweep_file({"name": "t", "base": {"preset": "tiny", "task": "ar", "trainng": {"lr": 1}}}),
    ),
    Case(
        "sweep: a bad architecture in the grid, before any run trains",
        ("sweep", "spec.yaml", "--out", "runs"),
        "model.architecture",
        sweep_file({**GOOD_SWEEP, "grid": {"model.architecture": ["attention", "nosuch"]}}),
    ),
    Case(
        "sweep: an unknown field in the grid",
        ("sweep", "spec.yaml", "--out", "runs"),
        "training.lrr",
        sweep_file({**GOOD_SWEEP, "grid": {"training.lrr": [1]}}),
    ),
    Case(
        "sweep: an empty grid axis",
        ("sweep", "spec.yaml", "--out", "runs"),
        "grid",
        sweep_file({**GOOD_SWEEP, "grid": {"training.lr": []}}),
    ),
    Case(
        "sweep: its folder holds finished runs of another config",
        ("sweep", "spec.yaml", "--out", "exp"),
        "lr1e-3: holds a run with a different config",
        sweep_file(
            {
                "name": "s",
                "base": SWEEP_BASE,
                "set": {"training.steps": 18},
                "grid": {"training.lr": [1e-3, 1e-2]},
            }
        ),
    ),
    Case(
        "sweep: zero workers",
        ("sweep", "spec.yaml", "--workers", "0"),
        "--workers",
        sweep_file(GOOD_SWEEP),
    ),
    Case(
        "sweep: unknown backend",
        ("sweep", "spec.yaml", "--backend", "x"),
        "--backend",
        sweep_file(GOOD_SWEEP),
    ),
    Case(
        "sweep: --out is a file",
        ("sweep", "spec.yaml", "--out", "att/config.yaml"),
        "--out",
        sweep_file(GOOD_SWEEP),
    ),
    # ---- reproduce
    Case("reproduce: unknown experiment", ("reproduce", "nosuch"), "experiment"),
    Case("reproduce: --archs ,", (*REPRO, "--archs", ","), "--archs"),
    Case("reproduce: unknown architecture", (*REPRO, "--archs", "nosuch"), "model.architecture"),
    Case("reproduce: unknown preset", ("reproduce", "ar", "--preset", "nosuch"), "--preset"),
    Case("reproduce: width not in the grid", (*REPRO, "--widths", "7"), "--widths"),
    Case("reproduce: widths not numbers", (*REPRO, "--widths", "a,b"), "--widths"),
    Case("reproduce: unknown documents", (*REPRO, "--documents", "x"), "--documents"),
    Case(
        "reproduce: --out is a file",
        ("reproduce", "ar", "--preset", "tiny", "--out", "att/config.yaml"),
        "--out",
    ),
    # ---- other commands
    Case("task: unknown kind", ("task", "show", "nosuch"), "nosuch"),
    Case("models: unknown command", ("models", "show", "x"), "show"),
    Case("check-mixer: unknown architecture", ("check-mixer", "nosuch"), "model.architecture"),
    Case(
        "check-mixer: unknown layer of a hybrid",
        ("check-mixer", "mamba+nosuch"),
        "model.layers.1.architecture",
    ),
    Case(
        "check-mixer: options for a hybrid",
        ("check-mixer", "mamba+attention", "--set", "d_state=4"),
        "--set",
    ),
    Case("plugin: missing file", ("--plugin", "nosuch.py", "models", "list"), "--plugin"),
    Case(
        "plugin: raises on import",
        ("--plugin", "p.py", "models", "list"),
        "p.py",
        write("p.py", "raise RuntimeError('x')\n"),
    ),
]


def test_the_table_is_large_and_its_cases_distinct() -> None:
    assert len(CASES) >= 60
    assert len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_line_and_writes_nothing(
    case: Case, finished: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    work = tmp_path / "work"
    shutil.copytree(finished, work)
    if case.damage is not None:
        case.damage(work)
    monkeypatch.chdir(work)
    before = snapshot(work)

    code, out, err = run_cli(monkeypatch, capsys, *case.args)

    lines = err.splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert case.names in lines[0], lines[0]
    assert snapshot(work) == before  # nothing written, nothing removed


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_every_mixer_names_an_option_it_does_not_have(arch: str) -> None:
    """A misspelt ``model.mixer`` key is an error naming it, for every built-in mixer (their
    options share one base that forbids extra keys), never a run trained on the default."""
    with pytest.raises(ConfigError, match=r"^model\.mixer\.chunk_sise: unknown field$"):
        parse_options(arch, {"chunk_sise": 64})
