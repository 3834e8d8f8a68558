"""The interchange engine: exactness against the unpatched and naive forms, causality,
site-internal patching, and agreement with a one-forward-per-intervention loop for every
architecture in the registry."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from mecheval.interventions import engine, interchange, patch, prefix, record, reference
from mecheval.models import ARCHITECTURES, ModelConfig, build_model, site_names
from mecheval.models.mixers.base import Mixer
from mecheval.models.mixers.modules import ShortConv
from mecheval.models.sites import name_sites
from mecheval.tasks import ARConfig, ATRConfig, build_datasets, corrupt
from mecheval.tasks.batch import Batch
from mecheval.tasks.scores import answer_scores

AR = ARConfig(kind="ar", n_keys=8, n_values=8, n_pairs=3, n_train=0, n_dev=5, n_test=5)


def ar_pair(n: int = 5, cfg: ARConfig = AR):
    original = build_datasets(cfg)["dev"].batch(torch.arange(n))
    return original, corrupt(original, cfg, seed=3)


def tiny(arch: str, cfg=AR, max_len: int = 16, seed: int = 0):
    torch.manual_seed(seed)
    model_cfg = ModelConfig(
        architecture=arch, d_model=16, vocab_size=cfg.vocab_size(), max_len=max_len
    )
    return build_model(model_cfg).eval()


def p_answer(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return answer_scores(model(batch.tokens, at=batch.query), batch.answer)["likelihood"]


def test_patching_every_position_of_layer0_input_gives_the_original() -> None:
    model = tiny("attention")
    original, corrupted = ar_pair()
    with torch.no_grad(), record(model, ["layers.0.input"]) as source:
        model(original.tokens)
    site = model.get_submodule("layers.0.input")

    def overwrite_all(module, inputs, output):
        return source["layers.0.input"].clone()

    handle = site.register_forward_hook(overwrite_all)
    try:
        restored = p_answer(model, corrupted)
    finally:
        handle.remove()
    assert torch.equal(restored, p_answer(model, original))
    assert not torch.allclose(p_answer(model, corrupted), p_answer(model, original))


def test_patching_nothing_gives_the_corrupted() -> None:
    model = tiny("mamba")
    original, corrupted = ar_pair()
    result = interchange(model, original, corrupted, sites=[], roles=[])
    assert result.value("corrupted") == pytest.approx(p_answer(model, corrupted).mean().item())
    assert result.value("original") == pytest.approx(p_answer(model, original).mean().item())


def test_restoring_the_key_at_the_embedding_undoes_the_corruption() -> None:
    # o and c differ only at the key: restoring layers.0.input there restores p(y|o) exactly.
    model = tiny("attention")
    original, corrupted = ar_pair()
    result = interchange(model, original, corrupted, sites=["layers.0.input"], roles=["key"])
    per_doc = result.per_example
    torch.testing.assert_close(
        torch.tensor(per_doc.restored.values), p_answer(model, original), rtol=1e-6, atol=1e-7
    )


@pytest.mark.parametrize("arch", ["attention", "mamba", "deltanet"])
def test_patching_after_the_query_changes_nothing(arch: str) -> None:
    model = tiny(arch)
    original, corrupted = ar_pair()
    pad = torch.randint(
        3, AR.vocab_size(), (len(corrupted), 4), generator=torch.Generator().manual_seed(0)
    )
    longer = corrupted.with_tokens(torch.cat([corrupted.tokens, pad], dim=1))
    after = longer.query + 2
    # The same padded run unpatched (not the shorter document: another length may round
    # differently in float32 kernels, which says nothing about the patch).
    reference = p_answer(model, longer)
    for site in site_names(model):
        with record(model, [site]) as acts, torch.no_grad():
            model(longer.tokens)
        values = torch.randn_like(acts[site][:, 0]) * 10
        with patch(model, site, after, values):
            assert torch.equal(p_answer(model, longer), reference), site


# The engine-vs-naive comparisons run where every patch matters. At the default init
# (0.02, float32) a patch moves p(answer) by as little as 4e-9 (BaseConv) to 2e-6 (H3) on these
# tiny untrained models -- below the comparison's own tolerance, so an engine that patches
# nothing passed. In float64 with init_std 0.5 the rows that must move (MUST_MOVE below) move by
# at least 4e-3 relative on every architecture (Mamba and attention are the weakest; Mamba's
# init keeps its Linears at PyTorch's default and uses init_std for the embeddings only), and
# the engine and the naive loop agree to float64 round-off (p(answer) is scored in float64,
# tasks/scores.py; the naive loop runs one document per forward, the engine a stacked batch,
# whose kernels may round the last bits differently).
SIGNAL_INIT_STD = 0.5
#: relative tolerance of engine vs naive loop, and of a row that must equal another run
AGREE_RTOL = 1e-9
#: the least relative change of p(answer) a row that must move may show (10^6 x AGREE_RTOL)
MUST_MOVE = 1e-3
ATR = ATRConfig(kind="atr", n_train=0, n_dev=6, n_test=6)
CASES = [*sorted(ARCHITECTURES), "based-atr"]


def signal_model(arch: str, cfg=AR, max_len: int = 16, seed: int = 0):
    torch.manual_seed(seed)
    model_cfg = ModelConfig(
        architecture=arch,
        d_model=16,
        vocab_size=cfg.vocab_size(),
        max_len=max_len,
        init_std=SIGNAL_INIT_STD,
    )
    return build_model(model_cfg).double().eval()


def signal_case(case: str):
    """(model, original, corrupted): AR for an architecture; "based-atr" is Based on
    variable-length ATR documents (right-padded batch, role positions differ per document)."""
    if case != "based-atr":
        original, corrupted = ar_pair(n=4)
        return signal_model(case), original, corrupted
    original = build_datasets(ATR)["dev"].batch(torch.arange(6))
    assert original.lengths.min() < original.lengths.max()  # real padding in the batch
    corrupted = corrupt(original, ATR, seed=1)
    return signal_model("based", cfg=ATR, max_len=original.tokens.shape[1]), original, corrupted


def _rows(result, batch: Batch, site: str, at: str, same: bool):
    """per_example rows of ``site`` whose role position is (``same``) or is not the position
    of role ``at`` in the same document."""
    rows = result.per_example[result.per_example.site == site]
    pos = {role: batch.roles[role].numpy() for role in rows.role.unique()}
    role_pos = [pos[role][doc] for role, doc in zip(rows.role, rows.doc, strict=True)]
    hit = np.array(role_pos) == batch.roles[at].numpy()[rows.doc.to_numpy()]
    return rows[hit if same else ~hit]


def assert_restores_where_it_must(result, model, original: Batch) -> None:
    """(b) Rows that must move: restoring the key at ``layers.0.input`` (the one position
    where o and c differ, before any mixing) or the query at the last block's output /
    ``final_norm.input`` (everything the answer is read from) gives p(y|o) -- and p(y|o) is
    at least MUST_MOVE away from p(y|c) in every document. (c) Rows that must not move:
    ``layers.0.input`` at any other position holds the same embedding in o and c, and
    nothing but the query position reaches the answer from the last block's output on:
    those rows are p(y|c) (to float64 round-off: the naive loop reruns them one document at
    a time)."""
    last = [f"layers.{len(model.layers) - 1}.output", "final_norm.input"]
    checks = [("layers.0.input", "key"), *((site, "query") for site in last)]
    sites = set(result.per_example.site)
    checked = 0
    for site, at in checks:
        if site not in sites:
            continue
        must = _rows(result, original, site, at, same=True)
        restored, orig, corr = (
            torch.tensor(must[col].to_numpy()) for col in ("restored", "original", "corrupted")
        )
        moved = (restored - corr).abs() / torch.maximum(restored, corr)
        assert len(must) and bool((moved >= MUST_MOVE).all()), (
            f"{site} at the {at}: restored must move >= {MUST_MOVE:.0e} (relative) from the "
            f"corrupted, moved {moved.min().item():.2e}"
        )
        torch.testing.assert_close(
            restored, orig, rtol=AGREE_RTOL, atol=0.0, msg=lambda m, s=site, a=at: f"{s}/{a}: {m}"
        )
        still = _rows(result, original, site, at, same=False)
        assert len(still), f"{site} away from the {at}: no rows"
        torch.testing.assert_close(
            torch.tensor(still.restored.to_numpy()),
            torch.tensor(still.corrupted.to_numpy()),
            rtol=1e-12,
            atol=0.0,
            msg=lambda m, s=site, a=at: (
                f"{s} away from the {a}: restored must equal corrupted: {m}"
            ),
        )
        checked += 1
    assert checked, "none of the sites that must move were run"


def assert_engine_equals_naive(model, original: Batch, corrupted: Batch, sites=None, roles=None):
    """The batched engine (several chunks per site) against the one-forward-per-patch loop:
    (a) the same rows and the same values to AGREE_RTOL, then (b)/(c) on both results."""
    fast = engine.interchange(model, original, corrupted, sites=sites, roles=roles, max_batch=4)
    slow = reference.naive_interchange(model, original, corrupted, sites=sites, roles=roles)
    keys = ["condition", "site", "role", "metric"]
    table = fast.table.merge(slow.table, on=keys, how="outer", suffixes=("_fast", "_slow"))
    assert len(table) == len(fast.table) == len(slow.table), "the two report different rows"
    examples = fast.per_example.merge(
        slow.per_example, on=["doc", "site", "role"], how="outer", suffixes=("_fast", "_slow")
    )
    assert len(examples) == len(fast.per_example) == len(slow.per_example) > 0
    for frame, column in [(examples, "restored"), (examples, "original"), (table, "value")]:
        torch.testing.assert_close(
            torch.tensor(frame[f"{column}_fast"].to_numpy(), dtype=torch.float64),
            torch.tensor(frame[f"{column}_slow"].to_numpy(), dtype=torch.float64),
            rtol=AGREE_RTOL,
            atol=1e-12,
            msg=lambda m, column=column: f"engine and naive loop disagree on {column}: {m}",
        )
    assert_restores_where_it_must(slow, model, original)
    assert_restores_where_it_must(fast, model, original)
    return fast, slow


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_batched_equals_naive_loop(arch: str) -> None:
    assert_engine_equals_naive(*signal_case(arch))


def test_batched_equals_naive_on_variable_length_atr() -> None:
    assert_engine_equals_naive(*signal_case("based-atr"))


@pytest.mark.parametrize(
    "layers",
    [
        ["mamba", {"parallel": ["attention", "hyena"]}],
        [{"parallel": ["deltanet", "mamba"], "combine": "concat"}, "attention"],
    ],
    ids=["mamba+attention~hyena", "deltanet~mamba-concat+attention"],
)
def test_batched_equals_naive_on_hybrids(layers: list) -> None:
    """Every site of a hybrid, each parallel branch's own included, restored by the engine
    as by the naive loop."""
    torch.manual_seed(0)
    model_cfg = ModelConfig(
        layers=layers, d_model=16, vocab_size=AR.vocab_size(), max_len=16, init_std=0.5
    )
    model = build_model(model_cfg).double().eval()
    original, corrupted = ar_pair(n=4)
    branch = next(s for s in site_names(model) if ".branches.1.output" in s)
    fast, _ = assert_engine_equals_naive(model, original, corrupted)
    assert branch in set(fast.per_example.site)


def test_rows_of_nearby_positions_start_together(monkeypatch) -> None:
    """With at most two start positions per chunk, rows start before their patch (at the
    earliest position of their group): the same numbers as one batch per position."""
    model = tiny("mamba")
    original, corrupted = ar_pair(n=5)
    per_position = engine.interchange(model, original, corrupted)
    starts = prefix.resume_starts
    seen = []

    def recorded(*args):
        out = starts(*args)
        seen.append((torch.minimum(args[2], args[3]), out))
        return out

    monkeypatch.setattr(prefix, "MAX_START_GROUPS", 2)
    monkeypatch.setattr(prefix, "resume_starts", recorded)
    grouped = engine.interchange(model, original, corrupted)
    moved = [(own, out) for own, out in seen if len(own.unique()) > 2]
    assert moved, "no chunk had more than two positions: the grouping was not exercised"
    for own, out in moved:
        assert len(out.unique()) <= 2 and bool((out <= own).all()) and bool((out < own).any())
    torch.testing.assert_close(
        torch.tensor(grouped.per_example.restored.to_numpy()),
        torch.tensor(per_position.per_example.restored.to_numpy()),
        rtol=0.0,
        atol=1e-6,
    )


def test_a_large_vocabulary_takes_fewer_rows_per_chunk(monkeypatch) -> None:
    """Chunks hold at most LOGITS_PER_CHUNK logits (the paper's 8,192 tokens: 256 rows of
    the default 4096); rows split so, out of their order (sorted by patch position), give
    the engine's numbers."""
    model, original, corrupted = signal_case("attention")
    vocab = model.embedding.num_embeddings
    assert engine._chunk_rows(model, 4096) == min(4096, engine.LOGITS_PER_CHUNK // vocab)
    whole = engine.interchange(model, original, corrupted)
    monkeypatch.setattr(engine, "LOGITS_PER_CHUNK", 3 * vocab)
    assert engine._chunk_rows(model, 4096) == 3
    split = engine.interchange(model, original, corrupted)
    assert split.per_example[["doc", "site", "role"]].equals(
        whole.per_example[["doc", "site", "role"]]
    )
    torch.testing.assert_close(
        torch.tensor(split.per_example.restored.to_numpy()),
        torch.tensor(whole.per_example.restored.to_numpy()),
        rtol=0.0,
        atol=1e-6,
    )


@pytest.mark.parametrize("case", CASES)
def test_the_comparison_fails_when_the_engine_patches_nothing(case: str, monkeypatch) -> None:
    real = engine.interchange

    def patches_nothing(*args, **kwargs):
        # Only inside the engine: the naive loop it is compared with keeps its `patch`.
        with monkeypatch.context() as m:
            m.setattr(engine, "patch", lambda *a, **k: contextlib.nullcontext())
            # No direct overwrite of a cached tensor either: every row is a plain forward.
            m.setattr(engine, "_restart", lambda model, site: ("", 0, False))
            return real(*args, **kwargs)

    model, original, corrupted = signal_case(case)
    sites = ["layers.0.input", "final_norm.input"]
    monkeypatch.setattr(engine, "interchange", patches_nothing)
    with pytest.raises(AssertionError, match="engine and naive loop disagree on restored"):
        assert_engine_equals_naive(model, original, corrupted, sites=sites)
    with pytest.raises(AssertionError, match="must move"):
        assert_restores_where_it_must(
            engine.interchange(model, original, corrupted, sites=sites), model, original
        )


class ConvMixer(Mixer):
    """A mixer whose only sequence mixing is a short causal convolution named `conv`."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.conv = ShortConv(d, kernel_size=2)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def test_site_inside_a_mixer_is_patched_at_the_right_position() -> None:
    model = tiny("attention")
    model.layers[0].mixer = ConvMixer(16)
    name_sites(model)
    original, corrupted = ar_pair()
    site = "layers.0.mixer.conv.output"
    assert site in site_names(model)
    with torch.no_grad(), record(model, [site, "layers.0.mixer.output"]) as plain:
        model(corrupted.tokens)
    base_conv, base_out = plain[site].clone(), plain["layers.0.mixer.output"].clone()
    pos = corrupted.roles["value"]
    values = torch.randn(len(corrupted), 16)
    with (
        torch.no_grad(),
        patch(model, site, pos, values),
        record(model, [site, "layers.0.mixer.output"]) as patched,
    ):
        model(corrupted.tokens)
    rows = torch.arange(len(corrupted))
    torch.testing.assert_close(patched[site][rows, pos], values)
    changed = (patched["layers.0.mixer.output"] != base_out).any(-1)
    expected = torch.zeros_like(changed)
    expected[rows, pos] = True
    assert torch.equal(changed, expected)
    untouched = torch.ones_like(changed)
    untouched[rows, pos] = False
    assert torch.equal(patched[site][untouched], base_conv[untouched])


@pytest.mark.parametrize("arch", ["attention", "mamba"])
def test_patches_that_cannot_reach_the_query_are_not_run(arch: str, monkeypatch) -> None:
    """After the last block's mixer every step is per position, so a patch at the key or
    value changes nothing the head reads: those rows are the corrupted run, exactly, and no
    block or head runs for them beyond the original and corrupted runs. At the query the
    same sites do move p(answer)."""
    model = tiny(arch)
    original, corrupted = ar_pair()
    sites = ["layers.1.mixer.output", "layers.1.output", "final_norm.input"]
    calls = []
    for owner, name in [(model, "head"), *((layer, "forward_from") for layer in model.layers)]:
        real = getattr(owner, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(owner, name, spy)
    out = interchange(model, original, corrupted, sites=sites, roles=["key", "value"])
    assert calls == ["head", "head"]  # the original and the corrupted run
    rows = out.per_example
    assert (rows.restored == rows.corrupted).all() and len(rows) == 3 * 2 * len(original)
    at_query = interchange(model, original, corrupted, sites=sites, roles=["query"])
    assert len(calls) > 4
    assert (at_query.per_example.restored != at_query.per_example.corrupted).any()


def test_a_block_output_and_the_next_input_run_once(monkeypatch) -> None:
    """``layers.0.output`` is ``layers.1.input``'s tensor and ``layers.1.output`` is
    ``final_norm.input``'s: one patched run each, whose restores both sites report."""
    model = tiny("mamba")
    original, corrupted = ar_pair()
    run = []
    real = engine._restore_site

    def spy(sp, *args):
        run.append(sp.site)
        return real(sp, *args)

    monkeypatch.setattr(engine, "_restore_site", spy)
    sites = ["layers.0.output", "layers.1.input", "layers.1.output", "final_norm.input"]
    out = interchange(model, original, corrupted, sites=sites)
    assert run == ["layers.0.output", "layers.1.output"]
    rows = out.per_example.set_index(["site", "role", "doc"]).restored
    for first, second in [(0, 1), (2, 3)]:
        assert rows[sites[first]].equals(rows[sites[second]])
    assert (rows[sites[0]] != rows[sites[2]]).any()
    monkeypatch.setattr(engine, "_restore_site", real)
    alone = interchange(model, original, corrupted, sites=[sites[1], sites[3]])
    alone_rows = alone.per_example.set_index(["site", "role", "doc"]).restored
    assert alone_rows.equals(rows.loc[[sites[1], sites[3]]])


def test_patch_removes_its_hook_even_when_the_forward_fails() -> None:
    model = tiny("attention")
    site = model.get_submodule("layers.0.input")
    with (
        pytest.raises(ValueError, match="positions"),
        patch(model, "layers.0.input", torch.zeros(2, dtype=torch.long), torch.zeros(2, 16)),
    ):
        model(torch.zeros(3, 5, dtype=torch.long))
    assert not site._forward_hooks


def test_attribution_names_the_best_role() -> None:
    model = tiny("attention")
    original, corrupted = ar_pair(n=5)
    result = interchange(model, original, corrupted, sites=["layers.0.input"])
    best = result.attribution.set_index("doc")
    examples = result.per_example
    # Restoring the key at the embedding gives p(y|o) exactly; every other role leaves the
    # corrupted key in place. So wherever o beats every other restore, the key is best.
    checked = 0
    for doc, rows in examples.groupby("doc"):
        others = rows[rows.role != "key"].restored.max()
        if rows.original.iloc[0] > others + 1e-6:
            assert best.loc[doc, "role"] == "key"
            assert best.loc[doc, "restored"] == pytest.approx(rows.original.iloc[0])
            checked += 1
    assert checked > 0 and len(best) == 5


def test_a_new_score_reaches_training_metrics_and_the_engine(monkeypatch) -> None:
    """docs/architecture.md, "How to add a metric": one SCORES entry is evaluated by
    training; naming it in RESTORE_METRICS reports it per site and role, and the engine's
    numbers are the training scorer's (one function for both; the float32 model's batches
    differ in shape, hence 1e-6)."""
    from mecheval.interventions import result
    from mecheval.tasks import scores
    from mecheval.training.metrics import evaluate

    monkeypatch.setitem(
        scores.SCORES, "p_top", lambda dist, answer, candidates: dist.full.max(-1).values.exp()
    )
    monkeypatch.setattr(result, "RESTORE_METRICS", (*result.RESTORE_METRICS, "p_top"))
    model = tiny("attention")
    dev = build_datasets(AR)["dev"]
    got = evaluate(model, dev, batch_size=4)
    assert set(got) == {
        "likelihood",
        "accuracy",
        "loss",
        "in_context_mass",
        "in_context_accuracy",
        "p_top",
    }
    with torch.no_grad():
        probs = torch.softmax(model(dev.tokens, at=dev.roles["query"]).double(), -1)
    assert got["p_top"] == pytest.approx(probs.max(-1).values.mean().item(), rel=1e-6)
    assert got["likelihood"] == pytest.approx(
        probs.gather(1, dev.answer[:, None]).mean().item(), rel=1e-6
    )

    original = dev.batch(torch.arange(len(dev)))
    result = interchange(model, original, corrupt(original, AR, seed=3), sites=["layers.0.input"])
    table = result.table
    at_original = table[(table.condition == "original") & (table.metric == "p_top")]
    assert at_original.value.item() == pytest.approx(got["p_top"], rel=1e-6)
    restored = table[(table.condition == "restored") & (table.metric == "p_top")]
    assert set(restored.role) == set(original.roles)
