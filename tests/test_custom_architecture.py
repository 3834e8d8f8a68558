"""docs/custom-architecture.md, end to end: its example mixer, loaded as a plugin, passes the
contract and works in every command (check-mixer, train, a two-process sweep, reproduce)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mecheval.cli import _register, app
from mecheval.contract import make_model, random_tokens
from mecheval.errors import ConfigError
from mecheval.models import registry

DOC = Path(__file__).resolve().parents[1] / "docs" / "custom-architecture.md"


def doc_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    (example,) = [b for b in blocks if b.startswith("# gated_linear_attention.py")]
    return example


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The doc's example as a plugin file; the registry and environment restored after."""
    monkeypatch.setenv(registry.PLUGIN_ENV, "")
    path = tmp_path / "gated_linear_attention.py"
    path.write_text(doc_example())
    before = set(registry.ARCHITECTURES)
    loaded = set(registry._loaded_plugins)
    yield path
    for name in set(registry.ARCHITECTURES) - before:
        del registry.ARCHITECTURES[name]
    registry._loaded_plugins.intersection_update(loaded)


def invoke(*args: str):
    _register()
    return CliRunner().invoke(app, list(args))


def test_the_example_passes_check_mixer(plugin) -> None:
    result = invoke("--plugin", str(plugin), "check-mixer", "my-gla")
    assert result.exit_code == 0, result.output
    assert "my-gla: all 9 checks passed" in result.output


def test_check_mixer_exits_1_on_a_failing_check(plugin, tmp_path) -> None:
    # The same mixer with a reversed cumulative sum over time: it sees the future.
    leaky = (
        plugin.read_text()
        .replace('"my-gla"', '"my-gla-leaky"')
        .replace("return self.out_proj(y)", "return self.out_proj(y.flip(1).cumsum(1).flip(1))")
    )
    path = tmp_path / "leaky.py"
    path.write_text(leaky)
    result = invoke("--plugin", str(path), "check-mixer", "my-gla-leaky")
    assert result.exit_code == 1
    assert "causality" in result.output.split("checks failed:")[1]


def test_the_parallel_form_equals_the_recurrence(plugin) -> None:
    """The doc's mixer computes S_t = a_t S_{t-1} + k_t v_t^T, y_t = q_t S_t (float64)."""
    registry.load_plugin(plugin)
    model = make_model("my-gla", {"num_heads": 2}).double()
    mixer = model.layers[0].mixer
    x = torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fast = mixer.mix(x)
        b, t, d = x.shape
        q = torch.nn.functional.normalize(mixer.q_proj(x).view(b, t, 2, 8), dim=-1)
        k = mixer.k_conv(mixer.k_proj(x)).view(b, t, 2, 8)
        k = torch.nn.functional.normalize(k, dim=-1)
        v = mixer.v_proj(x).view(b, t, 2, 8)
        a = torch.sigmoid(mixer.gate(x)) ** (1 / mixer.temperature)  # [B, T, H]
        state = torch.zeros(b, 2, 8, 8, dtype=torch.float64)
        ys = []
        for s in range(t):
            state = a[:, s, :, None, None] * state + k[:, s, :, :, None] * v[:, s, :, None, :]
            ys.append(torch.einsum("bhe,bhef->bhf", q[:, s], state).reshape(b, d))
        slow = mixer.out_proj(torch.stack(ys, 1))
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-10)
    assert "layers.0.mixer.keys" in dict(model.named_modules())


def test_train_intervene_and_reproduce_with_the_plugin(plugin, tmp_path) -> None:
    out = tmp_path / "runs"
    result = invoke(
        "--plugin",
        str(plugin),
        "reproduce",
        "ar",
        "--preset",
        "tiny",
        "--archs",
        "attention,my-gla",
        "--workers",
        "2",
        "--out",
        str(out),
        "-q",
    )
    assert result.exit_code == 0, result.output
    assert "ar-tiny: 2 done" in result.output
    assert "| my-gla" in result.output.split("Mechanisms")[1]
    run = out / "ar-tiny" / "my-gla"
    assert (run / "model.safetensors").exists() and (run / "mechanism.json").exists()
    intervened = invoke("--plugin", str(plugin), "intervene", str(run), "-n", "8")
    assert intervened.exit_code == 0, intervened.output
    assert "mechanism:" in intervened.output


def test_plugin_errors_are_one_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(registry.PLUGIN_ENV, "")
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nraise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match=r"broken\.py:2\): RuntimeError: boom"):
        registry.load_plugin(broken)
    with pytest.raises(ConfigError, match="expected an existing .py file"):
        registry.load_plugin(tmp_path / "missing.py")
    with pytest.raises(ConfigError, match="needs --plugin FILE"):
        registry.get_architecture("not-registered")


def test_an_architecture_name_cannot_be_taken_twice(plugin, tmp_path) -> None:
    registry.load_plugin(plugin)
    again = tmp_path / "again.py"
    again.write_text(plugin.read_text())
    with pytest.raises(ConfigError, match="registered twice"):
        registry.load_plugin(again)
    # The failed plugin left nothing behind: the first registration still builds.
    assert make_model("my-gla")(random_tokens(1, 4)).shape == (1, 4, 23)


def test_an_installed_entry_point_registers_on_first_lookup(tmp_path, monkeypatch) -> None:
    import importlib.metadata

    package = tmp_path / "site"
    package.mkdir()
    (package / "my_gla.py").write_text(doc_example().replace('"my-gla"', '"my-gla-installed"'))
    monkeypatch.syspath_prepend(str(package))
    entry = importlib.metadata.EntryPoint("my-gla", "my_gla", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda group: [entry] if group == registry.ENTRY_POINT_GROUP else [],
    )
    monkeypatch.setattr(registry, "_discovered", False)
    monkeypatch.setenv(registry.PLUGIN_ENV, "")
    try:
        assert registry.get_architecture("my-gla-installed").name == "my-gla-installed"
        assert "my-gla-installed" in registry.available_architectures()
    finally:
        registry.ARCHITECTURES.pop("my-gla-installed", None)
        sys.modules.pop("my_gla", None)
