"""The task x architecture mechanism matrix (issue #14): a sweep whose grid varies the task
(each run from its task's preset), `reproduce task-matrix --tasks/--archs`, and the matrix
figure and table (report/matrix.py) from the runs' labels."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from mecheval.cli.experiments import reproduce_spec
from mecheval.errors import ConfigError
from mecheval.experiments.catalog import MATRIX_TASKS, _archs
from mecheval.experiments.grid import SweepSpec, expand
from mecheval.experiments.plan import plan_runs
from mecheval.experiments.reproduce import report_figures
from mecheval.models.registry import BUILTIN_ARCHITECTURES, PAPER_ARCHITECTURES
from mecheval.report.matrix import best_runs, cell_text, render_matrix
from mecheval.training.config import config_to_data
from mecheval.training.presets import preset


def test_the_task_axis_starts_each_run_from_its_tasks_preset() -> None:
    spec = SweepSpec(
        name="m",
        base={"preset": "quick", "task": "ar"},
        grid={"task": ["mqar", "noisy_ar"], "model.architecture": ["mamba", "attention"]},
    )
    planned = plan_runs(spec)
    assert [run.name for run in planned] == [
        "mqar-mamba",
        "mqar-attention",
        "noisy_ar-mamba",
        "noisy_ar-attention",
    ]
    for run in planned:
        cfg = run.cfg
        kind, arch = run.name.split("-")
        expected = preset("quick", kind, arch)
        data = config_to_data(cfg)
        assert data["task"] == {**data["task"], **expected["task"]}
        assert data["training"]["lr"] == expected["training"]["lr"]  # the task's quick LR
        assert cfg.model.architecture == arch


def test_the_task_axis_needs_a_preset_base() -> None:
    spec = SweepSpec(name="m", base={"task": {"kind": "ar"}}, grid={"task": ["ar"]})
    with pytest.raises(ConfigError, match="sweep run ar: sweep.grid.task: .*preset base"):
        plan_runs(spec)


def stops(spec) -> dict[str, float | None]:
    return {run.name: run.cfg.training.stop_at_accuracy for run in plan_runs(spec)}


def test_quick_ar_stops_each_run_at_its_solution_but_mamba_trains_its_epochs() -> None:
    # reproduce ar --preset quick: zoology's early stop, except for the architectures the
    # quick preset trains longer (Mamba: stopped early, its label does not hold over seeds).
    _, spec = reproduce_spec("ar", "quick")
    assert stops(spec) == {arch: (None if arch == "mamba" else 0.99) for arch in _archs()}
    assert stops(reproduce_spec("ar", "quick", "attention,based")[1]) == {
        "attention": 0.99,
        "based": 0.99,
    }
    # The user's --set wins for every architecture, Mamba's own override included.
    for value, expected in [("null", None), ("0.95", 0.95)]:
        _, spec = reproduce_spec("ar", "quick", sets=[f"training.stop_at_accuracy={value}"])
        assert set(stops(spec).values()) == {expected}
    # The paper's grid and the other AR experiments at quick train every step.
    assert set(stops(reproduce_spec("ar", "paper", widths="64", lrs="1e-3")[1]).values()) == {None}
    assert set(stops(reproduce_spec("layer-count", "quick")[1]).values()) == {None}


def test_reproduce_task_matrix_tasks_and_archs() -> None:
    experiment, spec = reproduce_spec("task-matrix", "quick")
    assert spec.grid == {"task": MATRIX_TASKS, "model.architecture": _archs()}
    # Every cell stops at zoology's 0.99 dev accuracy; --set trains every step instead.
    assert {run.cfg.training.stop_at_accuracy for run in plan_runs(spec)} == {0.99}
    _, spec = reproduce_spec("task-matrix", "quick", sets=["training.stop_at_accuracy=null"])
    assert {run.cfg.training.stop_at_accuracy for run in plan_runs(spec)} == {None}
    assert len(expand(spec)) == len(MATRIX_TASKS) * 7
    assert report_figures(experiment, spec) == (
        "ar-restore",
        "noisy-ar-restore",
        "overwrite-ar-restore",
        "mqar-restore",
        "compositional-mqar-restore",
        "reverse-ar-restore",
        "stacked-mqar-restore",
    )
    _, spec = reproduce_spec("task-matrix", "quick", archs="attention,mamba", tasks="mqar, atr")
    assert spec.grid == {"task": ["mqar", "atr"], "model.architecture": ["attention", "mamba"]}
    assert [r.name for r in expand(spec)][:2] == ["mqar-attention", "mqar-mamba"]
    # At tiny, every task on three architectures, unless --archs or --tasks says otherwise.
    assert reproduce_spec("task-matrix", "tiny")[1].grid == {
        "task": MATRIX_TASKS,
        "model.architecture": ["attention", "based", "mamba"],
    }
    _, spec = reproduce_spec("task-matrix", "tiny", archs="hyena", tasks="ar")
    assert spec.grid == {"task": ["ar"], "model.architecture": ["hyena"]}
    # --archs all: every registered architecture, the paper's first.
    _, spec = reproduce_spec("ar", "quick", archs="all")
    archs = spec.grid["model.architecture"]
    assert archs[:7] == list(PAPER_ARCHITECTURES) and set(BUILTIN_ARCHITECTURES) <= set(archs)


@pytest.mark.parametrize(
    ("name", "tasks", "says"),
    [
        ("task-matrix", "mqar,bogus", "task.kind: unknown 'bogus'"),
        ("task-matrix", " , ", "--tasks: expected comma-separated task kinds"),
        ("ar", "mqar", "--tasks: experiment 'ar' studies ar only"),
    ],
)
def test_bad_tasks_are_one_line_errors(name: str, tasks: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        reproduce_spec(name, "quick", tasks=tasks)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_archs_slices_an_experiment_about_named_architectures() -> None:
    # mamba3-conv compares Mamba and Mamba-3: --archs picks among them (grid order, the full
    # grid's run names) and refuses any other, in one line.
    _, full = reproduce_spec("mamba3-conv", "quick")
    _, spec = reproduce_spec("mamba3-conv", "quick", archs="mamba3")
    assert spec.grid["model.architecture"] == ["mamba3"]
    assert [r.name for r in expand(spec)] == [
        r.name for r in expand(full) if r.name.startswith("mamba3-")
    ]
    _, spec = reproduce_spec("mamba3-conv", "quick", archs="mamba3,mamba")
    assert spec.grid["model.architecture"] == ["mamba", "mamba3"]
    with pytest.raises(ConfigError) as err:
        reproduce_spec("mamba3-conv", "quick", archs="mamba3,attention")
    assert str(err.value) == (
        "--archs: experiment 'mamba3-conv' studies mamba, mamba3 only (choose among them)"
    )


def records(rows: list[dict]) -> pd.DataFrame:
    base = {
        "status": "done",
        "reason": "",
        "dev accuracy": 0.5,
        "label": "induction",
        "accuracy": 0.9,
        "best role": "value",
        "recovered": 0.95,
    }
    return pd.DataFrame([{**base, "run": f"r{i}", **row} for i, row in enumerate(rows)])


def test_best_runs_picks_the_best_dev_run_per_cell_in_registry_order() -> None:
    table = records(
        [
            {"task": "mqar", "architecture": "attention", "dev accuracy": 0.4, "label": "unclear"},
            {"task": "mqar", "architecture": "attention", "dev accuracy": 0.9},
            {"task": "ar", "architecture": "attention", "status": "failed", "dev accuracy": 1.0},
            {"task": "ar", "architecture": "attention", "dev accuracy": 0.2, "label": "x"},
            {"task": "ar", "architecture": "mamba", "label": None, "status": "failed"},
        ]
    )
    best = best_runs(table)
    # Architectures in the paper's order (mamba first), tasks as registered (ar first).
    assert list(zip(best["architecture"], best["task"], strict=True)) == [
        ("mamba", "ar"),
        ("attention", "ar"),
        ("attention", "mqar"),
    ]
    assert list(best["run"]) == ["r4", "r3", "r1"]  # a done run beats a failed one
    assert cell_text(best.iloc[0]) == "failed"
    assert cell_text(best.iloc[2]) == "induction; acc 90%, value 95%"
    no_role = best.iloc[1].copy()
    no_role["recovered"] = -0.1
    assert cell_text(no_role).endswith("acc 90%, no role recovers")


def test_render_matrix_table_and_figure() -> None:
    table = records(
        [
            {"task": "ar", "architecture": "attention"},
            {
                "task": "mqar",
                "architecture": "attention",
                "label": "direct retrieval, layer 0",
                "best role": "query",
                "recovered": 0.5,
            },  # fmt: skip
            {"task": "ar", "architecture": "mamba", "label": "not learned", "accuracy": 0.25},
        ]
    )
    result = render_matrix(table)
    lines = result.markdown.splitlines()
    header = next(line for line in lines if line.startswith("| architecture"))
    assert header == "| architecture | AR | MQAR |"
    assert "| Mamba | not learned; acc 25%, value 95% |  |" in lines
    assert (
        "| Attention | induction; acc 90%, value 95% | "
        "direct retrieval, layer 0; acc 90%, query 50% |" in lines
    )
    ax = result.figure.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["AR", "MQAR"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["Mamba", "Attention"]
    texts = [t.get_text() for t in ax.texts]
    assert "acc 90%\nquery 50%" in texts and len(texts) == 3
    legend = [t.get_text() for t in result.figure.legends[0].get_texts()]
    assert legend == ["induction", "direct retrieval, layer 0", "not learned"]


def test_every_label_of_every_reading_has_a_colour_of_its_own() -> None:
    # One matrix may hold retrieval's and state tracking's labels side by side: a label
    # without a colour would be drawn blank, two alike would share a legend colour.
    from mecheval.report.matrix import LABEL_COLOURS
    from mecheval.tasks.readings import RETRIEVAL, STATE_TRACKING

    labels = {"unclear", "inconclusive"}
    for reading in (RETRIEVAL, STATE_TRACKING):
        labels |= {*reading.at_label_site.values(), *reading.in_state.values()}
        labels.add(reading.at_chance)
    assert labels <= set(LABEL_COLOURS)
    assert len(set(LABEL_COLOURS.values())) == len(LABEL_COLOURS)


def test_label_records_read_the_runs_folders(tmp_path) -> None:
    from mecheval.experiments.store import label_records
    from mecheval.training.config import config_from_data, resolve
    from mecheval.training.run import train

    cfg = resolve(config_from_data(preset("tiny", "mqar", "attention"), ["name=mqar-attention"]))
    train(cfg, tmp_path / "mqar-attention")
    (tmp_path / "mqar-attention" / "mechanism.json").write_text(
        json.dumps(
            {
                "site": "layers.1.input",
                "label": "unclear",
                "original": 0.3,
                "corrupted": 0.1,
                "restored": {},
                "recovered": {"key": 0.1, "value": 0.3, "query": 0.2},
                "accuracy": 0.4,
            }
        )
    )
    rows = label_records(tmp_path)
    assert rows.to_dict("records")[0] | {"dev accuracy": None, "test accuracy": None} == {
        "run": "mqar-attention",
        "task": "mqar",
        "short conv": None,
        "architecture": "attention",
        "layers": 2,
        "pairs": 2,  # tiny MQAR's
        "status": "done",
        "reason": "",
        "dev accuracy": None,
        "test accuracy": None,
        "negative eigenvalues": None,  # attention has no allow_neg_eigval
        "label": "unclear",
        "accuracy": 0.4,
        "best role": "value",
        "recovered": 0.3,
        "carrier layer": None,  # a one-architecture model has no carrier
        "carrier architecture": None,
        "reads": None,
    }


# ------------------------------------------------------------------------- conv-switch


def test_conv_switch_grid_keeps_the_architectures_the_switch_applies_to() -> None:
    experiment, spec = reproduce_spec("conv-switch", "quick")
    switchable = [a for a in _archs() if a not in ("based", "baseconv")]
    assert spec.grid == {"model.architecture": switchable, "model.short_conv": ["none", 2, 4]}
    assert [r.name for r in expand(spec)][:3] == ["mamba-convnone", "mamba-conv2", "mamba-conv4"]
    assert experiment.matrix == "short conv" and report_figures(experiment, spec) == ()
    _, spec = reproduce_spec("conv-switch", "quick", archs="all")
    assert "based" not in spec.grid["model.architecture"]
    # A refused architecture named explicitly fails before anything trains, naming why.
    _, spec = reproduce_spec("conv-switch", "quick", archs="based")
    with pytest.raises(ConfigError, match="model.short_conv: based alternates"):
        plan_runs(spec)


def test_conv_matrix_columns_in_switch_order() -> None:
    from mecheval.report.matrix import CONV_COLUMNS

    table = records(
        [
            {"task": "ar", "architecture": "attention", "short conv": 4},
            {"task": "ar", "architecture": "attention", "short conv": "none", "label": "unclear"},
            {"task": "ar", "architecture": "attention", "short conv": 2},
            {"task": "ar", "architecture": "mamba", "short conv": None},
        ]
    )
    result = render_matrix(table, CONV_COLUMNS)
    header = next(line for line in result.markdown.splitlines() if line.startswith("| arch"))
    assert header == "| architecture | no short conv | default | short conv 2 | short conv 4 |"
    assert "| Attention | unclear; acc 90%, value 95% |  | induction" in result.markdown


def test_eigenvalue_matrix_columns_by_task_then_range_with_accuracies() -> None:
    from mecheval.report.matrix import EIGENVALUE_COLUMNS

    table = records(
        [
            {"task": "s3", "architecture": "mamba", "negative eigenvalues": True},
            {"task": "parity", "architecture": "mamba", "negative eigenvalues": True},
            {"task": "parity", "architecture": "mamba", "negative eigenvalues": False},
            {"task": "parity", "architecture": "deltanet", "negative eigenvalues": False},
        ]
    ).assign(**{"test accuracy": [0.2, 0.98, 0.5, 0.55]})
    table.loc[2, "label"] = "in the state after it"
    result = render_matrix(table, EIGENVALUE_COLUMNS)
    lines = result.markdown.splitlines()
    headers = [line for line in lines if line.startswith("| architecture")]
    assert headers == ["| architecture | Parity, [0, 1] | Parity, [-1, 1] | S3, [-1, 1] |"] * 2
    assert "(dev split: the trained lengths)" in result.markdown
    assert "| Mamba | in the state after it; acc 90%, value 95% | induction" in result.markdown
    assert "| Mamba | 50 / 50 | 50 / 98 | 50 / 20 |" in lines
    assert "| DeltaNet | 50 / 55 |  |  |" in lines


def test_state_tracking_sweep_takes_the_archs_with_negative_eigenvalues() -> None:
    experiment, spec = reproduce_spec("state-tracking", "quick")
    assert spec.grid["task"] == ["parity", "s3"]
    assert spec.grid["model.architecture"] == ["mamba", "deltanet", "mamba2", "gated_deltanet"]
    assert spec.set["task.test_min_elements"] == 17 and spec.set["task.test_max_elements"] == 64
    assert experiment.plan.split == "dev" and experiment.matrix == "eigenvalues"
    assert [r.name for r in expand(spec)][:2] == ["parity-mamba-negoff", "parity-mamba-negon"]
    _, spec = reproduce_spec("state-tracking", "paper")
    assert spec.set["task.test_min_elements"] == 40 and spec.set["task.test_max_elements"] == 256
    with pytest.raises(ConfigError):
        plan_runs(reproduce_spec("state-tracking", "quick", archs="attention")[1])


def test_reproduce_set_overrides_every_run_in_its_own_folder() -> None:
    _, spec = reproduce_spec("conv-switch", "quick", sets=["model.n_layers=1"])
    assert spec.name == "conv-switch-quick-L1" and spec.set["model.n_layers"] == 1
    planned = plan_runs(spec)
    assert planned and all(run.cfg.model.n_layers == 1 for run in planned)
    _, spec = reproduce_spec("conv-switch", "quick", sets=["model.n_layerz=1"])
    with pytest.raises(ConfigError, match="model.n_layerz"):
        plan_runs(spec)
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        reproduce_spec("conv-switch", "quick", sets=["model.n_layers"])


def test_a_runtime_field_set_on_reproduce_keeps_the_experiment_folder() -> None:
    # Threads and device change how fast the runs train, not what: a slice trained with them
    # lands where the full grid looks, so the grid skips it.
    plain = reproduce_spec("ar", "paper", "mamba", widths="64", lrs="1e-3")[1]
    sets = ["training.threads=1", "training.device=cpu", "training.kernels=reference"]
    _, spec = reproduce_spec("ar", "paper", "mamba", widths="64", lrs="1e-3", sets=sets)
    assert spec.name == plain.name == "ar-paper"
    assert spec.set["training.threads"] == 1 and spec.set["training.device"] == "cpu"
    assert [r.name for r in expand(spec)] == [r.name for r in expand(plain)]
    # With a field that changes the runs, the name still carries that one alone.
    _, spec = reproduce_spec(
        "ar", "paper", "mamba", sets=["training.threads=1", "model.n_layers=1"]
    )
    assert spec.name == "ar-paper-L1"
