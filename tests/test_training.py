"""Training recipe units: config loading and errors, the LR schedule, answer-only loss,
behavioural metrics, atomic writes and checkpoints."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mecheval.errors import ConfigError
from mecheval.io import atomic_save_safetensors, atomic_write_csv, atomic_write_text
from mecheval.models import ModelConfig, build_model
from mecheval.tasks import Batch
from mecheval.training import (
    RunConfig,
    answer_loss,
    dump_yaml,
    evaluate,
    load_config,
    lr_factor,
    make_scheduler,
    resolve,
    total_steps,
)
from mecheval.training.checkpoint import load_checkpoint, save_checkpoint
from mecheval.training.config import config_from_data
from mecheval.training.metrics import MetricsLog, read_rows
from mecheval.training.presets import preset
from mecheval.training.trainer import epoch_order, init_model, make_optimizer

VOCAB = 19
T = 12


def tiny_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(ModelConfig(d_model=16, vocab_size=VOCAB, max_len=T))


def hand_batch(b: int = 4, query: int = 7, seed: int = 0) -> Batch:
    """Documents whose query sits at ``query`` followed by non-pad junk up to T."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, VOCAB, (b, T), generator=g)
    pos = torch.full((b,), query)
    roles = {
        "key": pos - 6,
        "value": pos - 5,
        "next_key": pos - 4,
        "divider": pos - 1,
        "query": pos,
    }
    return Batch(tokens, torch.randint(3, VOCAB, (b,), generator=g), roles)


def write_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


BASE_YAML = """
task: {kind: ar, n_keys: 8, n_values: 8, n_pairs: 2, n_train: 640, n_dev: 64, n_test: 64}
model: {architecture: attention, d_model: 16}
training: {lr: 3.0e-3, steps: 40}
"""


# ---------------------------------------------------------------------------- config


def test_load_config_with_overrides(tmp_path: Path) -> None:
    cfg = load_config(
        write_yaml(tmp_path, BASE_YAML),
        ["training.lr=1e-4", "model.d_model=32", "training.eval_splits=[dev]", "name=abc"],
    )
    assert cfg.training.lr == pytest.approx(1e-4)
    assert cfg.model.d_model == 32
    assert cfg.training.eval_splits == ["dev"]
    assert cfg.name == "abc"
    assert cfg.training.betas == (0.9, 0.999) and cfg.training.weight_decay == 0.0


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("training.lrr=1", "training.lrr"),
        ("training.lr=-1", "training.lr"),
        ("training.batch_size=abc", "training.batch_size"),
        ("training.warmup_fraction=2", "training.warmup_fraction"),
        ("model.d_model=0", "model.d_model"),
        ("training.device=tpu", "training.device"),
        ("training.betas=[0.9, 1.5]", "training.betas"),
        ("bogus=1", "bogus"),
        ("training.lr", "training.lr"),  # no '='
        ("training.lr.x=1", "training.lr"),  # through a scalar
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, override: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write_yaml(tmp_path, BASE_YAML), [override])
    message = str(info.value)
    assert field in message
    assert "\n" not in message


def test_bad_task_field_and_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="task"):
        load_config(write_yaml(tmp_path, BASE_YAML), ["task.kind=xyz"])
    with pytest.raises(ConfigError, match="n_pairs"):
        load_config(write_yaml(tmp_path, BASE_YAML), ["task.n_pairs=-3"])
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(write_yaml(tmp_path, "task: [unclosed"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_resolve_fills_and_round_trips(tmp_path: Path) -> None:
    cfg = resolve(load_config(write_yaml(tmp_path, BASE_YAML)))
    assert cfg.model.vocab_size is not None and cfg.model.max_len is not None
    assert cfg.training.eval_every is not None and cfg.training.checkpoint_every is not None
    assert cfg.name
    path = tmp_path / "resolved.yaml"
    path.write_text(dump_yaml(cfg))
    again = load_config(path)
    assert again == cfg
    assert resolve(again) == cfg  # idempotent
    # Configs load on libyaml's parser where PyYAML has it (mecheval.io): the values are
    # PyYAML's own, for the repository's configs and a resolved one alike.
    import yaml

    from mecheval.io import load_yaml

    root = Path(__file__).resolve().parents[1] / "configs"
    for text in [dump_yaml(cfg), *(p.read_text() for p in sorted(root.glob("*.yaml")))]:
        assert load_yaml(text) == yaml.safe_load(text)


def test_epochs_default_by_task_kind(tmp_path: Path) -> None:
    cfg = load_config(write_yaml(tmp_path, BASE_YAML), ["training.steps=null"])
    assert total_steps(cfg) == 16 * (640 // 32)  # paper: 16 epochs for AR
    cfg = load_config(write_yaml(tmp_path, BASE_YAML), ["training.steps=null", "training.epochs=2"])
    assert total_steps(cfg) == 2 * 20
    assert resolve(cfg).training.epochs == 2


def test_resolve_rejects_short_max_len(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model.max_len"):
        resolve(load_config(write_yaml(tmp_path, BASE_YAML), ["model.max_len=2"]))


def test_presets_validate() -> None:
    for name in ("paper", "quick"):
        cfg = config_from_data(preset(name, "ar", "attention"))
        assert cfg.task.kind == "ar"
    paper = config_from_data(preset("paper", "ar"))
    assert (paper.training.batch_size, paper.training.lr, paper.training.epochs) == (32, 1e-3, 16)
    quick = config_from_data(preset("quick", "ar", "mamba"))
    assert quick.model.architecture == "mamba" and quick.model.init_std == 0.1
    with pytest.raises(ConfigError, match="--preset"):
        preset("huge", "ar")


# ---------------------------------------------------------------------------- schedule


def test_schedule_values() -> None:
    total, warmup = 100, 10
    assert lr_factor(0, total, warmup) == 0.0
    assert lr_factor(5, total, warmup) == pytest.approx(0.5)
    assert lr_factor(warmup, total, warmup) == 1.0
    assert lr_factor(55, total, warmup) == pytest.approx(0.5)  # cosine midpoint
    assert lr_factor(total, total, warmup) == pytest.approx(0.0, abs=1e-12)

    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=2e-3)
    scheduler = make_scheduler(optimizer, total, warmup)
    lrs = []
    for _ in range(total):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[warmup] == pytest.approx(2e-3)  # end of warm-up: the peak LR
    assert max(lrs) == pytest.approx(2e-3)
    assert all(a < b for a, b in zip(lrs[:warmup], lrs[1 : warmup + 1], strict=True))
    assert all(a >= b for a, b in zip(lrs[warmup:], lrs[warmup + 1 :], strict=False))
    assert lrs[-1] < 2e-3 * 1e-3  # the last step trains at ≈ 0
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-15)


# ---------------------------------------------------------------------------- loss


def test_loss_equals_masked_full_sequence_loss() -> None:
    model = tiny_model()
    batch = hand_batch()
    full = model(batch.tokens)  # [B, T, V]
    targets = torch.full_like(batch.tokens, -100)  # -100: ignored, i.e. masked
    targets[torch.arange(len(batch)), batch.query] = batch.answer
    expected = F.cross_entropy(full.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(answer_loss(model, batch), expected)


def test_gradient_flows_only_from_answer_position() -> None:
    model = tiny_model()
    batch = hand_batch(query=7)
    captured = {}

    def keep(module, inputs, output):
        output.retain_grad()
        captured["emb"] = output

    handle = model.embedding.register_forward_hook(keep)
    try:
        answer_loss(model, batch).backward()
    finally:
        handle.remove()
    grad = captured["emb"].grad
    assert torch.all(grad[:, 8:] == 0)  # tokens after the query never reach the loss
    assert torch.all(grad[:, :8].abs().sum(-1) > 0)  # every token up to the query does


def test_loss_ignores_non_answer_targets() -> None:
    model = tiny_model()
    batch = hand_batch(query=7)
    base = answer_loss(model, batch)
    # Tokens after the query are the next-token targets of positions that are masked.
    tokens = batch.tokens.clone()
    tokens[:, 8:] = (tokens[:, 8:] + 1) % VOCAB
    assert answer_loss(model, batch.with_tokens(tokens)).item() == base.item()
    other = Batch(batch.tokens, (batch.answer + 1) % VOCAB, batch.roles)
    assert answer_loss(model, other).item() != base.item()


# ---------------------------------------------------------------------------- metrics


class ListDataset:
    def __init__(self, batch: Batch) -> None:
        self.data = batch

    def __len__(self) -> int:
        return len(self.data)

    def iter_batches(self, batch_size, shuffle, generator=None, drop_last=False):
        for i in range(0, len(self.data), batch_size):
            yield self.data.select(slice(i, i + batch_size))


def test_evaluate_matches_definition() -> None:
    model = tiny_model().eval()
    batch = hand_batch(b=10)
    with torch.no_grad():
        probs = torch.softmax(model(batch.tokens)[torch.arange(10), batch.query].double(), -1)
    p = probs[torch.arange(10), batch.answer]
    got = evaluate(model, ListDataset(batch), batch_size=3)
    assert got["likelihood"] == pytest.approx(p.mean().item(), rel=1e-6)
    assert got["accuracy"] == pytest.approx(
        (probs.argmax(-1) == batch.answer).double().mean().item()
    )
    assert got["loss"] == pytest.approx(-p.log().mean().item(), rel=1e-6)
    assert model.training is False  # evaluate restores the mode it found


def test_metrics_log_round_trip_exact(tmp_path: Path) -> None:
    import pandas as pd

    log = MetricsLog(tmp_path / "metrics.csv")
    log.add(0, "dev", {"likelihood": 1 / 3, "accuracy": 0.1 + 0.2})
    log.add(5, "train", {"running_loss": float("nan")})
    log.flush()
    rows = read_rows(tmp_path / "metrics.csv")
    assert rows[0].value == 1 / 3 and rows[1].value == 0.1 + 0.2
    assert math.isnan(rows[2].value)
    frame = pd.read_csv(tmp_path / "metrics.csv")
    assert list(frame.columns) == ["step", "split", "metric", "value"]
    log.truncate(0)
    assert len(log.rows) == 2


# ---------------------------------------------------------------------------- io, checkpoint


def test_atomic_writes_leave_no_temp_files(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "a" / "x.txt", "one")
    atomic_write_text(tmp_path / "a" / "x.txt", "two")
    atomic_write_csv(tmp_path / "a" / "y.csv", ["a"], [[1.5]])
    atomic_save_safetensors(tmp_path / "a" / "z.safetensors", {"w": torch.ones(2)})
    assert (tmp_path / "a" / "x.txt").read_text() == "two"
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["x.txt", "y.csv", "z.safetensors"]


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    cfg = resolve(load_config(write_yaml(tmp_path, BASE_YAML)))
    model = init_model(cfg)
    optimizer = make_optimizer(model, cfg)
    scheduler = make_scheduler(optimizer, 40, 4)
    g = torch.Generator().manual_seed(0)
    length, vocab = cfg.model.max_len, cfg.model.vocab_size
    batch = Batch(
        torch.randint(0, vocab, (4, length), generator=g),
        torch.randint(0, vocab, (4,), generator=g),
        {"query": torch.full((4,), length - 1)},
    )
    for _ in range(3):
        optimizer.zero_grad()
        answer_loss(model, batch).backward()
        optimizer.step()
        scheduler.step()
    torch.manual_seed(123)
    save_checkpoint(tmp_path / "ck", 3, model, optimizer, scheduler, {"x": 1.25})
    expected_draw = torch.rand(3)
    assert not list((tmp_path / "ck").glob("*.pt"))

    model2 = init_model(
        cfg.model_copy(update={"training": cfg.training.model_copy(update={"seed": 9})})
    )
    optimizer2 = make_optimizer(model2, cfg)
    scheduler2 = make_scheduler(optimizer2, 40, 4)
    step, scalars = load_checkpoint(tmp_path / "ck", model2, optimizer2, scheduler2)
    assert (step, scalars) == (3, {"x": 1.25})
    assert torch.equal(torch.rand(3), expected_draw)  # RNG restored
    for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert scheduler2.last_epoch == scheduler.last_epoch
    assert optimizer2.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    # One more identical step from both keeps them identical (optimizer moments restored).
    for m, o in ((model, optimizer), (model2, optimizer2)):
        o.zero_grad()
        answer_loss(m, batch).backward()
        o.step()
    for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_epoch_order_is_a_function_of_seed_and_epoch() -> None:
    a = epoch_order(100, seed=1, epoch=0)
    assert torch.equal(a, epoch_order(100, seed=1, epoch=0))
    assert sorted(a.tolist()) == list(range(100))
    assert not torch.equal(a, epoch_order(100, seed=1, epoch=1))
    assert not torch.equal(a, epoch_order(100, seed=2, epoch=0))


def test_run_config_requires_task() -> None:
    with pytest.raises(Exception, match="task"):
        RunConfig.model_validate({})


# ---------------------------------------------------------------------------- extra queries


def test_extend_queries_keeps_the_paper_document_as_prefix() -> None:
    from mecheval.tasks import ARConfig, build_datasets
    from mecheval.tasks.ar import extend_queries
    from mecheval.tasks.base import torch_generator

    task = ARConfig(n_keys=10, n_values=10, n_pairs=5, n_train=8, n_dev=1, n_test=1)
    batch = build_datasets(task)["train"].batch(torch.arange(8))
    tokens, positions, answers = extend_queries(batch, 4, torch_generator(0, 1, two_words=True))
    d = int(batch.roles["divider"][0])
    assert torch.equal(tokens[:, : batch.tokens.shape[1]], batch.tokens)
    assert positions.tolist() == [d + 1, d + 3, d + 5, d + 7]
    assert torch.equal(answers[:, 0], batch.answer)
    pairs = {
        (row, int(batch.tokens[row, i]), int(batch.tokens[row, i + 1]))
        for row in range(8)
        for i in range(1, d, 2)
    }
    for row in range(8):
        asked = tokens[row, positions].tolist()
        assert len(set(asked)) == 4  # distinct keys
        for j, pos in enumerate(positions.tolist()):
            assert (row, int(tokens[row, pos]), int(answers[row, j])) in pairs
            if j + 1 < 4:
                assert int(tokens[row, pos + 1]) == int(answers[row, j])  # teacher forcing
    again = extend_queries(batch, 4, torch_generator(0, 1, two_words=True))
    assert torch.equal(again[0], tokens)


def test_multi_answer_loss_with_one_query_is_answer_loss() -> None:
    from mecheval.training.metrics import multi_answer_loss

    model = tiny_model()
    batch = hand_batch(query=T - 1)
    one = multi_answer_loss(model, batch.tokens, torch.tensor([T - 1]), batch.answer[:, None])
    torch.testing.assert_close(one, answer_loss(model, batch))


def test_train_queries_validation(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, BASE_YAML)
    cfg = resolve(load_config(path, ["training.train_queries=2"]))
    assert cfg.model.max_len == 1 + 2 * 2 + 2 + 2  # room for one extra answer and query
    with pytest.raises(ConfigError, match="training.train_queries"):
        resolve(load_config(path, ["training.train_queries=3"]))  # only 2 pairs
    with pytest.raises(ConfigError, match="training.train_queries"):
        resolve(load_config(path, ["training.train_queries=2", "task.min_pairs=1"]))
