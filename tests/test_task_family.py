"""The task family of issue #14 beyond AR and ATR: noisy AR (tasks/noisy_ar.py). Each document
is checked against a naive reading of its tokens, the roles against the tokens they name,
corruption against the one token it may change, the generators against their seeds, and the
noise fraction against binomial bounds."""

from __future__ import annotations

import math

import pytest
import torch

from mecheval.errors import ConfigError
from mecheval.tasks import SPLITS, build_datasets, corrupt, get_task, parse_task, token_names
from mecheval.tasks.noisy_ar import NoisyARConfig
from mecheval.tasks.vocab import BOS, DIV, N_SPECIAL


def names_of(cfg, ids: list[int]) -> list[str]:
    names = token_names(cfg)
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
        assert token_names(cfg)[int(ds.answer[i])] == want
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
    lo, hi = get_task("noisy_ar").key_class(cfg)
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
    names = token_names(cfg)
    assert len(names) == N_SPECIAL + cfg.n_keys + cfg.n_values + cfg.n_noise
    assert names[N_SPECIAL] == "k0" and names[-1] == f"n{cfg.n_noise - 1}"
    ds = build_datasets(cfg)["test"]
    assert bool((ds.tokens[:, 0] == BOS).all())
    assert bool((ds.tokens[:, 2 * cfg.n_slots + 1] == DIV).all())
    assert get_task("noisy_ar").max_length(cfg) == ds.tokens.shape[1]


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


@pytest.mark.parametrize("kind", ["noisy_ar"])
def test_task_show_and_stats(kind: str, monkeypatch, capsys) -> None:
    from small_runs import run_cli

    code, out, _ = run_cli(monkeypatch, capsys, "task", "show", kind, "-n", "3")
    assert code == 0, out
    assert out.count("<bos>") == 3 and "[key" in out and "[query:" in out
    code, out, _ = run_cli(monkeypatch, capsys, "task", "stats", kind, "-n", "200")
    assert code == 0, out
    assert "noise fraction" in out
