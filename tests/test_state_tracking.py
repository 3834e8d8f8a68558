"""State tracking (parity, S3): generators checked by recomputation, bad parameters as one
line, and the label rules on hand-built models with known mechanisms.

The hand-built models are 2-layer models whose mixers are written here: a recurrence that
carries the parity in its state (a recurrent state site, as Mamba's), a mixer that reads every
element from the query and has no state (as attention can), and an inert one. Where the parity
is computed decides the label: a state that carries it reads ``in the state after it`` (in
either layer), a last layer that reads the elements without a state ``at the element``, and a
first layer that composes the answer at the query ``only at the query``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from mecheval.errors import ConfigError
from mecheval.interventions import interchange, label_mechanism
from mecheval.models import ModelConfig, build_model
from mecheval.models.mixers.base import Mixer
from mecheval.models.sites import name_sites, state_site_names
from mecheval.tasks import build_datasets, corrupt, parse_task
from mecheval.tasks.readings import STATE_TRACKING
from mecheval.tasks.scores import chance_level
from mecheval.tasks.state_tracking import running_states
from mecheval.tasks.vocab import BOS, N_SPECIAL


def task(kind: str = "parity", **fields):
    data = {"kind": kind, "max_elements": 8, "min_elements": 3, "n_train": 64, "n_dev": 64}
    return parse_task({**data, "n_test": 64, **fields})


# ------------------------------------------------------------------------------- generators


@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_parity_answers_are_the_count_of_ones_mod_2(split: str) -> None:
    cfg = task()
    docs = build_datasets(cfg)[split]
    names = cfg.id_names()
    for i in range(len(docs)):
        tokens, n = docs.tokens[i], int(docs.lengths[i]) - 1
        assert tokens[0] == BOS and bool((tokens[n + 1 :] == 0).all())
        bits = [names[int(t)] for t in tokens[1 : n + 1]]
        assert set(bits) <= {"0", "1"}
        assert names[int(docs.answer[i])] == ("odd" if bits.count("1") % 2 else "even")
        assert int(docs.roles["query"][i]) == n and 1 <= int(docs.roles["key"][i]) < n
        lo, hi = (8, 8) if split == "train" else (3, 8)
        assert lo <= n <= hi
    if split == "train":  # dense: the parity of every prefix, at every element
        answers = docs.extras["answers"]
        ones = (docs.tokens[:, 1:] == cfg.element_id(1)).cumsum(1) % 2
        assert torch.equal(answers, cfg.state_id(ones))
        assert torch.equal(docs.extras["answer_positions"][0], torch.arange(1, 9))


def test_s3_answers_compose_the_permutations() -> None:
    cfg = task("s3")
    docs = build_datasets(cfg)["dev"]
    names = cfg.id_names()
    perms = list(itertools.permutations(range(3)))
    assert [names[N_SPECIAL + i] for i in range(6)] == ["".join(map(str, p)) for p in perms]
    for i in range(len(docs)):
        n = int(docs.lengths[i]) - 1
        state = (0, 1, 2)
        for t in docs.tokens[i, 1 : n + 1]:
            g = tuple(int(c) for c in names[int(t)])
            state = tuple(g[state[j]] for j in range(3))  # g after the state so far
        assert names[int(docs.answer[i])] == "=" + "".join(map(str, state))


def test_s3_is_not_commutative_so_order_matters() -> None:
    """Two documents with the same elements in another order can differ: the generator
    composes in order (a sum mod 6 would not)."""
    cfg = task("s3", n_dev=256)
    docs = build_datasets(cfg)["dev"]
    seen: dict[tuple, set[int]] = {}
    for i in range(len(docs)):
        n = int(docs.lengths[i]) - 1
        seen.setdefault(tuple(sorted(docs.tokens[i, 1 : n + 1].tolist())), set()).add(
            int(docs.answer[i])
        )
    assert any(len(answers) > 1 for answers in seen.values())


def test_corruption_changes_one_element_and_always_the_answer() -> None:
    for kind in ("parity", "s3"):
        cfg = task(kind)
        original = build_datasets(cfg)["test"].batch(torch.arange(64))
        corrupted = corrupt(original, cfg, seed=3)
        changed = original.tokens != corrupted.tokens
        assert torch.equal(changed.sum(1), torch.ones(64, dtype=torch.long))
        assert torch.equal(changed.nonzero()[:, 1], original.roles["key"])
        for i in range(64):
            n = int(original.lengths[i]) - 1
            a = running_states(cfg, original.tokens[i : i + 1, 1 : n + 1])[0, -1]
            b = running_states(cfg, corrupted.tokens[i : i + 1, 1 : n + 1])[0, -1]
            assert a == original.answer[i] and a != b


def test_test_lengths_and_chance() -> None:
    cfg = task(test_min_elements=10, test_max_elements=12)
    docs = build_datasets(cfg)
    n = docs["test"].lengths - 1
    assert int(n.min()) >= 10 and int(n.max()) <= 12
    assert int((docs["dev"].lengths - 1).max()) <= 8
    assert cfg.max_length() == 13  # position embeddings cover the longest test document
    batch = docs["test"].batch(torch.arange(8))
    assert chance_level(batch.candidates) == pytest.approx(0.5)
    assert chance_level(build_datasets(task("s3"))["dev"].batch(torch.arange(4)).candidates) == (
        pytest.approx(1 / 6)
    )


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"min_elements": 9}, "min_elements"),
        ({"min_elements": 1}, "min_elements"),
        ({"test_min_elements": 10, "test_max_elements": 9}, "test_max_elements"),
        ({"max_elements": 1}, "max_elements"),
    ],
)
def test_bad_lengths_are_one_line_errors(fields: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        task(**fields)
    assert f"task.{field}" in str(err.value) and "\n" not in str(err.value)


# -------------------------------------------------------------------- hand-built mechanisms

CFG = task()
V = CFG.vocab_size()  # pad, bos, div, 0, 1, even, odd
D = 8
ONE, EVEN, ODD = int(CFG.element_id(1)), int(CFG.state_id(0)), int(CFG.state_id(1))
ALPHA, BETA = 10.0, 30.0


def _write(sign: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """+1 -> towards ``even``, -1 -> towards ``odd``, in the token subspace the head reads."""
    out = torch.zeros_like(x)
    out[..., EVEN] = BETA * sign
    out[..., ODD] = -BETA * sign
    return out


def _flips(x: torch.Tensor) -> torch.Tensor:
    """1 - 2 * [the token is the bit 1]: the factor each element multiplies the parity by."""
    return 1.0 - 2.0 * (x[..., ONE] > 0).float()


class ParityRecurrence(Mixer):
    """s_t = s_{t-1} · (±1): the parity carried in a recurrent state (1 after <bos>). With
    ``lag``, the factor of element t enters the state at t + lag, as a short conv's window
    delays what an SSM's state takes in (the state right after the element misses it); the
    output multiplies in the last ``lag`` elements' factors from the window."""

    carries = "state"

    def __init__(self, lag: int = 0) -> None:
        super().__init__()
        self.lag = lag

    def halo(self) -> int | None:
        return self.lag

    def recurrent_state_size(self, seq_len: int) -> int | None:
        return 1

    def final_states(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, 0, None)[1]

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, 0, None)[0]

    def mix_from(self, x: torch.Tensor, offset: int, state, replace: bool = False) -> torch.Tensor:
        return self._run(x, offset, state, replace)[0][:, offset:]

    def _run(self, x, offset, state, replace=False):
        flips = _flips(x)
        recent = torch.ones_like(flips)
        if self.lag:  # element t - lag's factor at t; none before the window's first element
            flips = torch.cat([torch.ones_like(flips[:, : self.lag]), flips[:, : -self.lag]], 1)
            # the last `lag` elements' factors, read from the window as a short conv holds them
            recent = torch.stack([_flips(x).roll(j, 1) for j in range(self.lag)]).prod(0)
        start = (x[..., BOS] > 0).float()
        s = torch.zeros(x.shape[0], 1) if state is None else state.clone()
        states = torch.zeros(x.shape[0], x.shape[1], 1)
        for t in range(offset, x.shape[1]):
            if not (replace and t == offset):  # replace: the state after `offset` is given
                s = start[:, t, None] + (1 - start[:, t, None]) * s * flips[:, t, None]
            states[:, t] = s
        return _write(states[..., 0] * recent, x), states


class ParityWindow(Mixer):
    """The parity of every element so far, read from the whole window at each position (as
    attention can read every element from the query): no state to carry or restore."""

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return _write(_flips(x).cumprod(dim=1), x)


class Silent(Mixer):
    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(x)


class AlwaysEven(Mixer):
    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return _write(torch.ones(x.shape[:-1]), x)


def hand_built(first: Mixer, last: Mixer) -> torch.nn.Module:
    model = build_model(
        ModelConfig(
            architecture="attention", d_model=D, n_layers=2, vocab_size=V,
            position_embedding=False,
        )
    )  # fmt: skip
    with torch.no_grad():
        model.embedding.weight.copy_(ALPHA * torch.eye(V, D))
        for layer in model.layers:
            layer.mlp.fc2.weight.zero_()
            layer.mlp.fc2.bias.zero_()
    model.layers[0].mixer, model.layers[1].mixer = first, last
    name_sites(model)
    return model.eval()


def read(model: torch.nn.Module, n_docs: int = 64):
    cfg = CFG.model_copy(update={"n_dev": n_docs})
    original = build_datasets(cfg)["dev"].batch(torch.arange(n_docs))
    corrupted = corrupt(original, CFG, seed=5)
    sites = ["layers.1.input", *state_site_names(model)]
    result = interchange(model, original, corrupted, sites=sites)
    label = label_mechanism(
        result.table, n_layers=2, chance=chance_level(original.candidates),
        readings=CFG.readings,
    )  # fmt: skip
    return result, label


@pytest.mark.parametrize("layer", [0, 1])
def test_a_recurrent_state_that_carries_the_parity_reads_in_the_state(layer: int) -> None:
    mixers = [Silent(), Silent()]
    mixers[layer] = ParityRecurrence()
    model = hand_built(*mixers)
    assert state_site_names(model) == [f"layers.{layer}.mixer.state"]
    result, label = read(model)
    assert result.value("original", "accuracy") == 1.0
    assert result.value("corrupted", "accuracy") == 0.0
    assert (label.label, label.site) == ("in the state after it", f"layers.{layer}.mixer.state")
    assert label.recovered["query (state)"] > 0.99
    # In the last layer the element's restore recovers too (the state takes it in there); in
    # the first, the query's does: the state is the reading tried first.
    other = "key" if layer == 1 else "query"
    assert label.recovered[other] > 0.99
    assert label.recovered["query" if layer == 1 else "key"] < 0.01


def test_the_state_is_read_at_the_query_where_the_element_enters_it_late() -> None:
    """The element's factor enters the state 2 positions after it (a short conv's delay): the
    state restored right after the element misses it, the state the answer reads carries it."""
    model = hand_built(Silent(), ParityRecurrence(lag=2))
    original = build_datasets(CFG)["dev"].batch(torch.arange(64))
    keep = original.roles["query"] - original.roles["key"] >= 2  # the factor is in by the query
    original = original.select(keep)
    corrupted = corrupt(original, CFG, seed=5)
    result = interchange(model, original, corrupted, sites=["layers.1.input", STATE1])
    assert result.value("original", "accuracy") == 1.0
    assert result.value("restored", site=STATE1, role="key") < 0.01
    label = label_mechanism(result.table, 2, chance=0.5, readings=CFG.readings)
    assert (label.label, label.site) == ("in the state after it", STATE1)


STATE1 = "layers.1.mixer.state"


def test_a_last_layer_that_reads_the_elements_without_a_state_reads_at_the_element() -> None:
    result, label = read(hand_built(Silent(), ParityWindow()))
    assert result.value("original", "accuracy") == 1.0
    assert (label.label, label.site) == ("at the element", "layers.1.input")
    assert label.recovered["key"] > 0.99 and label.recovered["query"] < 0.01
    assert "query (state)" not in label.recovered


def test_an_answer_composed_before_the_last_layer_reads_only_at_the_query() -> None:
    result, label = read(hand_built(ParityWindow(), Silent()))
    assert result.value("original", "accuracy") == 1.0
    assert (label.label, label.site) == ("only at the query", "layers.1.input")
    assert label.recovered["query"] > 0.99 and label.recovered["key"] < 0.01


def test_a_model_at_chance_among_the_states_is_not_learned() -> None:
    """Always ``even``: every argmax is a state (in-context accuracy 1) and the accuracy is at
    the chance of 1/2. Retrieval's reading calls that candidates only; state tracking, whose
    every state is always a candidate, calls it not learned."""
    result, label = read(hand_built(AlwaysEven(), Silent()), n_docs=320)
    assert result.value("original", "in_context_accuracy") == 1.0
    assert abs(result.value("original", "accuracy") - 0.5) <= 0.05
    assert label.label == "not learned"
    retrieval = label_mechanism(result.table, n_layers=2, chance=0.5)
    assert retrieval.label == "candidates only (no binding)"


def test_the_readings_are_the_tasks_and_retrievals_are_unchanged() -> None:
    from mecheval.interventions.labels import LABELS
    from mecheval.tasks import ARConfig

    assert CFG.readings is STATE_TRACKING and task("s3").readings is STATE_TRACKING
    assert ARConfig().readings.at_label_site == LABELS
    assert LABELS["value"] == "induction" and not ARConfig().readings.in_state


def _table(accuracy: float, likelihood: float, restored: dict[tuple[str, str], float]):
    import pandas as pd

    rows = [
        ("original", "", "", "likelihood", likelihood),
        ("corrupted", "", "", "likelihood", 1 - likelihood),
        ("original", "", "", "accuracy", accuracy),
        ("original", "", "", "in_context_accuracy", 1.0),
    ]
    rows += [("restored", site, role, "likelihood", v) for (site, role), v in restored.items()]
    return pd.DataFrame(rows, columns=["condition", "site", "role", "metric", "value"])


def test_below_chance_is_not_learned_for_state_tracking_only() -> None:
    """Accuracy 35 % among two states: below the chance of 50 %. Retrieval's reading keeps its
    restore label (a model below chance may bind in part); state tracking's says not learned."""
    table = _table(0.35, 0.8, {("layers.1.input", "key"): 0.8, ("layers.1.input", "query"): 0.2})
    assert label_mechanism(table, 2, chance=0.5).label == "direct retrieval, layer >= 1"
    assert label_mechanism(table, 2, chance=0.5, readings=STATE_TRACKING).label == "not learned"
    table = _table(0.9, 0.8, {("layers.1.input", "key"): 0.8, ("layers.1.input", "query"): 0.2})
    assert label_mechanism(table, 2, chance=0.5, readings=STATE_TRACKING).label == "at the element"


def test_the_state_reading_comes_first_and_names_its_site() -> None:
    restores = {
        ("layers.1.input", "key"): 0.8,
        ("layers.1.input", "query"): 0.8,
        ("layers.0.mixer.state", "query"): 0.3,
        ("layers.1.mixer.state", "query"): 0.7,
    }
    label = label_mechanism(_table(0.9, 0.8, restores), 2, chance=0.5, readings=STATE_TRACKING)
    assert (label.label, label.site) == ("in the state after it", "layers.1.mixer.state")
    assert label.recovered["query (state)"] == pytest.approx(0.5 / 0.6)
    # below min_fraction in every state: the element, then the query
    restores[("layers.1.mixer.state", "query")] = 0.4
    label = label_mechanism(_table(0.9, 0.8, restores), 2, chance=0.5, readings=STATE_TRACKING)
    assert (label.label, label.site) == ("at the element", "layers.1.input")
    restores[("layers.1.input", "key")] = 0.2
    label = label_mechanism(_table(0.9, 0.8, restores), 2, chance=0.5, readings=STATE_TRACKING)
    assert label.label == "only at the query"
    restores[("layers.1.input", "query")] = 0.3
    label = label_mechanism(_table(0.9, 0.8, restores), 2, chance=0.5, readings=STATE_TRACKING)
    assert label.label == "unclear"
