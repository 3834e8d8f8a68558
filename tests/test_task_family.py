"""The task family of issue #14 beyond AR and ATR: noisy AR (tasks/noisy_ar.py) and overwrite AR
(tasks/overwrite_ar.py). Each document is checked against a naive reading of its tokens, the
roles against the tokens they name, corruption against the one token it may change, the
generators against their seeds, and the noise fraction against binomial bounds."""

from __future__ import annotations

import math

import pytest
import torch

from mecheval.errors import ConfigError
from mecheval.tasks import ROLES, SPLITS, build_datasets, corrupt, get_task, parse_task
from mecheval.tasks.noisy_ar import NoisyARConfig
from mecheval.tasks.overwrite_ar import OverwriteARConfig
from mecheval.tasks.vocab import BOS, DIV, N_SPECIAL


def names_of(cfg, ids: list[int]) -> list[str]:
    names = cfg.id_names()
    return [names[i] for i in ids]


# ---------------------------------------------------------------------------------- noisy AR
def noisy_cfg(**kw) -> NoisyARConfig:
    base = {"n_keys": 12, "n_values": 10, "n_noise": 5, "n_slots": 6, "noise_fraction": 0.4}
    base.update({"n_train": 300, "n_dev": 40, "n_test": 40})
    base.update(kw)
    return NoisyARConfig(**base)


def test_noisy_ar_answers_and_roles_by_a_naive_reading() -> None:
    cfg = noisy_cfg()
    ds = build_datasets(cfg)["train"]
    for i in range(len(ds)):
        doc = names_of(cfg, ds.document(i))
        s = cfg.n_slots
        assert len(doc) == 2 * s + 3 and doc[0] == "<bos>" and doc[-2] == "<div>"
        slots = [doc[1 + 2 * j : 3 + 2 * j] for j in range(s)]
        pairs = [(a, b) for a, b in slots if a[0] == "k"]
        # Every slot is a key-value pair or two noise tokens; at least one is a pair.
        for a, b in slots:
            assert (a[0], b[0]) in {("k", "v"), ("n", "n")}, slots
        assert pairs
        keys, values = [k for k, _ in pairs], [v for _, v in pairs]
        assert len(set(keys)) == len(keys) and len(set(values)) == len(values)
        query = doc[-1]
        want = dict(pairs)[query]  # the value after the one in-context copy of the query
        assert cfg.id_names()[int(ds.answer[i])] == want
        roles = {r: int(p[i]) for r, p in ds.roles.items()}
        assert doc[roles["key"]] == query and doc[roles["value"]] == want
        assert roles["value"] == roles["key"] + 1 and roles["next_key"] == roles["key"] + 2
        assert doc[roles["divider"]] == "<div>" and roles["query"] == len(doc) - 1
        assert int(ds.extras["noise_slots"][i]) == s - len(pairs)


def test_noisy_ar_corruption_changes_only_the_key_to_an_absent_key() -> None:
    cfg = noisy_cfg()
    batch = build_datasets(cfg)["dev"].batch(torch.arange(40))
    bad = corrupt(batch, cfg, seed=7)
    rows = torch.arange(40)
    changed = (bad.tokens != batch.tokens).nonzero()
    assert torch.equal(changed[:, 0], rows) and torch.equal(changed[:, 1], batch.roles["key"])
    new = bad.tokens[rows, batch.roles["key"]]
    lo, hi = cfg.key_class()
    assert (lo, hi) == (N_SPECIAL, N_SPECIAL + cfg.n_keys)
    assert bool(((new >= lo) & (new < hi)).all())
    assert bool(((batch.tokens == new[:, None]).sum(1) == 0).all())  # absent before
    assert torch.equal(corrupt(batch, cfg, seed=7).tokens, bad.tokens)


def test_noisy_ar_is_a_function_of_its_seed() -> None:
    a, b = build_datasets(noisy_cfg()), build_datasets(noisy_cfg())
    other = build_datasets(noisy_cfg(seed=1))
    for split in SPLITS:
        assert torch.equal(a[split].tokens, b[split].tokens)
        assert torch.equal(a[split].answer, b[split].answer)
    assert not torch.equal(a["train"].tokens, other["train"].tokens)


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.7])
def test_noisy_ar_noise_fraction_within_binomial_bounds(fraction: float) -> None:
    # One slot per document is always a pair; each of the other S - 1 is noise with
    # probability f, independently: the count is Binomial(n (S - 1), f).
    cfg = noisy_cfg(noise_fraction=fraction, n_slots=8, n_train=5000, n_dev=0, n_test=0)
    ds = build_datasets(cfg)["train"]
    tokens = ds.tokens[:, 1 : 1 + 2 * cfg.n_slots].reshape(len(ds), cfg.n_slots, 2)
    lo_noise = N_SPECIAL + cfg.n_keys + cfg.n_values
    is_noise = tokens >= lo_noise
    assert torch.equal(is_noise[:, :, 0], is_noise[:, :, 1])  # noise comes in whole slots
    assert bool((is_noise[:, :, 0].sum(1) < cfg.n_slots).all())  # never all noise
    trials = len(ds) * (cfg.n_slots - 1)
    count = int(is_noise[:, :, 0].sum())
    mean, sd = trials * fraction, math.sqrt(trials * fraction * (1 - fraction))
    assert abs(count - mean) <= 5 * sd, (count, mean, sd)
    # Noise ids are uniform over the noise vocabulary (each id within 5 sd of its share).
    ids = tokens[is_noise] - lo_noise
    if len(ids):
        counts = torch.bincount(ids, minlength=cfg.n_noise).double()
        p = 1 / cfg.n_noise
        sd_id = math.sqrt(len(ids) * p * (1 - p))
        assert bool(((counts - len(ids) * p).abs() <= 5 * sd_id).all()), counts


def test_noisy_ar_layout_and_vocabulary() -> None:
    cfg = noisy_cfg()
    names = cfg.id_names()
    assert len(names) == N_SPECIAL + cfg.n_keys + cfg.n_values + cfg.n_noise
    assert names[N_SPECIAL] == "k0" and names[-1] == f"n{cfg.n_noise - 1}"
    ds = build_datasets(cfg)["test"]
    assert bool((ds.tokens[:, 0] == BOS).all())
    assert bool((ds.tokens[:, 2 * cfg.n_slots + 1] == DIV).all())
    assert cfg.max_length() == ds.tokens.shape[1]


@pytest.mark.parametrize(
    ("data", "field", "says"),
    [
        ({"noise_fraction": 1.0}, "task.noise_fraction", "0 <= noise_fraction < 1"),
        ({"noise_fraction": -0.01}, "task.noise_fraction", "0 <= noise_fraction < 1"),
        ({"n_slots": 11, "n_keys": 12, "n_values": 10}, "task.n_slots", "1..10"),
        ({"n_slots": 0}, "task.n_slots", "greater than or equal to 1"),
        ({"n_noise": 0}, "task.n_noise", "greater than or equal to 1"),
    ],
)
def test_noisy_ar_impossible_parameters(data: dict, field: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_task({"kind": "noisy_ar", **data})
    message = str(err.value)
    assert "\n" not in message and message.startswith(field) and says in message, message


# ------------------------------------------------------------------------------ overwrite AR
def overwrite_cfg(**kw) -> OverwriteARConfig:
    base = {"n_keys": 9, "n_values": 11, "n_pairs": 5, "n_updates": 3, "query_updated": 1.0}
    base.update({"n_train": 300, "n_dev": 40, "n_test": 40})
    base.update(kw)
    return OverwriteARConfig(**base)


@pytest.mark.parametrize("share", [1.0, 0.5, 0.0])
def test_overwrite_ar_answer_is_the_latest_value_by_a_naive_reading(share: float) -> None:
    cfg = overwrite_cfg(query_updated=share)
    ds = build_datasets(cfg)["train"]
    assert set(ds.roles) == {*ROLES, "stale_key", "stale_value"}
    twice_count = 0
    for i in range(len(ds)):
        doc = names_of(cfg, ds.document(i))
        slots = cfg.n_pairs + cfg.n_updates
        assert len(doc) == 2 * slots + 3 and doc[-2] == "<div>"
        pairs = [(doc[1 + 2 * j], doc[2 + 2 * j]) for j in range(slots)]
        assert all(k[0] == "k" and v[0] == "v" for k, v in pairs)
        firsts = [k for k, _ in pairs[: cfg.n_pairs]]
        updates = [k for k, _ in pairs[cfg.n_pairs :]]
        assert len(set(firsts)) == cfg.n_pairs  # distinct keys, then some of them again
        assert len(set(updates)) == cfg.n_updates and set(updates) <= set(firsts)
        assert len({v for _, v in pairs}) == slots  # every value distinct
        query = doc[-1]
        latest = dict(pairs)[query]  # a dict keeps the last value written: latest wins
        assert cfg.id_names()[int(ds.answer[i])] == latest
        occurrences = [2 * j + 1 for j, (k, _) in enumerate(pairs) if k == query]
        roles = {r: int(p[i]) for r, p in ds.roles.items()}
        assert roles["key"] == occurrences[-1] and roles["stale_key"] == occurrences[0]
        assert doc[roles["value"]] == latest and roles["value"] == roles["key"] + 1
        assert roles["stale_value"] == roles["stale_key"] + 1
        assert roles["next_key"] == roles["key"] + 2
        assert doc[roles["divider"]] == "<div>" and roles["query"] == len(doc) - 1
        twice = len(occurrences) == 2
        assert int(ds.extras["overwritten"][i]) == twice
        if twice:
            # The stale and the latest value differ; the answer is the latest.
            assert doc[roles["stale_value"]] != doc[roles["value"]]
            assert roles["stale_key"] < roles["key"]
            twice_count += 1
    if share == 1.0:
        assert twice_count == len(ds)
    elif share == 0.0:
        assert twice_count == 0
    else:  # Binomial(300, 0.5): within 5 sd
        assert abs(twice_count - 150) <= 5 * math.sqrt(75)


def test_overwrite_ar_corrupts_only_the_latest_key_occurrence() -> None:
    cfg = overwrite_cfg()
    batch = build_datasets(cfg)["dev"].batch(torch.arange(40))
    assert set(batch.roles) >= {"stale_key", "stale_value"}
    bad = corrupt(batch, cfg, seed=3)
    rows = torch.arange(40)
    changed = (bad.tokens != batch.tokens).nonzero()
    assert torch.equal(changed[:, 0], rows) and torch.equal(changed[:, 1], batch.roles["key"])
    new = bad.tokens[rows, batch.roles["key"]]
    assert bool(((new >= N_SPECIAL) & (new < N_SPECIAL + cfg.n_keys)).all())
    assert bool(((batch.tokens == new[:, None]).sum(1) == 0).all())
    # The stale occurrence still holds the query key.
    stale = bad.tokens[rows, batch.roles["stale_key"]]
    assert torch.equal(stale, bad.tokens[rows, batch.roles["query"]])


def test_overwrite_ar_is_a_function_of_its_seed_and_keeps_its_roles_in_the_cache(tmp_path) -> None:
    a, b = build_datasets(overwrite_cfg()), build_datasets(overwrite_cfg(), tmp_path)
    cached = build_datasets(overwrite_cfg(), tmp_path)  # loaded back from the file
    other = build_datasets(overwrite_cfg(seed=2))
    for split in SPLITS:
        for ds in (b[split], cached[split]):
            assert torch.equal(a[split].tokens, ds.tokens)
            assert torch.equal(a[split].answer, ds.answer)
            assert a[split].roles.keys() == ds.roles.keys()
            assert all(torch.equal(a[split].roles[r], ds.roles[r]) for r in a[split].roles)
    assert not torch.equal(a["train"].tokens, other["train"].tokens)


@pytest.mark.parametrize(
    ("data", "field", "says"),
    [
        ({"n_pairs": 10, "n_keys": 9}, "task.n_pairs", "1..9"),
        ({"n_pairs": 5, "n_values": 8, "n_updates": 4}, "task.n_updates", "1..3"),
        ({"n_pairs": 3, "n_updates": 4}, "task.n_updates", "1..3"),
        ({"n_updates": 0}, "task.n_updates", "greater than or equal to 1"),
        ({"query_updated": 1.5}, "task.query_updated", "0 <= query_updated <= 1"),
        ({"query_updated": -0.5}, "task.query_updated", "0 <= query_updated <= 1"),
        ({"n_pairs": 4, "n_updates": 4, "query_updated": 0.5}, "task.query_updated", "n_updates"),
    ],
)
def test_overwrite_ar_impossible_parameters(data: dict, field: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_task({"kind": "overwrite_ar", **data})
    message = str(err.value)
    assert "\n" not in message and message.startswith(field) and says in message, message


# ------------------------------------------------------------------------------- both, CLI
@pytest.mark.parametrize("kind", ["noisy_ar", "overwrite_ar"])
def test_task_show_and_stats(kind: str, monkeypatch, capsys) -> None:
    from small_runs import run_cli

    code, out, _ = run_cli(monkeypatch, capsys, "task", "show", kind, "-n", "3")
    assert code == 0, out
    assert out.count("<bos>") == 3 and "[key" in out and "[query:" in out
    if kind == "overwrite_ar":
        assert "stale_key" in out and "overwrites v" in out
    code, out, _ = run_cli(monkeypatch, capsys, "task", "stats", kind, "-n", "200")
    assert code == 0, out
    assert ("noise fraction" if kind == "noisy_ar" else "stale-latest key distance") in out


def test_overwrite_ar_trains_and_restores_at_its_stale_roles(tmp_path) -> None:
    from mecheval.experiments.mechanisms import InterventionPlan, intervene_run
    from mecheval.training.config import config_from_data, resolve
    from mecheval.training.presets import preset
    from mecheval.training.run import train

    cfg = resolve(config_from_data(preset("tiny", "overwrite_ar", "attention"), ["name=o"]))
    assert train(cfg, tmp_path / "o")["state"] == "done"
    measured = intervene_run(tmp_path / "o", InterventionPlan(split="dev"))
    assert measured is not None
    roles = list(dict.fromkeys(measured.rows["role"].dropna()))
    nulls = [f"null {i}" for i in range(1, 6)]  # positions that play no role, after the roles
    assert [r for r in roles if r] == [*ROLES, "stale_key", "stale_value", *nulls]


@pytest.mark.parametrize("make", [noisy_cfg, overwrite_cfg], ids=["noisy_ar", "overwrite_ar"])
def test_answer_candidates_are_the_documents_values_by_a_naive_reading(make) -> None:
    cfg = make()
    batch = build_datasets(cfg)["dev"].batch(torch.arange(40))
    names = cfg.id_names()
    for b in range(40):
        context = batch.tokens[b, : int(batch.roles["divider"][b])].tolist()
        values = {t for t in context if names[t].startswith("v")}
        assert values and set(batch.candidates[b].nonzero().flatten().tolist()) == values
        assert int(batch.answer[b]) in values


def test_the_ar_family_trains_with_ars_recipe() -> None:
    """One recipe for AR's family: the paper's epochs and LR grid, and the quick preset's
    learning rate of every architecture, are AR's for each of its tasks."""
    from mecheval.models.registry import ARCHITECTURES
    from mecheval.training.presets import preset

    ar = get_task("ar")
    family = ["noisy_ar", "overwrite_ar", "mqar", "compositional_mqar"]
    for kind in family:
        task = get_task(kind)
        assert (task.default_epochs, task.paper_lrs) == (ar.default_epochs, ar.paper_lrs)
        assert task.corrupt_to_absent
        for arch in ARCHITECTURES:
            quick = preset("quick", kind, arch)["training"]["lr"]
            assert quick == preset("quick", "ar", arch)["training"]["lr"], (kind, arch)
    assert any(preset("quick", "ar", a)["training"]["lr"] != 1e-3 for a in ARCHITECTURES)
    assert get_task("atr").paper_lrs != ar.paper_lrs  # ATR keeps its own (§5)


def test_quick_epochs_per_architecture_apply_to_their_task_kind_only() -> None:
    """Mamba trains AR two epochs at quick; the rest of AR's family keeps each task's own
    quick epochs for Mamba too, and every other architecture keeps AR's."""
    from mecheval.models.registry import ARCHITECTURES
    from mecheval.training.presets import QUICK_EPOCHS, preset

    assert QUICK_EPOCHS["ar"] == {"mamba": 2}
    ar = get_task("ar")
    assert preset("quick", "ar", "mamba")["training"]["epochs"] == 2 != ar.quick_epochs
    for arch in ARCHITECTURES:
        if arch != "mamba":
            assert preset("quick", "ar", arch)["training"]["epochs"] == ar.quick_epochs, arch
    for kind in ("noisy_ar", "overwrite_ar", "mqar", "compositional_mqar", "atr"):
        epochs = preset("quick", kind, "mamba")["training"]["epochs"]
        assert epochs == get_task(kind).quick_epochs, kind
    assert preset("paper", "ar", "mamba")["training"]["epochs"] == ar.default_epochs
