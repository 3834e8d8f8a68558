"""Models whose mechanism is known (models/known.py): an induction circuit of two attention
layers, or of a convolution and a delta rule, and a DeltaNet, Mamba or Hyena layer that
retrieves directly, set by hand, alone and beside layers
that pass their input through. The exact protocol must read the label the weights were
built to have; each circuit is also checked on its own terms (the copy layer writes each
position's previous token; every document is answered)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mecheval.errors import ConfigError
from mecheval.experiments.mechanisms import InterventionPlan, intervene_run
from mecheval.interventions.patch import record
from mecheval.models import ModelConfig
from mecheval.models.known import (
    attention_retrieves_by_hand,
    candidates_by_hand,
    conv_induction_by_hand,
    direct_retrieval_by_hand,
    induction_by_hand,
    parity_by_hand,
)
from mecheval.tasks import build_datasets, parse_task
from mecheval.tasks.vocab import BOS, N_SPECIAL
from mecheval.training import load_run, resolve, train
from mecheval.training.config import config_from_data

TASK = {"kind": "ar", "n_keys": 8, "n_values": 8, "n_pairs": 4}
SPLITS = {"n_train": 64, "n_dev": 64, "n_test": 64}


def run_folder(
    tmp_path: Path, layers: list, task: dict = TASK, model: dict | None = None, **splits
) -> tuple:
    """A run folder of ``layers`` (trained one step, for its config and data; ``model``: the
    model's other options), and its config."""
    data = {
        "task": {**task, **SPLITS, **splits},
        "model": {"layers": layers, "d_model": 64, "position_embedding": True, **(model or {})},
        "training": {"lr": 1e-3, "steps": 1, "eval_every": 1, "batch_size": 16},
    }
    run_dir = tmp_path / "-".join(str(i) for i in range(len(layers)))
    train(resolve(config_from_data(data)), run_dir)
    cfg, _ = load_run(run_dir, "cpu")
    return run_dir, cfg


def test_the_circuit_copies_the_previous_token_and_answers_every_document(tmp_path) -> None:
    _, cfg = run_folder(tmp_path, ["attention", "attention"])
    model = induction_by_hand(cfg.model, copy=0, read=1).eval()
    batch = build_datasets(parse_task({**TASK, **SPLITS}))["test"].batch(torch.arange(64))
    with torch.no_grad(), record(model, ["layers.1.input"]) as seen:
        logits = model(batch.tokens)
    vocab = cfg.model.vocab_size
    previous = seen["layers.1.input"][:, 1:, vocab : 2 * vocab].argmax(-1)
    assert torch.equal(previous, batch.tokens[:, :-1])  # position p holds token p - 1
    rows = torch.arange(64)
    answers = logits[rows, batch.roles["query"]].argmax(-1)
    assert torch.equal(answers, batch.answer)


@pytest.mark.parametrize(
    ("layers", "copy", "read", "label"),
    [
        (["attention", "attention"], 0, 1, "induction"),
        (["mamba", "attention", "attention"], 1, 2, "induction in layer 2 (attention)"),
        (["attention", "attention", "mamba"], 0, 1, "induction in layer 1 (attention)"),
    ],
)
def test_the_protocol_reads_the_mechanism_the_weights_were_built_to_have(
    tmp_path, layers: list[str], copy: int, read: int, label: str
) -> None:
    run_dir, cfg = run_folder(tmp_path, layers)
    model = induction_by_hand(cfg.model, copy, read).eval()
    read_ = intervene_run(run_dir, InterventionPlan(split="dev"), loaded=(cfg, model)).label
    assert read_.label == label
    assert read_.original > 0.99 and read_.corrupted < 0.01
    # After a pass-through last layer the label site (its input) already holds the answer
    # at the query; the carrier finds the layer that put it there, reading the value.
    assert read_.role == ("query" if layers[-1] == "mamba" else "value")
    if len(set(layers)) > 1:
        assert (read_.carrier.layer, read_.carrier.reads) == (read, "induction")


def test_attribution_of_the_log_likelihood_reads_the_circuit_attribution_misses(tmp_path):
    """The induction circuit's restores are all or nothing (p(answer) from about 0 to about
    1): a first-order step of the likelihood from the corrupted run, where its gradient is
    about 0, reads `unclear`; the same step of the log-likelihood, mapped back, reads the
    circuit as built."""
    run_dir, cfg = run_folder(tmp_path, ["attention", "attention"])
    model = induction_by_hand(cfg.model, copy=0, read=1).eval()
    plan = InterventionPlan(split="dev", methods=("attribution", "attribution-log"))
    measured = intervene_run(run_dir, plan, loaded=(cfg, model))
    labels = {graded.method: graded.record["label"] for graded in measured.graded}
    assert measured.label.label == "induction"
    assert labels == {"attribution": "unclear", "attribution-log": "induction"}


def assert_answers_every_test_document(model) -> None:
    """The model's answer at the query (its argmax) is right on each of 64 AR test documents."""
    batch = build_datasets(parse_task({**TASK, **SPLITS}))["test"].batch(torch.arange(64))
    with torch.no_grad():
        answers = model(batch.tokens)[torch.arange(64), batch.roles["query"]].argmax(-1)
    assert torch.equal(answers, batch.answer)


@pytest.mark.parametrize(
    ("layers", "layer", "label"),
    [
        (["deltanet", "deltanet"], 0, "direct retrieval, layer 0"),
        (["deltanet", "deltanet"], 1, "direct retrieval, layer >= 1"),
        (["deltanet", "attention"], 0, "direct retrieval in layer 0 (deltanet)"),
        (["mamba", "deltanet"], 1, "direct retrieval in layer 1 (deltanet)"),
        (["mamba", "mamba"], 0, "direct retrieval, layer 0"),
        (["mamba", "mamba"], 1, "direct retrieval, layer >= 1"),
        (["attention", "mamba"], 1, "direct retrieval in layer 1 (mamba)"),
        (["mamba", "attention"], 0, "direct retrieval in layer 0 (mamba)"),
        (["hyena", "hyena"], 0, "direct retrieval, layer 0"),
        (["hyena", "hyena"], 1, "direct retrieval, layer >= 1"),
        (["attention", "hyena"], 1, "direct retrieval in layer 1 (hyena)"),
    ],
)
def test_a_state_set_to_retrieve_at_the_query_reads_direct_retrieval(
    tmp_path, layers: list[str], layer: int, label: str
) -> None:
    """A delta rule (DeltaNet) or a selective scan (Mamba) set to write each pair into its
    state and read the query's, or a Hyena layer that binds each pair with its gate and sums
    the pairs with its long convolution: every document answered, the label as built."""
    run_dir, cfg = run_folder(tmp_path, layers)
    keys = [N_SPECIAL + i for i in range(TASK["n_keys"])]  # AR's ids: specials, then keys
    values = [N_SPECIAL + TASK["n_keys"] + i for i in range(TASK["n_values"])]  # then values
    model = direct_retrieval_by_hand(cfg.model, layer, keys, values).eval()
    assert_answers_every_test_document(model)
    read_ = intervene_run(run_dir, InterventionPlan(split="dev"), loaded=(cfg, model)).label
    assert read_.label == label
    # The retrieving layer's input holds the key at the key's position: restoring it there
    # (at layer 1's input) brings the answer back; in layer 0 only the query's restore does.
    assert read_.role == ("key" if layer == 1 else "query")


@pytest.mark.parametrize(
    ("layers", "layer", "label"),
    [
        (["attention", "attention"], 0, "direct retrieval, layer 0"),
        (["attention", "attention"], 1, "direct retrieval, layer >= 1"),
        (["mamba", "attention"], 1, "direct retrieval in layer 1 (attention)"),
    ],
)
def test_attention_with_a_short_convolution_retrieves_directly(
    tmp_path, layers: list[str], layer: int, label: str
) -> None:
    """One attention layer whose short convolution gives each position the token before it
    matches the query's token against it, inside the layer: every document answered, the
    label as built. With the convolution's shift taken out (each position's own token where
    the one before should be), the query meets itself and the label is lost."""
    run_dir, cfg = run_folder(tmp_path, layers, model={"short_conv": 2}, n_dev=320)
    model = attention_retrieves_by_hand(cfg.model, layer).eval()
    assert_answers_every_test_document(model)
    read_ = intervene_run(run_dir, InterventionPlan(split="dev"), loaded=(cfg, model)).label
    assert read_.label == label
    assert read_.role == ("key" if layer == 1 else "query")
    taps = model.layers[layer].mixer.short_conv.weight[:, 0]
    with torch.no_grad():
        taps[:, -1] = 1.0
        taps[:, -2] = 0.0
    broken = intervene_run(run_dir, InterventionPlan(split="dev"), loaded=(cfg, model)).label
    assert broken.accuracy is not None and broken.accuracy < 0.5
    assert not broken.label.startswith("direct retrieval")


@pytest.mark.parametrize(
    ("layers", "layer", "label"),
    [
        (["deltanet", "deltanet"], 0, "direct retrieval, layer 0; held in the state before the "
         "query (layer 0)"),
        (["mamba", "deltanet"], 1, "direct retrieval in layer 1 (deltanet); held in the state "
         "before the query (layer 1)"),
    ],
)  # fmt: skip
def test_a_delta_rule_holds_a_reassigned_value_in_its_state(
    tmp_path, layers: list[str], layer: int, label: str
) -> None:
    """On reassign AR the hand-set delta rule (β = 1) replaces a key's value at each
    rebinding, so its state holds the latest one when the query comes."""
    task = {"kind": "reassign_ar", "n_keys": 8, "n_values": 8, "n_pairs": 3, "n_changes": 3,
            "query_changes": 2}  # fmt: skip
    run_dir, cfg = run_folder(tmp_path, layers, task)
    model = direct_retrieval_by_hand(cfg.model, layer).eval()
    read_ = intervene_run(run_dir, InterventionPlan(split="dev"), loaded=(cfg, model)).label
    assert read_.original > 0.99 and read_.label == label


def _keyed_by_the_token_itself(model, layers: list[str]) -> None:
    """Break a known model in one place: the pair is written (or the previous token copied)
    under the position's own token instead of the one before it."""
    mixer = model.layers[0].mixer
    with torch.no_grad():
        if layers[0] == "attention":  # the copy layer attends to its own position
            d = mixer.qkv.weight.shape[1]
            q, k, _ = mixer.qkv.weight.view(3, d, d)
            q.copy_(k)
        else:
            conv = mixer.k_conv if layers[0] == "deltanet" else mixer.conv
            vocab, d = model.embedding.weight.shape
            rows = {"deltanet": slice(None), "mamba": slice(vocab, 2 * vocab)}
            taps = conv.weight[rows.get(layers[0], slice(2 * d, None)), 0]  # Hyena: its v
            taps[:, -1], taps[:, -2] = taps[:, -2].clone(), 0.0


@pytest.mark.parametrize(
    ("layers", "label"),
    [
        (["attention", "attention"], "induction"),
        (["deltanet", "deltanet"], "direct retrieval, layer 0"),
        (["mamba", "mamba"], "direct retrieval, layer 0"),
        (["hyena", "hyena"], "direct retrieval, layer 0"),
    ],
)
def test_a_known_model_broken_in_one_place_loses_its_label(tmp_path, layers, label) -> None:
    """The label is read from the mechanism, not given by the construction: the same model
    with its key taken from the wrong position answers wrongly and reads otherwise."""
    run_dir, cfg = run_folder(tmp_path, layers)
    keys = [N_SPECIAL + i for i in range(TASK["n_keys"])]
    values = [N_SPECIAL + TASK["n_keys"] + i for i in range(TASK["n_values"])]
    if layers[0] == "attention":
        model = induction_by_hand(cfg.model, 0, 1)
    else:
        model = direct_retrieval_by_hand(cfg.model, 0, keys, values)
    _keyed_by_the_token_itself(model.eval(), layers)
    read_ = intervene_run(run_dir, InterventionPlan(split="dev"), loaded=(cfg, model)).label
    assert read_.accuracy is not None and read_.accuracy < 0.5
    assert read_.label != label and not read_.label.startswith(label)


PARITY = {"kind": "parity", "max_elements": 16}


def _parity_model(tmp_path: Path, arch: str, broken: bool = False) -> tuple:
    """A run folder of two ``arch`` layers (negative eigenvalues allowed) and the model whose
    layer 0 carries parity by hand; ``broken`` in one place: Mamba's Δ is 0 at the swap (its
    transition 1, as the identity's), DeltaNet's key is read from the position before."""
    layer = {"architecture": arch, "mixer": {"allow_neg_eigval": True}}
    run_dir, cfg = run_folder(tmp_path, [layer, layer], PARITY, n_dev=320)
    elements = (int(cfg.task.element_id(0)), int(cfg.task.element_id(1)))
    states = (int(cfg.task.state_id(0)), int(cfg.task.state_id(1)))
    model = parity_by_hand(cfg.model, 0, BOS, elements, states).eval()
    if broken:
        mixer = model.layers[0].mixer
        with torch.no_grad():
            if arch == "mamba":
                mixer.x_proj.weight[0, elements[1]] = 0.0
            else:
                taps = mixer.k_conv.weight[:, 0]
                taps[:, -1], taps[:, -2] = 0.0, taps[:, -1].clone()
    return run_dir, cfg, model


@pytest.mark.parametrize("arch", ["mamba", "deltanet"])
def test_a_state_set_to_carry_parity_answers_every_document_and_reads_in_the_state(
    tmp_path, arch: str
) -> None:
    """Parity carried by hand in layer 0's state (a transition of -1 at each swap): every
    dev document is answered, the state at the query brings the whole answer back, the last
    layer's input at the changed element none of it."""
    run_dir, cfg, model = _parity_model(tmp_path, arch)
    read_ = intervene_run(run_dir, InterventionPlan(split="dev"), loaded=(cfg, model)).label
    assert read_.accuracy == 1.0 and read_.original > 0.99
    assert read_.label == "in the state after it" and read_.site == "layers.0.mixer.state"
    assert read_.recovered["query (state)"] > 0.99 and abs(read_.recovered["key"]) < 0.01


@pytest.mark.parametrize("arch", ["mamba", "deltanet"])
def test_a_parity_model_broken_in_one_place_loses_its_label(tmp_path, arch: str) -> None:
    """The same model with its state's flip broken in one place answers no better than a
    guess and reads otherwise."""
    run_dir, cfg, model = _parity_model(tmp_path, arch, broken=True)
    read_ = intervene_run(run_dir, InterventionPlan(split="dev"), loaded=(cfg, model)).label
    assert read_.accuracy is not None and read_.accuracy < 0.7
    assert read_.label != "in the state after it"


def test_a_parity_layer_must_allow_negative_eigenvalues() -> None:
    for layers, says in (
        (["mamba", "mamba"], "model.layers[0]: parity_by_hand needs Mamba or DeltaNet with"),
        (["attention", "mamba"], "model.layers[0]: parity_by_hand needs Mamba or DeltaNet with"),
    ):
        cfg = ModelConfig(layers=layers, d_model=64, vocab_size=7, max_len=17)
        with pytest.raises(ConfigError, match=r"^" + says.replace("[", r"\[")):
            parity_by_hand(cfg, 0, BOS, (3, 4), (5, 6))


@pytest.mark.parametrize(
    "layers",
    [
        ["attention", "attention"],
        ["mamba", "attention"],
        ["attention", "baseconv"],
        ["attention", "mamba"],
        ["attention", "deltanet"],
    ],
)
def test_every_value_alike_reads_candidates_only(tmp_path, layers) -> None:
    """Attention to every value alike, a long convolution or a Mamba state that counts the
    values seen, a delta rule that stores each value under a key of its own and reads them
    all: the query's distribution is even over the document's values (checked on the
    logits), so its accuracy is the chance of a guess among them: the label needs no
    restore."""
    run_dir, cfg = run_folder(tmp_path, layers, n_dev=320)
    model = candidates_by_hand(cfg.model, 1, int(cfg.task.value_id(0))).eval()
    batch = build_datasets(parse_task({**TASK, **SPLITS}))["test"].batch(torch.arange(64))
    with torch.no_grad():
        logits = model(batch.tokens)[torch.arange(64), batch.roles["query"]]
    for b in range(64):
        context = batch.tokens[b, : int(batch.roles["divider"][b])]
        values = context[context >= N_SPECIAL + TASK["n_keys"]]
        on_values = logits[b, values]
        assert len(values) == TASK["n_pairs"] and float(on_values.max() - on_values.min()) < 1e-3
        assert float(on_values.min()) > float(logits[b].max()) - 1e-3  # the top of the vocabulary
    read_ = intervene_run(run_dir, InterventionPlan(split="dev"), loaded=(cfg, model)).label
    assert read_.label == "candidates only (no binding)" and read_.role is None
    assert read_.in_context_accuracy == 1.0 and abs(read_.accuracy - 0.25) < 0.05


@pytest.mark.parametrize(
    ("layers", "copy", "read", "d_model", "says"),
    [
        (["attention", "attention"], 0, 1, 40, "model.d_model: induction_by_hand needs"),
        (["mamba", "attention"], 0, 1, 64, "model.layers[0]: induction_by_hand needs one-head"),
        (["hawk", "attention", "attention"], 1, 2, 64, "Hawk has neither"),
        (["attention", "attention"], 1, 0, 64, "need 0 <= copy < read < 2"),
    ],
)
def test_impossible_circuits_are_one_line(layers, copy, read, d_model, says) -> None:
    cfg = ModelConfig(
        layers=layers, d_model=d_model, vocab_size=19, max_len=11, position_embedding=True
    )
    with pytest.raises(ConfigError) as err:
        induction_by_hand(cfg, copy, read)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_attention_retrieves_directly_only_with_its_short_convolution() -> None:
    cfg = ModelConfig(layers=["attention"] * 2, d_model=64, vocab_size=19, max_len=11)
    with pytest.raises(ConfigError) as err:
        attention_retrieves_by_hand(cfg, 0)
    assert str(err.value).startswith("model.layers[0]: attention_retrieves_by_hand needs the")
    assert "model.short_conv >= 2" in str(err.value) and "\n" not in str(err.value)


def test_a_direct_retrieval_layer_must_be_a_delta_rule_or_mamba_with_a_conv() -> None:
    no_conv = {"architecture": "mamba", "mixer": {"d_conv": None}}
    no_bias = {"architecture": "mamba", "mixer": {"conv_bias": False}}
    for layers, keys, says in (
        (["attention", "attention"], (), "model.layers[0]: direct_retrieval_by_hand needs"),
        (["deltanet", "h3"], (), "model.layers[1]: a known model passes a layer through"),
        (["mamba", "mamba"], (), "model.layers[0]: direct retrieval in Mamba needs 1..d_state"),
        (["mamba"], range(17), "model.layers[0]: direct retrieval in Mamba needs 1..d_state"),
        ([no_conv, "mamba"], (3,), "model.layers[0]: direct retrieval in Mamba needs its conv"),
        ([no_bias, "mamba"], (3,), "model.layers[0]: direct retrieval in Mamba needs its conv"),
    ):
        cfg = ModelConfig(layers=layers, d_model=64, vocab_size=19, max_len=11)
        with pytest.raises(ConfigError, match=r"^" + says.replace("[", r"\[")):
            direct_retrieval_by_hand(cfg, 0, keys)


def test_reproduce_known_mechanisms_reads_each_model_beside_its_built_label(tmp_path) -> None:
    """Two of the command's models, written as run folders and read (at the tiny preset: on
    64 dev documents): the exact protocol recovers both labels; a reading that differs is
    marked and counted, not an error."""
    from mecheval.experiments.gather import load_folders
    from mecheval.experiments.known import KNOWN, known_markdown, read_known
    from mecheval.training.config import load_config

    cases = [k for k in KNOWN if k.name in ("induction-after-mamba", "candidates-only")]
    table = read_known(tmp_path, cases, methods=("attribution",), preset="tiny")
    assert load_config(tmp_path / "candidates-only" / "config.yaml").task.n_dev == 64
    assert table["model"].tolist() == ["induction-after-mamba", "candidates-only"]
    assert table["exact"].tolist() == table["built as"].tolist()
    table.loc[0, "attribution"] = "unclear"  # as attribution reads the saturated circuit
    lines = known_markdown(table, methods=("attribution",)).splitlines()
    assert "| unclear (differs)" in lines[4] and "(differs)" not in lines[5]
    assert lines[-1] == "Read as built, of 2: exact 2, attribution 1."
    # Each is a run folder as any other: built, not trained (step 0), read by `results`.
    rows = load_folders([tmp_path])
    assert set(rows["run"]) == {"candidates-only", "induction-after-mamba"}
    assert set(rows["status"]) == {"done"} and set(rows["step"]) == {0}


def test_reproduce_known_mechanisms_refuses_sweep_options_before_writing(
    tmp_path, monkeypatch, capsys
) -> None:
    from small_runs import run_cli

    code, out, err = run_cli(
        monkeypatch, capsys, "reproduce", "known-mechanisms", "--lrs", "1e-3",
        "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert code != 0 and "--lrs: known-mechanisms builds its models by hand" in out + err
    code, out, err = run_cli(
        monkeypatch, capsys, "reproduce", "known-mechanisms", "--preset", "huge",
        "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert code == 2 and "--preset: unknown 'huge'" in err
    assert not (tmp_path / "o").exists()


def test_a_candidates_convolution_must_be_baseconvs_long_one() -> None:
    cfg = ModelConfig(layers=["baseconv", "attention"], d_model=64, vocab_size=19, max_len=11)
    with pytest.raises(ConfigError, match=r"^model\.layers\[0\]: candidates_by_hand needs Base"):
        candidates_by_hand(cfg, 0, 11)


def test_a_known_model_is_written_the_same_each_time(tmp_path) -> None:
    """The weights its mechanism leaves alone come from the run's seed: two writes of a
    known model leave the same weights file."""
    from mecheval.experiments.known import KNOWN, write_known

    known = next(k for k in KNOWN if k.name == "direct-mamba-layer-0")
    write_known(tmp_path / "a", known, "tiny")
    torch.rand(3)  # the global generator moves on between the two writes
    write_known(tmp_path / "b", known, "tiny")
    first, second = ((tmp_path / d / "model.safetensors").read_bytes() for d in "ab")
    assert first == second


def test_a_parity_mamba_without_its_conv_is_one_line_about_parity() -> None:
    layer = {"architecture": "mamba", "mixer": {"allow_neg_eigval": True, "d_conv": None}}
    cfg = ModelConfig(layers=[layer, "mamba"], d_model=64, vocab_size=7, max_len=17)
    with pytest.raises(ConfigError, match=r"^model\.layers\[0\]: parity in Mamba needs its conv"):
        parity_by_hand(cfg, 0, BOS, (3, 4), (5, 6))


VALUES = [N_SPECIAL + TASK["n_keys"] + i for i in range(TASK["n_values"])]  # after the keys


@pytest.mark.parametrize(
    ("layers", "copy", "read", "label"),
    [
        (["baseconv", "deltanet"], 0, 1, "induction in layer 1 (deltanet)"),
        (["baseconv", "deltanet", "mamba"], 0, 1, "induction in layer 1 (deltanet)"),
        (["baseconv", "mamba"], 0, 1, "induction in layer 1 (mamba)"),
        (["baseconv", "hyena"], 0, 1, "induction in layer 1 (hyena)"),
    ],
)
def test_a_convolution_that_copies_the_key_and_a_state_that_binds_read_induction(
    tmp_path, layers: list[str], copy: int, read: int, label: str
) -> None:
    """A BaseConv short convolution adds each key to the position after it (the value's);
    a DeltaNet or Mamba layer, or a Hyena layer's gate and long convolution, binds the key
    and value it finds there and reads the query's: every document answered, the binding
    made at the value."""
    run_dir, cfg = run_folder(tmp_path, layers)
    keys = [N_SPECIAL + i for i in range(TASK["n_keys"])]
    assert [int(cfg.task.value_id(i)) for i in range(TASK["n_values"])] == VALUES
    model = conv_induction_by_hand(cfg.model, copy, read, keys, VALUES).eval()
    batch = build_datasets(parse_task({**TASK, **SPLITS}))["test"].batch(torch.arange(64))
    with torch.no_grad(), record(model, [f"layers.{read}.input"]) as seen:
        answers = model(batch.tokens)[torch.arange(64), batch.roles["query"]].argmax(-1)
    assert torch.equal(answers, batch.answer)
    # The value's position holds its key after the copy: that key's coordinate is the
    # largest among the keys' there.
    rows = torch.arange(64)
    at_value = seen[f"layers.{read}.input"][rows, batch.roles["value"]][..., keys].argmax(-1)
    at_key = batch.tokens[rows, batch.roles["key"]] - N_SPECIAL
    assert torch.equal(at_value, at_key)
    read_ = intervene_run(run_dir, InterventionPlan(split="dev"), loaded=(cfg, model)).label
    assert read_.label == label
    assert (read_.carrier.layer, read_.carrier.reads) == (read, "induction")
    # Copied from the wrong position (two back), the key no longer meets its value.
    conv = model.layers[copy].mixer.conv
    with torch.no_grad():
        conv.weight[:, 0, -3], conv.weight[:, 0, -2] = conv.weight[:, 0, -2].clone(), 0.0
    broken = intervene_run(run_dir, InterventionPlan(split="dev"), loaded=(cfg, model)).label
    assert broken.accuracy is not None and broken.accuracy < 0.5
    assert not broken.label.startswith("induction")


def test_a_conv_induction_needs_a_short_convolution_and_a_state_that_binds() -> None:
    for layers, says in (
        (["attention", "deltanet"], "model.layers[0]: conv_induction_by_hand copies with"),
        ([{"architecture": "baseconv", "mixer": {"kernel_size": [-1]}}, "deltanet"], "copies"),
        (["baseconv", "attention"], "model.layers[1]: conv_induction_by_hand binds with one-head"),
    ):
        cfg = ModelConfig(layers=layers, d_model=64, vocab_size=19, max_len=11)
        with pytest.raises(ConfigError, match=says.replace("[", r"\[")) as err:
            conv_induction_by_hand(cfg, 0, 1, [3, 4], [11, 12])
        assert "\n" not in str(err.value)
