"""State size (issue #15): the floats one sequence carries at inference, per mixer and model,
checked against the states the resumable mixers actually keep and against counts written
here from each architecture's shapes; shown by `models list`, stored in the results table,
drawn against accuracy by the `state-size` figure."""

from __future__ import annotations

import pytest
import torch

from mecheval.experiments.store import load_results
from mecheval.models import ARCHITECTURES, ModelConfig, build_model, state_size
from mecheval.models.mixers.base import Mixer
from mecheval.models.registry import architecture
from mecheval.report.registry import FIGURES

D, T = 32, 13


def model_for(arch: str, n_layers: int = 2, short_conv=None, **mixer):
    cfg = ModelConfig(
        architecture=arch,
        d_model=D,
        n_layers=n_layers,
        vocab_size=11,
        max_len=T,
        mixer=mixer,
        short_conv=short_conv,
    )
    return build_model(cfg).eval()


def kept_state_floats(mixer: Mixer, x: torch.Tensor) -> int:
    """Floats per sequence of the state a resumable mixer keeps after the last position:
    what it actually carries, read off its prefix."""
    prefix = mixer.prefix(x)
    parts = prefix.states if isinstance(prefix.states, tuple) else (prefix.states,)
    if prefix.carries == "history":  # attention's keys and values at every position
        return sum(p[0].numel() for p in parts)
    return sum(p[0, -1].numel() for p in parts)  # a recurrence: [B, T, ...] per position


@pytest.mark.parametrize(
    ("arch", "options"),
    [
        ("attention", {}),
        ("mamba", {}),
        ("mamba", {"d_conv": None}),
        ("deltanet", {"num_heads": 2}),
        ("deltanet", {"conv_size": None}),
    ],
)
def test_the_state_size_is_the_state_the_mixer_keeps_plus_its_conv_buffers(arch, options):
    model = model_for(arch, **options)
    x = torch.randn(2, T, D)
    with torch.no_grad():
        for mixer in (layer.mixer for layer in model.layers):
            convs = {
                "mamba": 0 if options.get("d_conv", 4) is None else 3 * 2 * D,  # d_inner = 2d
                "deltanet": 0 if options.get("conv_size", 4) is None else 3 * 3 * D,  # q, k, v
                "attention": 0,
            }[arch]
            assert mixer.state_size(T) == kept_state_floats(mixer, x) + convs


def test_based_keeps_its_linear_attention_state_and_its_short_conv_buffer() -> None:
    model = model_for("based")
    x = torch.randn(2, T, D)
    conv_layer, attention_layer = (layer.mixer for layer in model.layers)
    assert conv_layer.state_size(T) == (3 - 1) * D  # BaseConv's 3-tap conv, nothing else
    with torch.no_grad():
        assert attention_layer.state_size(T) == kept_state_floats(attention_layer, x)
    features = 1 + 8 + 8 * 8  # Taylor map of feature_dim 8
    assert attention_layer.state_size(T) == features * (D + 1)  # S and z, one head


@pytest.mark.parametrize(
    ("arch", "options", "expected"),
    [
        # Counts written from each architecture's defaults (d = 32).
        ("mamba2", {}, 2 * D * 64 + 3 * (2 * D + 2 * 64)),  # nheads*headdim*d_state + conv
        ("gla", {}, 4 * (D // 2 // 4) * (D // 4)),  # heads x d_k x d_v, no conv
        ("retnet", {"num_heads": 2}, 2 * (D // 2) * (2 * D // 2)),  # expand_v 2
        ("hawk", {}, D + 3 * D),  # the RG-LRU's width + the 4-tap temporal conv
        ("hyena", {}, D * T + 2 * 3 * D),  # the long conv's history + the 3-tap conv on 3d
        ("h3", {"d_state": 8}, D * 8 + (D // 2) * 4 * 8),  # shift + diagonal SSM states
    ],
)
def test_state_size_from_the_shapes(arch: str, options: dict, expected: int) -> None:
    assert model_for(arch, n_layers=1, **options).layers[0].mixer.state_size(T) == expected


def test_options_and_the_switch_change_the_state() -> None:
    full = model_for("mamba")
    half = model_for("mamba", d_state=8)
    # Mamba's SSM part is d_inner x d_state: 16 -> 8 halves it, the conv buffer stays.
    ssm = 2 * D * 16
    assert state_size(full, T) - state_size(half, T) == 2 * (ssm // 2)
    attention = model_for("attention")
    switched = model_for("attention", short_conv=3)
    assert state_size(switched, T) - state_size(attention, T) == 2 * 2 * D  # 2 layers x (k-1) d
    # Attention's cache grows with the sequence; a recurrent state does not.
    assert attention.layers[0].mixer.state_size(2 * T) == 2 * attention.layers[0].mixer.state_size(
        T
    )
    assert full.layers[0].mixer.state_size(2 * T) == full.layers[0].mixer.state_size(T)


def test_every_built_in_architecture_has_a_state_size() -> None:
    for arch in sorted(ARCHITECTURES):
        size = state_size(model_for(arch), T)
        assert isinstance(size, int) and size > 0, arch


class _Unsized(Mixer):
    def __init__(self, d_model: int, options: object) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(d_model, d_model)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.cumsum(1))


@pytest.fixture
def unsized():
    architecture("test-unsized")(_Unsized)
    yield "test-unsized"
    ARCHITECTURES.pop("test-unsized", None)


def test_a_mixer_that_does_not_say_has_no_state_size(unsized, monkeypatch, capsys) -> None:
    assert state_size(model_for(unsized), T) is None
    from small_runs import run_cli

    code, out, _ = run_cli(monkeypatch, capsys, "models", "list", "--no-sites")
    assert code == 0
    parameters, states = (line for line in out.splitlines() if "test-unsized" in line)
    assert "599,424" in parameters  # its parameters are counted as ever
    assert states.count("—") == 5  # its state, at every width, is unknown


def test_the_results_table_and_the_figure_carry_the_state_size(tmp_path, monkeypatch, capsys):
    from small_runs import SWEEP_BASE, run_cli

    sweep = tmp_path / "sweep.yaml"
    import yaml

    spec = {
        "name": "sizes",
        "base": SWEEP_BASE,
        "grid": {"model.architecture": ["attention", "mamba"]},
    }
    sweep.write_text(yaml.safe_dump(spec))
    code, _, err = run_cli(monkeypatch, capsys, "sweep", str(sweep), "--out", str(tmp_path), "-q")
    assert code == 0, err
    table = load_results(tmp_path / "sizes")
    sizes = table.drop_duplicates("run").set_index("model.architecture")["state_size"]
    length = SWEEP_BASE["task"]["n_pairs"] * 2 + 3  # <bos> k v ... <div> q
    for arch in ("attention", "mamba"):
        cfg = ModelConfig(architecture=arch, d_model=16, n_layers=1, vocab_size=11, max_len=length)
        assert sizes[arch] == state_size(build_model(cfg), length)
    result = FIGURES["state-size"](table)
    assert sorted(result.data["architecture"]) == ["Attention", "Mamba"]
    assert (result.data["state_size"] > 0).all()
