"""Hand-built models with known mechanisms: the engine and the labels must recover them.

The induction model is a 2-layer attention LM whose weights are set by hand: layer 0 is a
previous-token head (each position copies the identity of the token before it into a
"previous token" subspace), layer 1 an induction head (the query looks for the position whose
previous token equals the query token, i.e. the value after the matching key, and copies that
value into the token subspace, where the tied LM head reads it). MLPs are switched off.
The direct-retrieval model runs both heads inside layer 0 and leaves layer 1 inert, so the
answer is complete at the query before the last layer.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from mecheval.interventions import Thresholds, interchange, label_mechanism
from mecheval.models import ModelConfig, build_model
from mecheval.models.mixers.attention import Attention, AttentionOptions
from mecheval.models.mixers.base import Mixer
from mecheval.models.sites import local_mixing_sites, name_sites
from mecheval.tasks import ARConfig, build_datasets, corrupt

TASK = ARConfig(kind="ar", n_keys=4, n_values=4, n_pairs=2, n_train=0, n_dev=64, n_test=0)
V = TASK.vocab_size()  # 11: pad, bos, div, 4 keys, 4 values
P = 8  # positions
D = 32  # residual width: tokens [0, V), positions [V, V+P), previous token [V+P, V+P+V)
TOK, POS, PREV = 0, V, V + P
ALPHA, BETA = 10.0, 12.0


def set_head(attn: Attention, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, wo) -> None:
    with torch.no_grad():
        attn.qkv.weight.copy_(torch.cat([wq, wk, wv]))
        attn.out_proj.weight.copy_(wo)
        attn.out_proj.bias.zero_()


def previous_token_head(attn: Attention) -> None:
    wq, wk, wv, wo = (torch.zeros(D, D) for _ in range(4))
    for p in range(1, P):
        wq[POS + p - 1, POS + p] = BETA  # position p asks for position p - 1
    for p in range(P):
        wk[POS + p, POS + p] = 1.0
    for t in range(V):
        wv[PREV + t, TOK + t] = 1.0  # and reads its token into the previous-token subspace
        wo[PREV + t, PREV + t] = ALPHA / 4
    set_head(attn, wq, wk, wv, wo)


def induction_head(attn: Attention) -> None:
    wq, wk, wv, wo = (torch.zeros(D, D) for _ in range(4))
    for t in range(V):
        wq[PREV + t, TOK + t] = BETA  # the query token looks for "previous token == me"
        wk[PREV + t, PREV + t] = 1.0
        wv[TOK + t, TOK + t] = 1.0  # and copies the token found there (the value)
        wo[TOK + t, TOK + t] = 2 * ALPHA
    set_head(attn, wq, wk, wv, wo)


def hand_built_induction() -> torch.nn.Module:
    model = build_model(
        ModelConfig(architecture="attention", d_model=D, n_layers=2, vocab_size=V, max_len=P)
    )
    with torch.no_grad():
        model.embedding.weight.zero_()
        model.embedding.weight[:, TOK:V] = ALPHA * torch.eye(V)
        model.position.weight.zero_()
        model.position.weight[:, POS : POS + P] = ALPHA * torch.eye(P)
        for layer in model.layers:
            layer.mlp.fc2.weight.zero_()
            layer.mlp.fc2.bias.zero_()
    previous_token_head(model.layers[0].mixer)
    induction_head(model.layers[1].mixer)
    return model.eval()


class BothHeadsInOneLayer(Mixer):
    """Association and retrieval inside one mixer, as an SSM with a short conv does it."""

    def __init__(self, previous: Attention, induction: Attention) -> None:
        super().__init__()
        self.previous, self.induction = previous, induction

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        h = self.previous(x)
        return h + self.induction(F.layer_norm(x + h, x.shape[-1:]))


def hand_built_direct_retrieval() -> torch.nn.Module:
    model = hand_built_induction()
    layers = model.layers
    layers[0].mixer = BothHeadsInOneLayer(layers[0].mixer, layers[1].mixer)
    replacement = Attention(D, AttentionOptions())
    with torch.no_grad():
        for p in replacement.parameters():
            p.zero_()  # layer 1 does nothing: the answer must already be at the query
    layers[1].mixer = replacement
    name_sites(model)
    return model.eval()


def hand_built_one_layer_induction() -> torch.nn.Module:
    """Olsson et al.'s one-layer induction: a length-2 short conv on the mixer's input copies
    each token into the previous-token subspace of the next position (the embedding writes
    every token into both subspaces; the conv keeps lag 0 of the token subspace and lag 1 of
    the previous-token one), and the one attention layer is the induction head."""
    model = build_model(
        ModelConfig(
            architecture="attention",
            d_model=D,
            n_layers=1,
            vocab_size=V,
            max_len=P,
            position_embedding=False,
            short_conv=2,
        )
    )
    with torch.no_grad():
        model.embedding.weight.zero_()
        model.embedding.weight[:, TOK:V] = ALPHA * torch.eye(V)
        model.embedding.weight[:, PREV : PREV + V] = ALPHA * torch.eye(V)
        model.layers[0].mlp.fc2.weight.zero_()
        model.layers[0].mlp.fc2.bias.zero_()
        conv = model.layers[0].mixer.short_conv
        conv.weight.zero_()
        conv.bias.zero_()
        conv.weight[TOK:V, 0, 1] = 1.0  # tap 1 reads x[t], tap 0 x[t - 1]
        conv.weight[PREV : PREV + V, 0, 0] = 1.0
    induction_head(model.layers[0].mixer)
    return model.eval()


def pair():
    original = build_datasets(TASK)["dev"].batch(torch.arange(64))
    return original, corrupt(original, TASK, seed=5)


def test_hand_built_induction_model_is_labelled_induction() -> None:
    model = hand_built_induction()
    original, corrupted = pair()
    result = interchange(model, original, corrupted, sites=["layers.1.input"])
    assert result.value("original", "accuracy") == 1.0
    assert result.value("corrupted", "accuracy") < 0.6
    original_p = result.value("original")
    restored = {
        r: result.value("restored", site="layers.1.input", role=r)
        for r in ("key", "value", "query")
    }
    assert restored["value"] > 0.95 * original_p
    assert restored["query"] < 0.6 and restored["key"] < 0.6
    label = label_mechanism(result.table, n_layers=2)
    assert label.label == "induction", str(label)
    assert label.recovered["value"] > 0.9


def test_hand_built_direct_retrieval_model_is_labelled_layer0() -> None:
    model = hand_built_direct_retrieval()
    original, corrupted = pair()
    result = interchange(model, original, corrupted, sites=["layers.1.input"])
    assert result.value("original", "accuracy") == 1.0
    assert result.value("corrupted", "accuracy") < 0.6
    assert result.value("restored", site="layers.1.input", role="value") < 0.6
    label = label_mechanism(result.table, n_layers=2)
    assert label.label == "direct retrieval, layer 0", str(label)
    assert label.recovered["query"] > 0.9


def test_one_layer_model_is_labelled_at_its_short_conv() -> None:
    """A one-layer model's only layer output at the query restores the logits themselves, so
    read there every model reads as direct retrieval. Read at the short conv's output (the
    block's short mixing step, before its only mixer), the hand-built one-layer induction
    model recovers at the value: induction, as Olsson et al. describe it."""
    model = hand_built_one_layer_induction()
    original, corrupted = pair()
    conv_site = "layers.0.mixer.short_conv.output"
    assert local_mixing_sites(model, 0) == [conv_site]
    result = interchange(model, original, corrupted, sites=[conv_site, "layers.0.output"])
    assert result.value("original", "accuracy") == 1.0
    assert result.value("corrupted", "accuracy") < 0.6
    at_output = label_mechanism(result.table, n_layers=1)
    assert at_output.site == "layers.0.output"
    assert at_output.label == "direct retrieval, layer 0"  # the trivial reading
    label = label_mechanism(result.table, n_layers=1, local_sites=[conv_site])
    assert (label.site, label.label) == (conv_site, "induction"), str(label)
    assert label.recovered["value"] > 0.9 and label.recovered["key"] < 0.1
    # the local sites matter only for one layer, and only where they were measured
    assert label_mechanism(result.table, n_layers=1, local_sites=["x.output"]).site == (
        "layers.0.output"
    )


def test_one_layer_label_reads_the_local_site_that_recovers_most() -> None:
    rows = [("original", "", "", "likelihood", 0.9), ("corrupted", "", "", "likelihood", 0.1)]
    restores = {"q_conv": (0.1, 0.1, 0.1), "k_conv": (0.1, 0.7, 0.1), "v_conv": (0.5, 0.1, 0.1)}
    for conv, values in restores.items():
        rows += [
            ("restored", f"layers.0.mixer.{conv}.output", role, "likelihood", v)
            for role, v in zip(("key", "value", "query"), values, strict=True)
        ]
    table = pd.DataFrame(rows, columns=["condition", "site", "role", "metric", "value"])
    sites = [f"layers.0.mixer.{c}.output" for c in restores]
    label = label_mechanism(table, n_layers=1, local_sites=sites)
    assert (label.site, label.label) == ("layers.0.mixer.k_conv.output", "induction")
    assert label.recovered["value"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="no restores at layers.1.input"):
        label_mechanism(table, n_layers=2, local_sites=sites)  # two layers: the paper's site


@pytest.mark.parametrize(
    ("architecture", "short_conv", "expected"),
    [
        ("attention", None, []),
        ("attention", 2, ["layers.0.mixer.short_conv.output"]),
        ("mamba", None, ["layers.0.mixer.conv.output"]),
        ("h3", None, ["layers.0.mixer.conv.output"]),  # the shift SSM
        ("hyena", None, ["layers.0.mixer.conv.output"]),  # not the long conv
        ("deltanet", None, [f"layers.0.mixer.{c}_conv.output" for c in "qkv"]),
        ("deltanet", "none", []),
    ],
)
def test_local_mixing_sites(architecture, short_conv, expected) -> None:
    model = build_model(
        ModelConfig(
            architecture=architecture,
            d_model=16,
            n_layers=2,
            vocab_size=V,
            max_len=P,
            short_conv=short_conv,
        )
    )
    assert local_mixing_sites(model, 0) == expected
    assert local_mixing_sites(model, 1) == [s.replace("layers.0", "layers.1") for s in expected]


def test_untrained_model_is_not_learned() -> None:
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(architecture="attention", d_model=D, n_layers=2, vocab_size=V, max_len=P)
    ).eval()
    original, corrupted = pair()
    result = interchange(model, original, corrupted, sites=["layers.1.input"])
    assert label_mechanism(result.table, n_layers=2).label == "not learned"


def _table(original: float, corrupted: float, restored: dict[str, float]) -> pd.DataFrame:
    rows = [
        ("original", "", "", "likelihood", original),
        ("corrupted", "", "", "likelihood", corrupted),
    ]
    rows += [("restored", "layers.1.input", r, "likelihood", v) for r, v in restored.items()]
    return pd.DataFrame(rows, columns=["condition", "site", "role", "metric", "value"])


@pytest.mark.parametrize(
    ("gap", "expected"),
    [(0.0, "inconclusive"), (0.049, "inconclusive"), (0.051, "induction"), (0.3, "induction")],
)
def test_inconclusive_exactly_when_the_range_is_below_the_threshold(gap, expected) -> None:
    """A label needs range: below min_gap (0.05) the corruption removed too little for any
    restore to be read, whatever the restores show; at or above it, the restores decide."""
    original = 0.9
    corrupted = original - gap
    # The value restores everything the corruption removed; key and query nothing.
    table = _table(original, corrupted, {"key": corrupted, "value": original, "query": corrupted})
    label = label_mechanism(table, n_layers=2)
    assert label.label == expected
    assert label.range == pytest.approx(gap)
    assert f"range {gap:.3f}" in str(label)
    assert Thresholds().min_gap == 0.05  # the threshold the cases straddle
