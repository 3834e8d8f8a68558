"""Each check of the architecture contract (mecheval.contract, ``mecheval check-mixer``)
fails on a small mixer that breaks what the check guards, with a message that names it. Every
other check that fails on that mixer is listed, and why; the rest pass.

One property cannot be broken by a mixer alone: ``model(tokens, at=q)`` never reaches the
mixer (``at`` only selects positions in the shared head), so a deterministic, stateless mixer
computes the same thing both ways. The query-logits check also compares with the prefix
that ends at q, which a mixer can break (its output depends on the length); its head-path
half is broken here by patching the backbone's head instead.

The interchange check must fail for an intervention engine that does not do its job, on
every built-in architecture. At the default init (0.02) no restore moved the mean p(answer)
by more than 4e-9..4e-6 on 5 of the 7, under the old 1e-5 engine-vs-naive tolerance, so an
engine that restored nothing passed; the check now builds its model at a large init, in
float64, and requires what a restore must give.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from mecheval.contract import CHECKS, CheckFailed, run_checks
from mecheval.interventions import InterchangeResult, engine, prefix, reference
from mecheval.models import ARCHITECTURES
from mecheval.models.backbone import FinalNorm
from mecheval.models.mixers.base import Mixer, mark_inert
from mecheval.models.registry import architecture
from mecheval.models.sites import Site

BUILT_IN = ("attention", "baseconv", "based", "deltanet", "h3", "hyena", "mamba")


class _CumSum(Mixer):
    """The reference: a prefix sum and a projection. Passes every check."""

    def __init__(self, d_model: int, options: object) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(d_model, d_model)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.cumsum(1))


# ------------------------------------------------------------------------------------ shapes


class _OverflowingDecay(_CumSum):
    """A decaying sum y_t = sum_s exp(-a (t - s)) x_s computed the naive way,
    exp(-a t) * cumsum(exp(a s) x_s): exp(a s) overflows float32 once a s > 88.7 (s >= 43)."""

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.arange(x.shape[1], dtype=x.dtype)[:, None] * 2.1
        return self.proj(torch.exp(-t) * (torch.exp(t) * x).cumsum(1))


class _UntrimmedConv(_CumSum):
    """A causal depthwise convolution padded by k - 1 that forgets to drop the last k - 1
    outputs: [B, T + 2, d]."""

    def __init__(self, d_model: int, options: object) -> None:
        super().__init__(d_model, options)
        self.weight = torch.nn.Parameter(torch.randn(d_model, 1, 3))

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv1d(x.transpose(1, 2), self.weight, padding=2, groups=x.shape[2])
        return self.proj(y.transpose(1, 2))


# ------------------------------------------------------------------- causality, batch, query


class _PeeksAhead(_CumSum):
    """A small leak from the next token."""

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.cumsum(1) + 1e-3 * x.roll(-1, 1))


class _MixesTheBatch(_CumSum):
    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.cumsum(1) + x.mean(0))


class _LengthNormalised(_CumSum):
    """Divides by the length of the sequence it is given, not by t + 1: causal in the
    tokens, but a document's output depends on how much padding follows it."""

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.cumsum(1) / x.shape[1])


# -------------------------------------------------------------------------------- gradients


class _DeadParameter(_CumSum):
    def __init__(self, d_model: int, options: object) -> None:
        super().__init__(d_model, options)
        self.unused = torch.nn.Parameter(torch.ones(d_model))


class _LiveInertParameter(_CumSum):
    """Marks a parameter inert (multiplied by 0 on purpose) but uses it."""

    def __init__(self, d_model: int, options: object) -> None:
        super().__init__(d_model, options)
        self.skip = mark_inert(torch.nn.Parameter(torch.ones(d_model)))

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.cumsum(1)) + self.skip * x


# ------------------------------------------------------------------------------------ sites


class _SkipsOutputSite(_CumSum):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mix(self.input(x))


class _SiteMadeInForward(_CumSum):
    """A Site created in the forward: not a submodule, so nothing can address it."""

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(Site()(x.cumsum(1)))


class _ChannelsFirstSite(_CumSum):
    def __init__(self, d_model: int, options: object) -> None:
        super().__init__(d_model, options)
        self.state = Site()

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.state(x.cumsum(1).transpose(1, 2)).transpose(1, 2))


class _SharedSite(_CumSum):
    """One site for two activations."""

    def __init__(self, d_model: int, options: object) -> None:
        super().__init__(d_model, options)
        self.state = Site()

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.state(x.cumsum(1)) * self.state(x))


# ---------------------------------------------------------------------------- site patching


class _BypassesInputSite(_CumSum):
    """Passes its input through the site but computes from the tensor it had before."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.input(x)
        return self.output(self.mix(x))


class _StrictlyPast(_CumSum):
    """Sees positions before t only, so its output at p ignores its input at p."""

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.pad(x.cumsum(1), (0, 0, 1, 0))[:, :-1])


class _ShortHalo(_CumSum):
    """A two-tap conv, y_t = x_t + x_{t-1}, that claims to resume from its window alone
    without the position before the cut (halo 0 instead of 1)."""

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x + F.pad(x, (0, 0, 1, 0))[:, :-1])

    def halo(self) -> int:
        return 0


class _InPlaceThroughSite(_CumSum):
    """Scales a site's output in place and goes on from the tensor it passed in, which is the
    same tensor only while no hook replaces the site's output: overwriting the site with its
    own value (a copy) loses the scaling."""

    def __init__(self, d_model: int, options: object) -> None:
        super().__init__(d_model, options)
        self.state = Site()

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        h = x.cumsum(1)
        self.state(h).mul_(2.0)
        return self.proj(h)


# -------------------------------------------------------------------------------- the tests


@pytest.fixture
def register():
    """register(cls) -> a fresh architecture name for ``cls``; removed after the test."""
    added: list[str] = []

    def add(cls: type[Mixer]) -> str:
        name = f"test-breaker-{cls.__name__.strip('_').lower()}"
        architecture(name)(cls)
        added.append(name)
        return name

    yield add
    for name in added:
        ARCHITECTURES.pop(name, None)


@dataclass(frozen=True)
class Breaker:
    mixer: type[Mixer]
    check: str
    message: str  # a regex the CheckFailed message must match
    fails: frozenset[str]  # every check that fails on this mixer

    def __str__(self) -> str:
        return self.mixer.__name__.strip("_")


def _breaker(mixer: type[Mixer], check: str, message: str, *also: str) -> Breaker:
    return Breaker(mixer, check, message, frozenset({check, *also}))


ALL = tuple(CHECKS)
BREAKERS = [
    _breaker(_OverflowingDecay, "shapes", r"^B=2 T=45: non-finite logits$"),
    # The residual add cannot take a wrong shape: every other check crashes in the forward,
    # but the mixer alone, resumed by the defaults, agrees with itself.
    _breaker(
        _UntrimmedConv,
        "shapes",
        r"^layers\.0\.mixer: output \(1, 3, 16\) for input \(1, 1, 16\)$",
        *(check for check in ALL if check != "resume"),
    ),
    # Every check that looks past t sees the leak too: the logits at q change when the
    # sequence ends at q, a patch acts before its position, a restore after the query acts.
    _breaker(
        _PeeksAhead,
        "causality",
        r"^output at t <= 20 changed by .* when only later tokens changed",
        "query-logits",
        "site-patching",
        "interchange",
    ),
    # The engine stacks unrelated documents and patches in one batch: its restores move;
    # resumed on a subset of the documents, its outputs move too.
    _breaker(
        _MixesTheBatch, "batch-independence", r"depend on its batch by", "interchange", "resume"
    ),
    _breaker(_LengthNormalised, "query-logits", r"when the sequence ends at q"),
    _breaker(
        _DeadParameter,
        "gradients",
        r"^parameters without gradient: layers\.0\.mixer\.unused, layers\.1\.mixer\.unused$",
    ),
    _breaker(
        _LiveInertParameter,
        "gradients",
        r"^parameters marked inert have a gradient: layers\.0\.mixer\.skip, "
        r"layers\.1\.mixer\.skip$",
    ),
    # The engine cannot read a site that never fires (a KeyError in the interchange check).
    _breaker(
        _SkipsOutputSite,
        "sites",
        r"^sites that never fired: layers\.0\.mixer\.output, layers\.1\.mixer\.output$",
        "interchange",
    ),
    _breaker(_SiteMadeInForward, "sites", r"^an unlisted Site fired inside layers\.0\.mixer:"),
    # A site that is not [B, T, C], or fires twice, cannot be patched at a position: the
    # engine's restores go wrong too (a restore after the query acts; the engines disagree).
    _breaker(
        _ChannelsFirstSite,
        "sites",
        r"^layers\.0\.mixer\.state: saw shape \(3, 16, 11\), expected \[B=3, T=11, C\]$",
        "interchange",
    ),
    _breaker(
        _SharedSite,
        "sites",
        r"^layers\.0\.mixer\.state: fired 2 times in one forward$",
        "interchange",
    ),
    # The engine resumes patched rows through Mixer.forward_from, which reads the site the
    # overridden forward bypasses: engine and naive loop disagree.
    _breaker(
        _BypassesInputSite,
        "site-patching",
        r"^layers\.0\.mixer\.input: a patch had no effect$",
        "interchange",
    ),
    _breaker(_StrictlyPast, "site-patching", r"^layers\.0\.mixer\.input: a patch had no effect$"),
    # The engine resumes patched rows as the mixer says: the engines disagree too.
    _breaker(_ShortHalo, "resume", r"^layers\.0\.mixer resumed at 1 differs by", "interchange"),
    # Any patch of that site drops the scaling at every position, after the query too.
    _breaker(
        _InPlaceThroughSite,
        "site-patching",
        r"^layers\.0\.mixer\.state: overwriting with its own value changed logits$",
        "interchange",
    ),
]


def test_the_reference_mixer_passes_every_check(register) -> None:
    name = register(_CumSum)
    results = run_checks(name)
    assert all(r.passed for r in results), [r for r in results if not r.passed]


@pytest.mark.parametrize("breaker", BREAKERS, ids=str)
def test_each_check_fails_on_a_mixer_that_breaks_it(register, breaker: Breaker) -> None:
    name = register(breaker.mixer)
    with pytest.raises(CheckFailed, match=breaker.message):
        CHECKS[breaker.check](name, None)
    failed = {r.name for r in run_checks(name) if not r.passed}
    assert failed == breaker.fails


def test_query_logits_fails_on_a_head_that_picks_the_wrong_positions(register, monkeypatch):
    """``x[:, at]`` for ``x[arange(B), at]``: every row gets the first row's query."""

    def forward(self: FinalNorm, x: torch.Tensor, at: torch.Tensor | None = None):
        x = self.input(x)
        return self.norm(x[:, at] if at is not None else x)

    monkeypatch.setattr(FinalNorm, "forward", forward)
    name = register(_CumSum)
    with pytest.raises(CheckFailed, match=r"^model\(tokens, at=q\) differs from the full logits"):
        CHECKS["query-logits"](name, None)
    # The engine and the sites check query every row at one position, where the bug is moot.
    assert {r.name for r in run_checks(name) if not r.passed} == {"query-logits"}


# ------------------------------------------------------------------------- the engine itself


def _restored_as(baseline: str, real=engine.interchange):
    """An engine that reports the ``baseline`` run's p(answer) for every restore."""

    def interchange(model, original, corrupted, **kwargs) -> InterchangeResult:
        result = real(model, original, corrupted, **kwargs)
        table = result.table.copy()
        for metric in ("likelihood", "accuracy"):
            rows = (table.condition == "restored") & (table.metric == metric)
            table.loc[rows, "value"] = result.value(baseline, metric)
        per_example = result.per_example.assign(restored=result.per_example[baseline])
        return InterchangeResult(table, per_example)

    return interchange


@pytest.mark.parametrize("arch", BUILT_IN)
def test_interchange_passes_on_every_built_in_architecture(arch: str) -> None:
    CHECKS["interchange"](arch, None)


@pytest.mark.parametrize("arch", BUILT_IN)
def test_interchange_fails_for_an_engine_that_restores_nothing(arch: str, monkeypatch) -> None:
    # Both engines, so that agreeing with each other is not enough.
    real_naive = reference.naive_interchange
    monkeypatch.setattr(engine, "interchange", _restored_as("corrupted"))
    monkeypatch.setattr(reference, "naive_interchange", _restored_as("corrupted", real_naive))
    with pytest.raises(CheckFailed, match=r"^restoring the key at layers\.0\.input \(.*\) gave"):
        CHECKS["interchange"](arch, None)


@pytest.mark.parametrize("arch", BUILT_IN)
def test_interchange_fails_for_an_engine_that_restores_everything(arch: str, monkeypatch):
    monkeypatch.setattr(engine, "interchange", _restored_as("original"))
    with pytest.raises(CheckFailed, match=r"^restoring after the query \(.*\) gave"):
        CHECKS["interchange"](arch, None)


@pytest.mark.parametrize("arch", BUILT_IN)
def test_interchange_fails_when_patches_are_not_applied(arch: str, monkeypatch) -> None:
    """Hooks that patch nothing: the batched engine still restores at block boundaries
    (it edits the cached tensor itself), the naive loop restores nowhere."""
    for module in (engine, prefix, reference):
        monkeypatch.setattr(module, "patch", lambda *args, **kwargs: nullcontext())
    with pytest.raises(CheckFailed, match=r"^batched and naive interchange differ per document"):
        CHECKS["interchange"](arch, None)
