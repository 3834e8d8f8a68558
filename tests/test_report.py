"""The report stage on hand-made results tables whose every number is known."""

from __future__ import annotations

import base64
import html
import math
import re
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from small_runs import run_cli

from mecheval.errors import ConfigError
from mecheval.report import (
    FIGURES,
    FigureResult,
    best_lr,
    final_behaviour,
    restore_table,
    seed_summary,
    write_figure,
    write_html,
)
from mecheval.report.html import render_html
from mecheval.report.registry import available_figures
from mecheval.report.results import normalise
from mecheval.report.specs import site_title
from mecheval.report.tables import t975

matplotlib.use("Agg")

ROLES = ("key", "value", "next_key", "divider", "query")


def run_rows(
    run: str,
    config: dict,
    *,
    dev: float,
    test: float | None = None,
    accuracy: float | None = None,
    mech: dict | None = None,
    steps: tuple[int, ...] = (50, 100),
    mech_steps: tuple[int, ...] | None = None,
    status: str = "done",
    reason: str = "",
) -> list[dict]:
    """Rows of one run. Behavioural values are ``dev``/``test`` at the final step (half of
    that before). ``mech`` maps "original", "corrupted" or (site, role) to a likelihood."""
    head = {"run": run, "status": status, "reason": reason, **config}
    rows = []
    if status == "failed" and not mech:
        return [{**head, "metric": np.nan, "value": np.nan}]
    test = dev if test is None else test
    accuracy = dev if accuracy is None else accuracy
    for step in steps:
        scale = 1.0 if step == steps[-1] else 0.5
        for split, like, acc in (("dev", dev, accuracy), ("test", test, test)):
            for metric, value in (("likelihood", like), ("accuracy", acc)):
                rows.append(
                    {**head, "source": "behavioural", "step": step, "split": split,
                     "condition": "", "site": "", "layer": -1, "component": "", "io": "",
                     "role": "", "metric": metric, "value": value * scale}
                )  # fmt: skip
    for step in mech_steps or (steps[-1],):
        scale = 1.0 if step == (mech_steps or steps)[-1] else 0.5
        for key, value in (mech or {}).items():
            if isinstance(key, str):
                condition, site, role = key, "", ""
            else:
                condition, (site, role) = "restored", key
            layer = int(site.split(".")[1]) if site.startswith("layers.") else -1
            rows.append(
                {**head, "source": "mechanistic", "step": step, "split": "dev",
                 "condition": condition, "site": site, "layer": layer,
                 "component": "block" if site.endswith(".input") else "conv", "io": "input",
                 "role": role, "metric": "likelihood", "value": value * scale}
            )  # fmt: skip
    return rows


def config(arch="attention", d=32, lr=1e-3, seed=0, kind="ar", layers=2, **extra) -> dict:
    return {
        "task.kind": kind,
        "task.split": np.nan,
        "model.architecture": arch,
        "model.d_model": d,
        "model.n_layers": layers,
        "model.position_embedding": True,
        "model.mixer.d_conv": 4 if arch == "mamba" else np.nan,
        "training.lr": lr,
        "training.seed": seed,
        **extra,
    }


def restore_mech(orig, corr, key, value, query, site="layers.1.input") -> dict:
    return {
        "original": orig,
        "corrupted": corr,
        (site, "key"): key,
        (site, "value"): value,
        (site, "query"): query,
    }


@pytest.fixture(scope="module")
def main_table() -> pd.DataFrame:
    """AR: attention and mamba x d {16, 32} x lr {1e-3, 1e-2} x seeds {0, 1, 2}.

    The good LR (1e-3 for attention, 1e-2 for mamba) has the higher mean *dev* likelihood;
    the other has the higher *test* likelihood, so tuning on test would pick wrong.
    Attention at the good LR restores at value (induction), mamba at query.
    One attention d=16 lr=1e-3 seed failed."""
    rows = []
    for arch, good in (("attention", 1e-3), ("mamba", 1e-2)):
        for d in (16, 32):
            for lr in (1e-3, 1e-2):
                for seed in range(3):
                    name = f"{arch}-d{d}-lr{lr:g}-s{seed}"
                    cfg = config(arch, d, lr, seed)
                    if arch == "attention" and d == 16 and lr == 1e-3 and seed == 2:
                        rows += run_rows(name, cfg, dev=0, status="failed", reason="diverged")
                        continue
                    if lr == good:
                        dev, test = 0.80 + 0.01 * seed, 0.10
                        v = 0.90 + 0.02 * seed  # restored @ value (or query) per seed
                        mech = (
                            restore_mech(0.95, 0.02, 0.03, v, 0.04)
                            if arch == "attention"
                            else restore_mech(0.93, 0.01, 0.02, 0.05, v)
                        )
                    else:
                        dev, test = 0.50, 0.99
                        mech = restore_mech(0.5, 0.5, 0.5, 0.5, 0.5)
                    rows += run_rows(name, cfg, dev=dev, test=test, mech=mech)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- tables


def test_t_quantiles():
    assert t975(1) == pytest.approx(12.706)
    assert t975(2) == pytest.approx(4.303)
    assert t975(60) == pytest.approx(2.000, abs=0.003)
    assert t975(120) == pytest.approx(1.980, abs=0.003)


def test_final_behaviour_takes_the_last_step(main_table):
    final = final_behaviour(main_table)
    assert set(final["step"]) == {100}
    row = final[
        (final["run"] == "mamba-d32-lr0.01-s1")
        & (final["split"] == "dev")
        & (final["metric"] == "likelihood")
    ]
    assert row["value"].tolist() == [pytest.approx(0.81)]


def test_best_lr_uses_dev_not_test(main_table):
    chosen = best_lr(main_table)
    lrs = chosen.drop_duplicates("run").groupby("model.architecture")["training.lr"].unique()
    assert lrs["attention"].tolist() == [1e-3]
    assert lrs["mamba"].tolist() == [1e-2]
    # The failed seed of the chosen LR is kept so it can be counted.
    assert "attention-d16-lr0.001-s2" in set(chosen["run"])
    on_test = best_lr(main_table, split="test")
    assert set(on_test.drop_duplicates("run")["training.lr"]) == {1e-2, 1e-3}
    assert on_test[on_test["model.architecture"] == "attention"]["training.lr"].eq(1e-2).all()


def test_best_lr_explicit_by_tunes_per_group(main_table):
    chosen = best_lr(main_table, by=["model.architecture"])
    runs = chosen.drop_duplicates("run")
    assert len(runs) == 2 * 2 * 3  # both d_models, one LR each, three seeds
    assert runs.groupby("model.architecture")["training.lr"].nunique().eq(1).all()


def test_best_lr_skips_a_setting_whose_runs_all_failed():
    rows = run_rows("a", config(lr=1e-2), dev=0.9, status="failed", reason="nan loss")
    rows += run_rows("b", config(lr=1e-3), dev=0.2)
    chosen = best_lr(pd.DataFrame(rows))
    assert set(chosen["run"]) == {"b"}


def test_seed_summary_known_numbers():
    df = pd.DataFrame(
        {
            "g": ["a", "a", "a", "b", "c", "c"],
            "run": ["r1", "r2", "r3", "r4", "r5", "r6"],
            "status": ["done", "done", "done", "done", "done", "failed"],
            "value": [1.0, 2.0, 3.0, 5.0, 7.0, np.nan],
        }
    )
    out = seed_summary(df, by=["g"]).set_index("g")
    half = 4.303 * 1.0 / math.sqrt(3)  # sd of (1, 2, 3) is 1
    assert out.loc["a", "mean"] == pytest.approx(2.0)
    assert out.loc["a", "ci"] == pytest.approx(half, rel=1e-4)
    assert out.loc["a", "lo"] == pytest.approx(2.0 - half, rel=1e-4)
    assert out.loc["a", "hi"] == pytest.approx(2.0 + half, rel=1e-4)
    assert out.loc["a", ["n", "runs", "failed"]].tolist() == [3, 3, 0]
    assert out.loc["b", "mean"] == 5.0 and math.isnan(out.loc["b", "ci"])
    assert out.loc["c", ["n", "runs", "failed"]].tolist() == [1, 2, 1]


def seed_summary_one_group_at_a_time(df, by, value="value"):
    """seed_summary as its definition reads: each group filtered out of the table in turn."""
    from mecheval.report.results import grouping_key

    by = list(by)
    status = df["status"] if "status" in df.columns else pd.Series("done", index=df.index)
    frame = pd.DataFrame({"run": df["run"].astype(str), "status": status.astype(str)})
    frame["_v"] = df[value]
    keys = [tuple(grouping_key(v) for v in row) for row in df[by].itertuples(index=False)]
    frame["_g"] = keys
    last_row = dict(zip(keys, df[by].itertuples(index=False, name=None), strict=True))
    records = []
    for group, rows in frame.groupby("_g", sort=False):
        runs = rows.drop_duplicates("run")
        per_run = rows[rows["status"] == "done"].groupby("run")["_v"].mean().dropna()
        n = len(per_run)
        mean = float(per_run.mean()) if n else math.nan
        sd = float(per_run.std(ddof=1)) if n > 1 else math.nan
        ci = t975(n - 1) * sd / math.sqrt(n) if n > 1 else math.nan
        record = dict(zip(by, last_row[group], strict=True))
        failed = int((runs["status"] == "failed").sum())
        record.update(mean=mean, ci=ci, lo=mean - ci, hi=mean + ci, sd=sd, n=n)
        record.update(runs=len(runs), failed=failed)
        records.append(record)
    columns = [*by, "mean", "ci", "lo", "hi", "sd", "n", "runs", "failed"]
    return pd.DataFrame.from_records(records, columns=columns)


@pytest.mark.parametrize("seed", range(6))
def test_seed_summary_equals_its_group_by_group_form_bit_for_bit(seed):
    """On random tables (groups keyed by numbers, missing values and lists; several rows per
    run; failed, running and done runs; missing values): the same frame, every float to the
    bit, groups in order of first appearance."""
    rng = np.random.default_rng(seed)
    n = 400
    df = pd.DataFrame(
        {
            "arch": rng.choice(["mamba", "attention", "h3"], n),
            "step": rng.choice([0, 250, 500, None], n),
            "layers": [[1, 2] if x else None for x in rng.random(n) < 0.3],
            "run": rng.choice([f"r{i}" for i in range(12)], n),
            "status": rng.choice(["done", "done", "done", "failed", "running"], n),
            "value": np.where(rng.random(n) < 0.1, np.nan, rng.normal(50, 20, n)),
        }
    )
    for by in (["arch"], ["arch", "step"], ["layers", "arch"]):
        got = seed_summary(df, by=by)
        pd.testing.assert_frame_equal(
            got, seed_summary_one_group_at_a_time(df, by), check_exact=True
        )
    no_status = df.drop(columns="status")
    pd.testing.assert_frame_equal(
        seed_summary(no_status, by=["arch"]),
        seed_summary_one_group_at_a_time(no_status, ["arch"]),
        check_exact=True,
    )


def test_restore_table_cells(main_table):
    table = restore_table(main_table)
    assert list(table.columns) == [
        "Original",
        "Corrupted",
        "Restored @ key",
        "Restored @ value",
        "Restored @ query",
    ]
    # attention d=32: the three seeds restore at value with 90, 92, 94 %.
    cell = table.loc[("attention", 32)]
    assert cell["Restored @ value"] == pytest.approx(92.0)
    assert cell["Original"] == pytest.approx(95.0)
    assert cell["Restored @ query"] == pytest.approx(4.0)
    # attention d=16: the failed seed is not averaged in -> (90 + 92) / 2.
    assert table.loc[("attention", 16), "Restored @ value"] == pytest.approx(91.0)
    assert table.loc[("mamba", 16), "Restored @ query"] == pytest.approx(92.0)
    text = restore_table(main_table, text=True)
    assert text.loc[("attention", 32), "Restored @ value"] == f"92.0 ± {4.303 * 2 / 3**0.5:.1f}"


def test_restore_table_resolves_last_layer_per_run():
    rows = run_rows("two", config(layers=2), dev=0.9, mech=restore_mech(1, 0, 0, 0.7, 0))
    rows += run_rows(
        "three",
        config(d=64, layers=3),
        dev=0.9,
        mech={
            **restore_mech(1, 0, 0, 0.6, 0, site="layers.2.input"),
            ("layers.1.input", "value"): 0.1,
        },
    )
    table = restore_table(pd.DataFrame(rows))
    assert table.loc[("attention", 32), "Restored @ value"] == pytest.approx(70.0)
    assert table.loc[("attention", 64), "Restored @ value"] == pytest.approx(60.0)


def test_final_restores_come_from_the_full_set_not_the_emergence_sample():
    # At the last step a run has both the emergence sample (dev) and the full
    # post-training interventions (test): the table shows the full set.
    rows = run_rows("r", config(), dev=0.9, mech=restore_mech(0.8, 0.1, 0.1, 0.5, 0.1))
    rows += [
        {**row, "split": "test", "value": row["value"] + 0.1}
        for row in rows
        if row.get("source") == "mechanistic"
    ]
    table = restore_table(pd.DataFrame(rows))
    assert table.loc[("attention", 32), "Restored @ value"] == pytest.approx(60.0)
    assert table.loc[("attention", 32), "Original"] == pytest.approx(90.0)


def test_unhashable_config_values_are_grouped():
    # The store flattens an empty options block (``mixer: {}``) to a dict value.
    rows = run_rows("a", config(**{"model.mixer": {}}), dev=0.9, mech=restore_mech(1, 0, 0, 0.5, 0))
    rows += run_rows("b", config(seed=1, **{"model.mixer": {}}), dev=0.9,
                     mech=restore_mech(1, 0, 0, 0.7, 0))  # fmt: skip
    table = restore_table(pd.DataFrame(rows))
    assert table.loc[("attention", 32), "Restored @ value"] == pytest.approx(60.0)


def test_normalise_handles_csv_round_trip(main_table, tmp_path):
    path = tmp_path / "results.csv"
    main_table.to_csv(path, index=False)
    again = restore_table(pd.read_csv(path))
    pd.testing.assert_frame_equal(again, restore_table(main_table), check_dtype=False)


# ---------------------------------------------------------------------------- figures


def numbers(markdown: str) -> list[str]:
    return re.findall(r"\d+\.\d", markdown)


def test_ar_restore_figure(main_table):
    result = FIGURES["ar-restore"](main_table)
    assert isinstance(result, FigureResult) and isinstance(result.figure, Figure)
    assert result.name == "ar-restore"
    md = result.markdown
    assert "92.0 ± 5.0" in md  # attention d=32 restored @ value (t_2 * 2 / sqrt 3 = 4.97)
    assert "91.0 ± 12.7" in md  # attention d=16: two seeds, 90 and 92
    assert "Failed runs: 1 of 24" in md
    assert "attention-d16-lr0.001-s2" in md and "diverged" in md
    data = result.data
    cell = data[(data["panel"] == "Restored @ value") & (data["row"] == "Attention")]
    assert sorted(cell["mean"].round(3)) == [91.0, 92.0]
    # Panels in the paper's order and each drawn.
    assert [ax.get_title() for ax in result.figure.axes[:5]] == [
        "Original",
        "Corrupted",
        "Restored @ key",
        "Restored @ value",
        "Restored @ query",
    ]
    texts = [t.get_text() for ax in result.figure.axes for t in ax.texts]
    assert "92.0\n±5.0" in texts


def test_missing_condition_gives_empty_cell(main_table):
    drop = (main_table["model.architecture"] == "mamba") & (main_table["role"] == "key")
    result = FIGURES["ar-restore"](main_table[~drop])
    data = result.data
    key = data[(data["panel"] == "Restored @ key") & (data["row"] == "Mamba")]
    assert key["mean"].isna().all() and (key["runs"] > 0).all()
    assert "| Mamba |  |  |" in result.markdown


def test_figure_errors_are_one_line(main_table):
    with pytest.raises(ConfigError, match=r"^figure atr-restore: no ATR runs") as err:
        FIGURES["atr-restore"](main_table)
    assert "\n" not in str(err.value)
    behavioural = main_table[main_table["source"] != "mechanistic"]
    with pytest.raises(ConfigError, match="figure ar-restore: no AR runs with interventions"):
        FIGURES["ar-restore"](behavioural)
    with pytest.raises(ConfigError, match="figure ar-restore: the results table is empty"):
        FIGURES["ar-restore"](main_table.iloc[0:0])
    for name in ("conv-ablation", "pos-emb", "generalisation", "one-layer", "layer-count"):
        with pytest.raises(ConfigError, match=f"^figure {name}: "):
            FIGURES[name](main_table)


def test_conv_ablation_figure():
    rows = []
    for conv, acc in ((None, 0.01), (1, 0.02), (2, 0.6), (4, 0.9)):
        for d in (16, 32):
            cfg = config("mamba", d, **{"model.mixer.d_conv": conv})
            mech = restore_mech(acc, 0.01, 0.02, 0.03, acc)
            rows += run_rows(f"m-{conv}-{d}", cfg, dev=acc, accuracy=acc, mech=mech)
    for variant, acc in (("k2", 0.97), ("k1", 0.03), ("long", 0.05)):
        cfg = config(
            "based",
            32,
            **{
                "model.mixer.long_conv": variant == "long",
                "model.mixer.kernel_size": {"k2": 2, "k1": 1, "long": np.nan}[variant],
            },
        )
        rows += run_rows(f"b-{variant}", cfg, dev=acc, accuracy=acc)
    result = FIGURES["conv-ablation"](pd.DataFrame(rows))
    md = result.markdown
    assert "(a) Mamba" in md and "(b) Based" in md
    assert "| none | 1.0 | 1.0 |" in md  # accuracy panel, no conv
    assert "| 2 | 60.0 | 60.0 |" in md
    assert "| short, k=2 |  | 97.0 |" in md or "| short, k=2 | 97.0 |" in md
    assert "| long conv | 5.0 |" in md
    mamba_rows = result.data[result.data["section"].str.startswith("(a)")]["row"]
    assert list(dict.fromkeys(mamba_rows)) == ["none", "1", "2", "4"]


def test_mamba_conv_sites_figure_shows_every_lr():
    rows = []
    s0, s1 = "layers.0.mixer.conv.output", "layers.1.mixer.conv.output"
    for lr, nk in ((1e-2, 0.80), (1e-3, 0.40)):
        for seed in (0, 1):
            mech = {
                "original": 0.85,
                "corrupted": 0.03,
                (s0, "value"): 0.04,
                (s0, "next_key"): nk + 0.02 * seed,
                (s1, "value"): 0.05,
            }
            rows += run_rows(f"m{lr}-{seed}", config("mamba", 64, lr, seed), dev=0.8, mech=mech)
    rows += run_rows("m3e-2", config("mamba", 64, 3e-2), dev=0, status="failed", reason="nan")
    result = FIGURES["mamba-conv-sites"](pd.DataFrame(rows))
    md = result.markdown
    assert "**Restored @ 0, next key** (%)" in md
    assert "| 1e-02 | 81.0 ± 12.7 |" in md
    assert "| 1e-03 | 41.0 ± 12.7 |" in md
    assert "| 3e-02 |  |" in md  # the failed LR is an empty cell
    assert "Failed runs: 1 of 5" in md


def test_atr_figures(main_table):
    atr = main_table.assign(**{"task.kind": "atr", "task.query": "parent"})
    assert "92.0 ± 5.0" in FIGURES["atr-restore"](atr).markdown
    rows = []
    for conv, value in ((None, 0.7), (2, 0.1), (4, 0.05)):
        cfg = config("mamba", 32, kind="atr", **{"model.mixer.d_conv": conv})
        rows += run_rows(f"m{conv}", cfg, dev=0.8, mech=restore_mech(0.8, 0.3, 0.1, value, 0.2))
    md = FIGURES["atr-mamba-conv"](pd.DataFrame(rows)).markdown
    value_table = md.split("**Restored @ value** (%)")[1]
    assert "| none | 70.0 |" in value_table and "| 4 | 5.0 |" in value_table


def test_pos_emb_figure():
    rows = []
    for kind in ("ar", "atr"):
        for pe, acc in ((True, 1.0), (False, 0.0562)):
            cfg = config("attention", 256, kind=kind, **{"model.position_embedding": pe})
            rows += run_rows(f"{kind}-{pe}", cfg, dev=0.5, accuracy=acc)
    md = FIGURES["pos-emb"](pd.DataFrame(rows)).markdown
    assert "### AR" in md and "### ATR" in md
    assert "**PE, accuracy** (%)" in md and "| Attention | 100.0 |" in md
    assert "**NoPE, accuracy** (%)" in md and "| Attention | 5.6 |" in md


def test_generalisation_figure_picks_best_by_dev_accuracy():
    rows = []
    for lr, dev_acc, test_acc in ((1e-3, 0.9562, 0.6812), (1e-2, 0.5, 0.9)):
        cfg = config("attention", 256, lr, kind="atr", **{"task.split": 0.2})
        rows += run_rows(f"a{lr}", cfg, dev=0.1, test=test_acc, accuracy=dev_acc)
    rows += run_rows("plain", config("attention", 256, kind="atr"), dev=0.99)
    result = FIGURES["generalisation"](pd.DataFrame(rows))
    md = result.markdown
    assert "**Dev accuracy** (%)" in md and "| Attention | 95.6 |" in md
    assert "**Test accuracy** (%)" in md and "| Attention | 68.1 |" in md
    assert "Runs: 2 " in md  # the run without a split is not part of this figure


def test_layer_figures():
    rows = []
    for layers in (1, 2, 3):
        for arch, acc in (("mamba", 0.96 - 0.05 * (layers - 1)), ("attention", 0.05 * layers)):
            mech = {"original": acc, "corrupted": 0.01}
            for i in range(layers):
                mech[(f"layers.{i}.mixer.output", "query")] = acc if i == 0 else 0.02
            for kind in ("ar", "atr"):
                cfg = config(arch, 256, kind=kind, layers=layers)
                rows += run_rows(f"{kind}-{arch}-{layers}", cfg, dev=acc, accuracy=acc, mech=mech)
    df = pd.DataFrame(rows)
    md = FIGURES["one-layer"](df).markdown
    assert "**Accuracy, 1 layer** (%)" in md and "| Mamba | 96.0 |" in md
    assert "**Accuracy, 2 layers** (%)" in md and "| Mamba | 91.0 |" in md
    assert "Restored @ query, mixer output, 1 layer" in md
    lc = FIGURES["layer-count"](df)
    assert "### 3 layers" in lc.markdown
    assert "**Restored @ query, layer 2 mixer** (%)" in lc.markdown
    three = lc.data[(lc.data["section"] == "3 layers") & (lc.data["row"] == "Mamba")]
    got = dict(zip(three["panel"], three["mean"], strict=True))
    assert got["Accuracy"] == pytest.approx(86.0)
    assert got["Restored @ query, layer 0 mixer"] == pytest.approx(86.0)
    assert got["Restored @ query, layer 1 mixer"] == pytest.approx(2.0)


def test_sibling_figure():
    rows = []
    for layers in (1, 2):
        cfg = config("hyena", 64, kind="atr", layers=layers, **{"task.query": "sibling"})
        rows += run_rows(f"s{layers}", cfg, dev=0.8, accuracy=0.8 + 0.1 * layers)
    rows += run_rows("p", config("hyena", 64, kind="atr", **{"task.query": "parent"}), dev=0.2)
    md = FIGURES["sibling"](pd.DataFrame(rows)).markdown
    assert "**Accuracy, 1 layer** (%)" in md and "| Hyena | 90.0 |" in md
    assert "**Accuracy, 2 layers** (%)" in md and "| Hyena | 100.0 |" in md


def test_emergence_figure():
    rows = []
    for seed in (0, 1):
        rows += run_rows(
            f"e{seed}",
            config("attention", 32, seed=seed),
            dev=0.9,
            mech=restore_mech(0.9, 0.1, 0.1, 0.8 + 0.02 * seed, 0.1),
            steps=(100, 200),
            mech_steps=(100, 200),
        )
    result = FIGURES["emergence"](pd.DataFrame(rows))
    data = result.data.set_index(["measure", "step"])
    assert data.loc[("Restored @ value", 200), "mean"] == pytest.approx(81.0)
    assert data.loc[("Restored @ value", 100), "mean"] == pytest.approx(40.5)
    assert "| 32 | 200 | 90.0 ± 0.0 | 10.0 ± 0.0 | 10.0 ± 0.0 | 81.0 ± 12.7 |" in result.markdown
    assert isinstance(result.figure, Figure) and len(result.figure.axes) == 1
    # The title names the runs' actual site (2 layers: layers.1), not the template
    # layers.{last}.input, and says it in words.
    title = " ".join(result.figure.get_suptitle().split())
    assert title == (
        "emergence: restored likelihood at layers.1.input (the last layer's input) over training"
    )
    with pytest.raises(ConfigError, match="^figure emergence: no runs with interventions at two"):
        FIGURES["emergence"](pd.DataFrame(rows[: len(rows) // 2]).assign(step=200))


def test_emergence_of_seven_architectures_at_one_width_is_a_grid_of_distinct_curves():
    archs = ["mamba", "hyena", "h3", "deltanet", "based", "baseconv", "attention"]
    rows = []
    for arch in archs:
        # Equal restores (corrupted = @ key = @ query): the lines lie on each other.
        rows += run_rows(
            arch,
            config(arch, 64),
            dev=0.9,
            mech=restore_mech(0.9, 0.1, 0.1, 0.8, 0.1),
            steps=(100, 200),
            mech_steps=(100, 200),
        )
    figure = FIGURES["emergence"](pd.DataFrame(rows)).figure
    shown = [ax for ax in figure.axes if ax.get_visible()]
    assert len(shown) == 7  # one panel per architecture ...
    rows_of = sorted({round(ax.get_position().y0, 3) for ax in shown})
    assert len(rows_of) == 2  # ... in two rows of up to four, not one column of seven
    assert [ax.get_title().split(",")[0] for ax in shown][:2] == ["AR Mamba", "AR Hyena"]
    lines = shown[0].get_lines()
    assert len(lines) == 5
    # Each measure drawn its own way: equal curves stay visible as different dashes and marks.
    assert len({(str(line.get_linestyle()), line.get_marker()) for line in lines}) == 5
    assert len(figure.legends) == 1 and len(figure.legends[0].get_texts()) == 5


def test_restore_titles_name_the_actual_sites():
    rows = []
    for layers in (2, 3):
        site = f"layers.{layers - 1}.input"
        mech = restore_mech(0.9, 0.1, 0.1, 0.8, 0.1, site)
        rows += run_rows(f"l{layers}", config("attention", 32, layers=layers), dev=0.9, mech=mech)
    table = pd.DataFrame(rows)
    # Each run's own last layer, both named: a reader finds them in the results table.
    assert site_title(table, "layers.{last}.input") == (
        "layers.1.input, layers.2.input (the last layer's input)"
    )
    result = FIGURES["ar-restore"](table)  # the figure keeps the standard depth, 2 layers
    title = " ".join(result.figure.get_suptitle().split())
    assert title.endswith("restored at layers.1.input (the last layer's input)"), title
    assert "{last}" not in result.markdown and title in " ".join(result.markdown.split())


def test_available_figures_skips_irrelevant_ones(main_table):
    results, skipped = available_figures(main_table)
    assert [r.name for r in results] == ["ar-restore"]
    assert set(skipped) == set(FIGURES) - {"ar-restore"}
    assert all("\n" not in why for why in skipped.values())


# ---------------------------------------------------------------------------- files


def test_write_figure_and_html(main_table, tmp_path):
    result = FIGURES["ar-restore"](main_table)
    paths = write_figure(result, tmp_path / "out")
    assert sorted(p.name for p in paths) == ["ar-restore.md", "ar-restore.pdf", "ar-restore.png"]
    assert (tmp_path / "out" / "ar-restore.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "out" / "ar-restore.pdf").read_bytes()[:4] == b"%PDF"
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]
    page = write_html(main_table, tmp_path / "report.html").read_text()
    assert "data:image/png;base64,iVBOR" in page
    assert not re.search(r"""(src|href)=["'](?!data:|#)""", page)
    assert "<table>" in page and "92.0 ± 5.0" in page
    assert "Figures without data" in page
    assert page.index("<h2>Contents</h2>") < page.index('<section id="ar-restore">')
    caption = html.escape(result.caption)
    assert result.caption.startswith("Where restoring one role") and caption in page


def test_a_figure_written_and_inlined_is_encoded_once_per_format(main_table, tmp_path):
    # The report writes each PNG to a file and into the HTML page: the page holds the file's
    # bytes, and each format is encoded once (encoding is most of a report's time).
    result = FIGURES["ar-restore"](main_table)
    calls: list[str] = []
    savefig = result.figure.savefig

    def counted(buffer, *, format: str, dpi: int) -> None:
        calls.append(format)
        savefig(buffer, format=format, dpi=dpi)

    result.figure.savefig = counted
    write_figure(result, tmp_path)
    page = render_html([result])
    png = (tmp_path / "ar-restore.png").read_bytes()
    assert base64.b64encode(png).decode("ascii") in page
    assert calls == ["png", "pdf"]


# ---------------------------------------------------------------------------- CLI


def test_cli_with_table(main_table, tmp_path, monkeypatch, capsys):
    table = tmp_path / "results.csv"
    main_table.to_csv(table, index=False)
    out_dir = tmp_path / "rep"
    code, out, _ = run_cli(
        monkeypatch, capsys, "report", "--table", str(table), "--out", str(out_dir), "--html"
    )
    assert code == 0
    assert "92.0 ± 5.0" in out
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == ["ar-restore.md", "ar-restore.pdf", "ar-restore.png", "report.html"]


def test_cli_unknown_figure_is_one_line(main_table, tmp_path, monkeypatch, capsys):
    table = tmp_path / "results.csv"
    main_table.to_csv(table, index=False)
    code, out, err = run_cli(monkeypatch, capsys, "report", "--table", str(table), "-f", "nope")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "unknown figure 'nope'" in lines[0] and "ar-restore" in lines[0]


def test_cli_loads_experiment_dir(main_table, tmp_path, monkeypatch, capsys):
    import mecheval.cli.report as cli_report

    seen = []

    def fake(paths: list[Path]) -> pd.DataFrame:
        seen.append(paths)
        return main_table

    monkeypatch.setattr(cli_report, "load_results", fake)
    code, out, _ = run_cli(
        monkeypatch, capsys, "report", str(tmp_path), "--figure", "ar-restore", "--format", "png"
    )
    assert code == 0 and seen == [[tmp_path]]
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == [
        "ar-restore.md",
        "ar-restore.png",
    ]
    code, _, err = run_cli(monkeypatch, capsys, "report", str(tmp_path), "-f", "pos-emb")
    assert code == 2 and err.startswith("error: figure pos-emb: needs runs with and without")


def test_normalise_is_idempotent(main_table):
    once = normalise(main_table)
    assert normalise(once) is once
    assert (once["condition"] == "").sum() > 0
