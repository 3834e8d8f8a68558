"""Hybrids: a model whose layers are of different architectures (``model.layers``).

Layers all alike are the one-architecture config itself; a hybrid's blocks are each its own
architecture's (mixer, options, MLP, norm, init); it trains, stacks, resumes from a
checkpoint and from a prefix as a one-architecture model does; bad layers are one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from small_runs import config, run_cli

from mecheval.errors import ConfigError
from mecheval.experiments.catalog import HYBRID_PARTS, get_experiment
from mecheval.experiments.grid import expand, name_part
from mecheval.experiments.plan import plan_runs
from mecheval.interventions.patch import record
from mecheval.interventions.prefix import prefix_cache, run_from
from mecheval.models import ARCHITECTURES, ModelConfig, build_model, count_parameters
from mecheval.models.mixers.attention import Attention
from mecheval.models.mixers.mamba import Mamba
from mecheval.models.mixers.parallel import ParallelMixer
from mecheval.models.registry import architecture_label
from mecheval.models.sites import layer_site, site_names
from mecheval.tasks import build_datasets
from mecheval.training import read_status, resolve, train
from mecheval.training.stacking.group import train_group


def hybrid(layers: list, **model) -> ModelConfig:
    return ModelConfig(layers=layers, **{"d_model": 16, "vocab_size": 11, "max_len": 13, **model})


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_layers_all_alike_are_the_one_architecture_config(arch: str) -> None:
    """The same resolved config (so the same run name, run folder and weights)."""
    plain = resolve(config(arch, model={"n_layers": 3}))
    listed = resolve(config(arch, model={"layers": [arch] * 3, "n_layers": 5}))
    assert listed == plain and listed.model.layers is None
    assert not listed.model.is_hybrid


def test_a_hybrid_builds_each_layer_as_its_own_architecture() -> None:
    cfg = hybrid(["mamba", {"architecture": "attention", "mixer": {"num_heads": 2}}, "mamba"])
    assert (cfg.architecture, cfg.n_layers, cfg.is_hybrid) == ("mamba+attention+mamba", 3, True)
    assert architecture_label(cfg.architecture) == "Mamba+Attention+Mamba"
    torch.manual_seed(0)
    model = build_model(cfg)
    mamba, attention, last = (layer for layer in model.layers)
    assert isinstance(mamba.mixer, Mamba) and isinstance(last.mixer, Mamba)
    assert isinstance(attention.mixer, Attention) and attention.mixer.num_heads == 2
    # Mamba's blocks: RMSNorm and no MLP; attention's: LayerNorm and an MLP.
    assert mamba.mlp is None and type(mamba.mixer_norm).__name__ == "RMSNorm"
    assert attention.mlp is not None and isinstance(attention.mixer_norm, torch.nn.LayerNorm)
    # Each block's init is its own architecture's: PyTorch's kaiming-uniform for Mamba's
    # in_proj (std 1/sqrt(3 * 16) = 0.14), N(0, 0.02) for attention's projections.
    assert 0.1 < float(mamba.mixer.in_proj.weight.detach().std()) < 0.2
    assert 0.015 < float(attention.mixer.qkv.weight.detach().std()) < 0.025
    # Positions are off unless every layer's architecture has them on.
    assert model.position is None


@pytest.mark.parametrize("pair", [("mamba", "attention"), ("attention", "gated_deltanet")])
def test_a_two_layer_hybrid_is_its_two_architectures_composed_by_hand(pair) -> None:
    """The hybrid's forward is the embedding, block 0 of a model of the first architecture,
    block 1 of a model of the second (each given the hybrid's weights) and the head."""
    torch.manual_seed(0)
    model = build_model(hybrid(list(pair))).double().eval()
    blocks = []
    for j, arch in enumerate(pair):
        alone = build_model(hybrid([arch, arch])).double().eval()
        alone.layers[j].load_state_dict(model.layers[j].state_dict())
        blocks.append(alone.layers[j])
    tokens = torch.randint(0, 11, (3, 13), generator=torch.Generator().manual_seed(1))
    at = torch.tensor([12, 5, 9])
    with torch.no_grad():
        x = model.embed(tokens)
        for block in blocks:
            x = block(x)
        by_hand = model.head(x, at)
        torch.testing.assert_close(model(tokens, at=at), by_hand, rtol=1e-12, atol=1e-12)
        swapped = model.head(blocks[0](blocks[1](model.embed(tokens))), at)
        assert not torch.allclose(swapped, by_hand)  # the order of the layers matters


def test_a_hybrid_in_config_yaml_reads_back_as_itself(tmp_path: Path) -> None:
    cfg = resolve(config(model={"layers": ["mamba", "attention"]}))
    status = train(cfg, tmp_path / "run")
    assert status["state"] == "done"
    assert cfg.name == "ar-mamba+attention-d16-L2-lr0.003-s0"
    from mecheval.training.config import load_config

    assert load_config(tmp_path / "run" / "config.yaml") == cfg


@pytest.mark.parametrize(
    ("layers", "extra", "message"),
    [
        ([], {}, "model.layers: expected 1 to 64 layers, got 0"),
        (["mamba", "mambo"], {}, "model.layers.1.architecture: unknown 'mambo'"),
        (
            [{"architecture": "mamba", "mixer": {"d_state": 0}}, "attention"],
            {},
            "model.layers.0.mixer.d_state",
        ),
        (
            ["mamba", "attention"],
            {"mixer": {"d_state": 4}},
            "model.layers: model.mixer is set too",
        ),
        ([{"architecture": "mamba", "width": 2}, "attention"], {}, "model.layers.0.width"),
    ],
)
def test_bad_layers_are_one_line_naming_the_field(layers, extra, message) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(config(model={"layers": layers, **extra}))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_bad_layer_from_the_command_line_writes_nothing(tmp_path, monkeypatch, capsys) -> None:
    code, _, err = run_cli(
        monkeypatch, capsys, "train", "--preset", "tiny", "--out", str(tmp_path),
        "--set", "model.layers=[mamba,mambo]",
    )  # fmt: skip
    assert code == 2 and "model.layers.1.architecture: unknown 'mambo'" in err
    assert list(tmp_path.iterdir()) == []


def test_hybrids_stack_as_one_architecture_does(tmp_path: Path) -> None:
    """Two hybrids differing in LR and seed, stacked, end as they end trained one by one."""
    data = build_datasets(resolve(config()).task)
    layers = {"layers": ["mamba", "attention"]}
    cfgs = [config(model=layers, lr=3e-3, seed=0), config(model=layers, lr=1e-2, seed=1)]
    stacked = train_group(cfgs, [tmp_path / "g0", tmp_path / "g1"], datasets=data)
    assert [s["state"] for s in stacked] == ["done", "done"]
    for i, cfg in enumerate(cfgs):
        train(cfg, tmp_path / f"s{i}", datasets=data)
        group, alone = (load_file(tmp_path / f"{w}{i}" / "model.safetensors") for w in "gs")
        assert group.keys() == alone.keys()
        for key in group:
            torch.testing.assert_close(group[key], alone[key], rtol=1e-4, atol=5e-5)


def test_a_hybrid_resumes_from_its_checkpoint_as_if_never_stopped(tmp_path: Path) -> None:
    data = build_datasets(resolve(config()).task)
    cfg = config(model={"layers": ["deltanet", "attention"]}, checkpoint_every=4)
    train(cfg, tmp_path / "whole", datasets=data)

    def crash(step, model, run_dir):
        if step == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "split", datasets=data, callbacks=[crash])
    assert read_status(tmp_path / "split")["state"] == "failed"
    assert train(cfg, tmp_path / "split", datasets=data)["state"] == "done"
    whole, split = (load_file(tmp_path / w / "model.safetensors") for w in ("whole", "split"))
    assert all(torch.equal(whole[k], split[k]) for k in whole)


@pytest.mark.parametrize(
    "layers",
    [
        ["mamba", "attention", "hyena"],
        ["attention", "gated_deltanet", "mamba2"],
        [
            {"parallel": ["attention", "mamba"]},
            "deltanet",
            {"parallel": ["gla", "h3"], "combine": "concat"},
        ],
    ],
    ids=["mamba+attention+hyena", "attention+gated_deltanet+mamba2", "parallel"],
)
@pytest.mark.parametrize("resume", [True, False], ids=["resumed", "window"])
def test_a_hybrid_runs_from_any_block_and_position(layers: list[str], resume: bool) -> None:
    """The interventions' block-by-block resumption (each block from its own mixer's prefix
    states, or its window recomputed) gives the full model's logits, in float64."""
    torch.manual_seed(0)
    model = build_model(hybrid(layers)).double().eval()
    for layer in model.layers:
        layer.mixer.resume_from_prefix = resume
    tokens = torch.randint(0, 11, (4, 13), generator=torch.Generator().manual_seed(2))
    at = torch.tensor([12, 6, 9, 12])
    inputs = [layer_site(j, "input") for j in range(len(layers))]
    with torch.no_grad(), record(model, [*inputs, "final_norm.input"]) as acts:
        expected = model(tokens, at=at)
    cache = prefix_cache(model, [acts[site] for site in inputs])
    with torch.no_grad():
        for first in range(len(layers) + 1):
            entering = acts[inputs[first] if first < len(layers) else "final_norm.input"]
            for start in (0, 3, 6):
                got = run_from(model, cache, first, torch.arange(4), start, entering[:, start:], at)
                torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_a_parallel_layer_runs_its_branches_on_one_input() -> None:
    """Summed, its output is its branches' outputs added (each computed here on its own);
    concatenated, projected by out_proj; each branch initialised by its own architecture, a
    branch's sites addressable by name."""
    cfg = hybrid(
        [
            {"parallel": ["attention", "mamba"]},
            {"parallel": ["mamba", "hyena"], "combine": "concat"},
        ]
    )
    assert cfg.architecture == "attention~mamba+mamba~hyena"
    assert architecture_label(cfg.architecture) == "Attention~Mamba+Mamba~Hyena"
    torch.manual_seed(0)
    model = build_model(cfg).double()
    summed, concat = model.layers[0].mixer, model.layers[1].mixer
    assert isinstance(summed, ParallelMixer) and isinstance(concat, ParallelMixer)
    attention, mamba = summed.branches
    assert isinstance(attention, Attention) and isinstance(mamba, Mamba)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(summed(x), attention(x) + mamba(x))
        a, b = (branch(x) for branch in concat.branches)
        torch.testing.assert_close(concat(x), torch.cat([a, b], -1) @ concat.out_proj.weight.T)
    # The block is its first branch's architecture's: attention's MLP, Mamba's none.
    assert model.layers[0].mlp is not None and model.layers[1].mlp is None
    assert 0.1 < float(mamba.in_proj.weight.detach().std()) < 0.2  # kaiming-uniform
    assert 0.015 < float(attention.qkv.weight.detach().std()) < 0.025  # N(0, 0.02)
    assert {"layers.0.mixer.branches.0.output", "layers.1.mixer.branches.1.output"} <= set(
        site_names(model)
    )


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        ({"parallel": ["mamba"]}, "at least 2 branches"),
        (
            {"parallel": ["mamba", "attention"], "architecture": "mamba"},
            "either architecture or parallel",
        ),
        ({"parallel": ["mamba", {"parallel": ["attention", "hyena"]}]}, "not parallel again"),
        ({"parallel": ["mamba", "attention"], "combine": "max"}, "model.layers.0.combine"),
        (
            {"parallel": [{"architecture": "mamba", "mixer": {"d_state": 0}}, "attention"]},
            "model.layers.0.parallel.0.mixer.d_state",
        ),
    ],
)
def test_bad_parallel_layers_are_one_line(layer: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(config(model={"layers": [layer, "attention"]}))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_parallel_hybrid_stacks_as_one_architecture_does(tmp_path: Path) -> None:
    data = build_datasets(resolve(config()).task)
    layers = {"layers": [{"parallel": ["attention", "mamba"], "combine": "concat"}, "attention"]}
    cfgs = [config(model=layers, lr=3e-3, seed=0), config(model=layers, lr=1e-2, seed=1)]
    train_group(cfgs, [tmp_path / "g0", tmp_path / "g1"], datasets=data)
    for i, cfg in enumerate(cfgs):
        train(cfg, tmp_path / f"s{i}", datasets=data)
        group, alone = (load_file(tmp_path / f"{w}{i}" / "model.safetensors") for w in "gs")
        for key in group:
            torch.testing.assert_close(group[key], alone[key], rtol=1e-4, atol=5e-5)


def test_a_layers_grid_names_runs_by_the_models_architecture() -> None:
    assert name_part("model.layers", ["mamba", "attention"]) == "mamba+attention"
    assert name_part("model.layers", ["hyena", "hyena"]) == "hyena"
    parallel = [{"parallel": ["attention", "mamba"], "combine": "concat"}, "attention"]
    assert name_part("model.layers", parallel) == "attention~mamba+attention"


def test_the_hybrids_experiment_pairs_every_architecture_under_one_recipe() -> None:
    experiment = get_experiment("hybrids")
    runs = expand(experiment.sweep("quick"))
    parts = HYBRID_PARTS
    expected = [
        f"{t}-{a}+{b}-d64" if a != b else f"{t}-{a}-d64"
        for t in ("ar", "mqar")
        for a in parts
        for b in parts
    ]
    assert [run.name for run in runs[:50]] == expected
    cfgs = plan_runs(experiment.sweep("quick"), Path("unused"))[:50]
    recipes = {(c.cfg.training.lr, c.cfg.training.epochs, c.cfg.model.d_model) for c in cfgs}
    assert recipes == {(3e-3, 2, 64)}
    assert {(c.cfg.task.n_pairs, c.cfg.model.n_layers) for c in cfgs} == {(4, 2)}
    assert {c.cfg.training.stop_at_accuracy for c in cfgs} == {0.99}
    assert len(expand(experiment.sweep("paper"))) == 65 * 7  # d = 64, the paper's seven LRs
    with pytest.raises(ConfigError, match="takes no --archs"):
        experiment.sweep("quick", archs=["mamba"])


def test_the_hybrids_put_attention_at_each_depth_of_four() -> None:
    experiment = get_experiment("hybrids")
    runs = plan_runs(experiment.sweep("quick"), Path("unused"))[50:]
    names = [run.cfg.model.architecture for run in runs]
    assert len(names) == len(set(names)) == 15
    for other in ("mamba", "gated_deltanet"):
        for depth in range(4):
            layers = [other] * 4
            layers[depth] = "attention"
            assert "+".join(layers) in names
    assert "mamba+mamba+attention~mamba+mamba" in names
    tasks = {(r.cfg.task.kind, r.cfg.task.n_pairs, r.cfg.model.n_layers) for r in runs}
    assert tasks == {("mqar", 8, 4)}
    assert runs[1].run_dir.name == "mqar-mamba-d64-pairs8"  # apart from the two-layer Mamba
    # One epoch of 3,126 steps, each run stopped at 99 % dev accuracy once it learns.
    assert {(r.cfg.training.epochs, r.cfg.training.stop_at_accuracy) for r in runs} == {(1, 0.99)}
    # A user's tasks keep the part's own: AR alone runs no four-layer model.
    assert len(expand(experiment.sweep("quick", tasks=["ar"]))) == 25
    assert len(expand(experiment.sweep("quick", tasks=["mqar"]))) == 25 + 15
    paper = plan_runs(experiment.sweep("paper"), Path("unused"))[50 * 7 :]
    assert {(r.cfg.task.n_pairs, r.cfg.model.n_layers) for r in paper} == {(16, 4)}


def test_models_list_counts_a_hybrid(monkeypatch, capsys) -> None:
    code, out, _ = run_cli(monkeypatch, capsys, "models", "list", "--layers", "mamba,attention")
    expected = count_parameters(
        build_model(hybrid(["mamba", "attention"], d_model=64, vocab_size=8192, max_len=64))
    )
    row = next(line for line in out.splitlines() if "mamba+attention" in line)
    assert f"{expected:,}" in row and "layers.1.mlp.output" in out
    code, _, err = run_cli(monkeypatch, capsys, "models", "list", "--layers", "[mamba, mambo]")
    assert code == 2 and "model.layers.1.architecture: unknown 'mambo'" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_hybrids_stack_and_replay_as_they_train_alone(tmp_path: Path, monkeypatch) -> None:
    """On a GPU: a stack of two hybrids (a parallel layer among them), its step replayed as
    a CUDA graph, ends as each trained alone with the eager single-run trainer."""
    data = build_datasets(resolve(config()).task)
    layers = {"layers": [{"parallel": ["attention", "mamba"]}, "gated_deltanet"]}
    cfgs = [
        config(model=layers, lr=3e-3, seed=s, device="cuda", steps=12, eval_every=6) for s in (0, 1)
    ]
    train_group(cfgs, [tmp_path / "g0", tmp_path / "g1"], datasets=data)
    monkeypatch.setenv("MECHEVAL_CUDA_GRAPH", "0")
    for i, cfg in enumerate(cfgs):
        train(cfg, tmp_path / f"s{i}", datasets=data)
    for i in range(2):
        group, alone = (load_file(tmp_path / f"{w}{i}" / "model.safetensors") for w in "gs")
        for key in group:
            torch.testing.assert_close(group[key], alone[key], rtol=1e-4, atol=5e-5)
