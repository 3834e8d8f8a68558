"""The contract every architecture must meet, as checks runnable on any registered mixer.

``mecheval check-mixer NAME`` runs them on a built-in or a plugin architecture (or a hybrid's
layers, ``mamba+attention~hyena``: :func:`~mecheval.models.config.layers_named`), and the test
suite runs them on every registered one (tests/test_models.py). It uses models, tasks and
interventions together, so it sits above all three, beside experiments. Each check builds small
models itself and raises :class:`CheckFailed` with a one-line reason. What they guard:

* ``shapes``: every mixer maps [B, T, d] to [B, T, d] (checked at the mixer, before the
  residual add can broadcast or crash) and the logits are [B, T, V] and finite, for T = 1
  and T = 45 too (an overflow that grows with t shows there);
* ``causality``: the output at t never depends on tokens after t (float64, so that round-off
  cannot hide a small leak), with and without position embeddings;
* ``batch-independence``: a document's output does not depend on the others in its batch
  (the intervention engine stacks unrelated rows in one batch);
* ``query-logits``: ``model(tokens, at=q)`` equals the full logits at q, and so do the logits
  of the same batch cut after q: the engine reads each document at its query in a batch
  padded to the longest, so not even the length of what follows may matter. (``at`` never
  reaches a mixer: only the length half can be broken by a mixer alone);
* ``gradients``: every parameter gets a finite, non-zero gradient (no dead parameter), except
  those marked inert (:func:`~mecheval.models.mixers.base.mark_inert`), whose gradient is 0;
* ``sites``: the backbone sites exist, every site fires once per forward with a
  [B, T, C] tensor and is reachable by its dotted name, and no Site fires that is not a
  submodule of the model (one made in the forward could not be read or patched);
* ``site-patching``: overwriting any site with its own value changes nothing (no computation
  goes around a site or through an alias of it); patching the mixer input at position p
  changes outputs from p on and nothing before p;
* ``resume``: each mixer resumed at every position from its own prefix states gives its full
  forward's outputs from there (the engine runs patched rows so); the ``Mixer`` defaults,
  which recompute the window, pass by construction;
* ``interchange``: the batched intervention engine equals the naive one-forward-per-patch
  loop on this architecture (layer 0's sites and final_norm.input, every role), per document
  and in the table, to ENGINE_RTOL relative; and both do what a restore must: restoring the
  key at ``layers.0.input`` gives the original run, restoring any other role there, or any
  site right after the query, gives the corrupted run. The model is built at
  SIGNAL_INIT_STD in float64 and must move p(answer) by over SIGNAL_MARGIN * ENGINE_RTOL when
  the key is corrupted: at the default init no restore moves the mean p(answer) by more than
  4e-9..4e-6 on 5 of the 7 built-in architectures, and an engine that restored nothing passed.

The checks of the forward pass are in :mod:`~mecheval.contract.forward`, those of the sites,
patches and resuming in :mod:`~mecheval.contract.patching`, the engine's in
:mod:`~mecheval.contract.interchange`; :mod:`~mecheval.contract.fixtures` builds their models.

tests/test_contract_breakers.py shows each check failing, on a mixer that breaks what it
guards (query-logits: also on a head that picks the wrong positions; interchange: on engines
that restore nothing, everything, or apply no patch hook).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mecheval.contract.fixtures import CheckFailed, make_model, random_tokens
from mecheval.contract.forward import (
    check_batch_independence,
    check_causality,
    check_gradients,
    check_query_logits,
    check_shapes,
)
from mecheval.contract.interchange import check_interchange
from mecheval.contract.patching import check_resume, check_site_patching, check_sites
from mecheval.errors import ConfigError
from mecheval.models.config import layers_named
from mecheval.models.registry import parse_options

__all__ = [
    "CHECKS",
    "CheckFailed",
    "CheckResult",
    "make_model",
    "random_tokens",
    "run_checks",
]


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str
    seconds: float


CHECKS: dict[str, Callable[[str, Mapping[str, Any] | None], str]] = {
    "shapes": check_shapes,
    "causality": check_causality,
    "batch-independence": check_batch_independence,
    "query-logits": check_query_logits,
    "gradients": check_gradients,
    "sites": check_sites,
    "site-patching": check_site_patching,
    "resume": check_resume,
    "interchange": check_interchange,
}


def run_checks(arch: str, options: Mapping[str, Any] | None = None) -> list[CheckResult]:
    """Run every check on ``arch``; a check that raises anything fails with that reason."""
    # An unknown name or a bad option is a usage error, not a failed check.
    layers = layers_named(arch)
    if layers is None:
        parse_options(arch, dict(options or {}))
    elif options:
        raise ConfigError(f"--set: {arch} is a hybrid; its layers take their default options")
    else:
        make_model(arch)  # a layer of no registered architecture: one line naming it
    results = []
    for name, check in CHECKS.items():
        start = time.perf_counter()
        try:
            detail, passed = check(arch, options), True
        except Exception as err:  # a crash inside a plugin mixer is a failed check too
            detail, passed = f"{type(err).__name__}: {err}", False
        results.append(CheckResult(name, passed, detail, time.perf_counter() - start))
    return results
