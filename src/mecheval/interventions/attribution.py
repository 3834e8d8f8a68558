"""Attribution patching: the interchange table estimated from gradients, to be graded
against the exact engine (interventions/grading.py).

The exact engine (engine.py) runs a patched forward per (site, role) cell. Attribution
patching replaces each by its first-order estimate: with ``a`` a site's activation at the
role's position in the corrupted run, ``a'`` the original run's at the role's position
there, and ``g`` the gradient of the readout with respect to that activation,

    restored(site, role) ~ readout(corrupted) + (a' - a) . g

per document. The readout is p(answer) at the query, the likelihood the mechanism labels
read, of the original document's answer (as the exact engine scores every row, whether or
not the counterfactual changes the answer). One backward pass gives ``g`` at every site and
position at once.

Methods (:data:`METHODS`):

- ``attribution``: ``g`` taken on the corrupted run (attribution patching, Nanda 2023; AtP
  in Kramár et al. 2024): one forward of the original, one forward and one backward of the
  corrupted documents.
- ``integrated-gradients``: ``g`` averaged over ``steps`` runs whose input embeddings lie on
  the straight line from the corrupted to the original documents, at the midpoints
  alpha = (k + 1/2) / steps (EAP-IG, Hanna et al. 2024, its "inputs" variant, with the
  midpoint rule): ``steps`` forwards and backwards.
- ``attribution-log``: attribution patching of log p(answer) instead of p(answer), its
  estimate mapped back, exp(min(log p(corrupted) + (a' - a) . g_log, 0)): the same passes
  as ``attribution``. The likelihood is a softmax probability, flat where the corrupted run
  puts little mass on the answer, so a first-order step from there falls short of a large
  restore; its logarithm moves with the answer's logit (a metric closer to linear), and the
  map back puts the estimate on the likelihood's scale, capped at 1. Where that helps and
  where it does not: docs/attribution.md.
- ``attribution-qk``: AtP*'s fix for attention saturation (Kramár et al. 2024) on
  ``attribution-log``'s step (AtP's metric is a loss or a logit difference, log-scale as
  log p is). Where the site is the input of a softmax-attention layer, the patch's effect on
  that layer's attention pattern is computed exactly (the pattern recomputed with the site
  restored at the role's position, whose queries and keys it changes) and carried to the
  readout by the readout's gradient with respect to the pattern; the rest of the patch's
  effect (the values, the residual stream, later layers) is first-order: the site's
  gradient less the part that flows through that pattern. A first-order step through a
  saturated softmax misses a pattern that moves from one position to another; the
  recomputed pattern does not. At every other site it is ``attribution-log``. Cost: one
  vector-Jacobian product per such layer and one pattern per cell besides the passes of
  ``attribution``.
- ``attribution-gd``: AtP*'s GradDrop (Kramár et al. 2024) on ``attribution-log``'s step.
  Paths from a site to the readout that cancel (one raising the answer, another lowering
  it) give a small first-order step where patching moves the answer. For each layer ``l``
  the step is taken again with the gradient through layer ``l``'s contributions to the
  residual stream (its mixer's and its MLP's outputs) dropped, the skip path kept, and the
  cell's step is their magnitudes' mean, sum_l |step_l| / (L - 1) (a site inside layer
  ``l`` has step_l = 0, so for a site whose one path runs through its own layer this is
  |step|). A magnitude: it never lowers the likelihood, and it ranks cells for an exact
  check rather than estimating their restore; graded on the same table to show what
  reading a label from it gives. With one layer there is nothing else to drop: |step|.
  Cost: L times ``attribution-log``'s passes.

A site is read through a forward hook that hands on a copy of its activation and keeps it,
so the gradient flows through what follows the site and nothing else, as a patch there
would. A recurrent-state site (``layers.{i}.mixer.state``) has no module: its gradient is
taken where the exact engine patches it, block i resumed from the state after the row's
position (``Block.forward_from`` with ``replace``), one backward per group of rows that
share a position.

The result is an :class:`InterchangeResult` whose original and corrupted rows are the
exact scores and whose restored rows are the estimated likelihood (no other metric: an
accuracy has no gradient), so the tables, views and labels of the exact engine read it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from mecheval.interventions import result as common
from mecheval.interventions.patch import record
from mecheval.interventions.prefix import PrefixCache, prefix_cache, run_from
from mecheval.models.backbone import LanguageModel
from mecheval.models.mixers.attention import Attention
from mecheval.models.mixers.base import Prefix
from mecheval.models.sites import get_site, layer_site, state_site_layer, state_site_names
from mecheval.tasks.batch import Batch

#: The estimators, by the name ``intervene --method`` takes.
METHODS = (
    "attribution",
    "integrated-gradients",
    "attribution-log",
    "attribution-qk",
    "attribution-gd",
)
#: The methods that differentiate log p(answer) and map their estimates back.
ON_LOG_LIKELIHOOD = ("attribution-log", "attribution-qk", "attribution-gd")
#: The methods that take one gradient, on the corrupted run (integrated gradients: a path).
AT_THE_CORRUPTED_RUN = ("attribution", *ON_LOG_LIKELIHOOD)
#: Integrated gradients' default number of points on the path (Hanna et al. use 5).
DEFAULT_STEPS = 5

#: A readout: per document a scalar of the logits at its query [N, V] and its answer [N].
Readout = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class NoGradientError(ValueError):
    """The model's forward builds no gradient to the readout (a mixer computed without
    autograd): attribution cannot be estimated."""


def answer_probability(logits: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """p(answer) per document: the likelihood the exact engine reports."""
    return logits.softmax(-1).gather(-1, answer[:, None])[:, 0]


def log_answer_probability(logits: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """log p(answer) per document: the readout ``attribution-log`` differentiates."""
    return logits.log_softmax(-1).gather(-1, answer[:, None])[:, 0]


def likelihood_of_log(estimate: torch.Tensor) -> torch.Tensor:
    """An estimate of log p(answer) as a likelihood (at most 1)."""
    return estimate.clamp(max=0.0).exp()


def readout_of(method: str) -> tuple[Readout, Callable[[torch.Tensor], torch.Tensor]]:
    """The readout ``method`` differentiates, and the map of its estimates to p(answer)."""
    if method in ON_LOG_LIKELIHOOD:
        return log_answer_probability, likelihood_of_log
    return answer_probability, lambda estimate: estimate


def path_points(method: str, steps: int = DEFAULT_STEPS) -> list[float]:
    """Where on the path from the corrupted (0) to the original (1) input embeddings the
    method takes its gradients."""
    if method in AT_THE_CORRUPTED_RUN:
        return [0.0]
    if method == "integrated-gradients":
        if steps < 1:
            raise ValueError(f"steps: expected >= 1, got {steps}")
        return [(k + 0.5) / steps for k in range(steps)]
    raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")


@dataclass(frozen=True)
class CellEstimates:
    """Per document: the readout of the corrupted run (``base`` [N], float64) and, per
    (site, role), its estimate with the site restored at the role (``cells``)."""

    base: torch.Tensor
    cells: dict[tuple[str, str], torch.Tensor]


@dataclass(frozen=True)
class _Run:
    """One run on the path: every kept site's activation and the readout's gradient there
    ([N, T, C] each), the block inputs (for the state sites) and the logits at the query;
    for a site whose pattern is taken exactly, that attention pattern and the readout's
    gradient with respect to it ([N, heads, T, T] each), its site's gradient without it."""

    acts: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor]
    inputs: list[torch.Tensor]
    logits: torch.Tensor
    patterns: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def estimate_cells(
    model: LanguageModel,
    original: Batch,
    corrupted: Batch,
    sites: Sequence[str],
    roles: Sequence[str],
    points: Sequence[float],
    readout: Readout = answer_probability,
    exact_patterns: bool = False,
) -> CellEstimates:
    """Every (site, role) cell's estimate from gradients at ``points`` on the path
    (:func:`path_points`; batches on the model's device), with ``exact_patterns`` an
    attention layer's pattern taken exactly at its input (``attribution-qk``)."""
    state_sites = set(state_site_names(model))
    module_sites = [site for site in sites if site not in state_sites]
    exact_at = _pattern_sites(model, module_sites) if exact_patterns else {}
    state_layers = [state_site_layer(site) for site in sites if site in state_sites]
    inputs = [layer_site(j, "input") for j in range(len(model.layers))]
    with torch.no_grad(), record(model, sorted(set(module_sites) | set(inputs))) as source:
        model(original.tokens, at=original.query)
    grads, state_grads, corrupted_run = _path_gradients(
        model, original, corrupted, module_sites, state_layers, roles, inputs, points,
        readout, exact_at,
    )  # fmt: skip
    base = readout(corrupted_run.logits.double(), original.answer)
    docs = torch.arange(len(original), device=base.device)
    prefixes = {
        j: _state_prefixes(model.layers[j], source[inputs[j]], corrupted_run.inputs[j])
        for j in set(state_layers)
    }
    cells: dict[tuple[str, str], torch.Tensor] = {}
    for site in sites:
        layer = state_site_layer(site) if site in state_sites else None
        for role in roles:
            src, dst = original.roles[role], corrupted.roles[role]
            if layer is None:
                diff = source[site][docs, src] - corrupted_run.acts[site][docs, dst]
                g = grads[site][docs, dst]
            else:
                h_orig, h_corr = prefixes[layer]
                diff = _flat(h_orig.after(docs, src)) - _flat(h_corr.after(docs, dst))
                g = state_grads[(layer, role)]
            cells[(site, role)] = base + _dot(diff, g)
            if site in exact_at:
                restored = _restored(corrupted_run.acts[site], docs, dst, source[site][docs, src])
                cells[(site, role)] += _pattern_term(
                    model.layers[exact_at[site]], restored, corrupted_run.patterns[site]
                )
    return CellEstimates(base, cells)


def grad_drop_cells(
    model: LanguageModel,
    original: Batch,
    corrupted: Batch,
    sites: Sequence[str],
    roles: Sequence[str],
    readout: Readout = log_answer_probability,
) -> CellEstimates:
    """GradDrop (``attribution-gd``): each cell's step is the mean over the layers of its
    magnitude with the gradient through that layer's contributions dropped,
    sum_l |step_l| / (L - 1); with one layer, |step|."""
    n_layers = len(model.layers)
    dropped: list[int | None] = list(range(n_layers)) if n_layers > 1 else [None]
    steps = []
    for layer in dropped:
        with _gradient_dropped(None if layer is None else model.layers[layer]):
            steps.append(estimate_cells(model, original, corrupted, sites, roles, [0.0], readout))
    base = steps[0].base
    cells = {
        cell: base + sum((s.cells[cell] - s.base).abs() for s in steps) / max(n_layers - 1, 1)
        for cell in steps[0].cells
    }
    return CellEstimates(base, cells)


class _NoGradient(torch.autograd.Function):
    """The identity, through which no gradient passes (zeros do, so that a site before it
    still has a gradient, 0)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(grad)


@contextmanager
def _gradient_dropped(block: nn.Module | None) -> Iterator[None]:
    """While open, no gradient passes through ``block``'s contributions to the residual
    stream (its mixer's output, in a forward and a resumed one, and its MLP's): only through
    its skip path. Their values are unchanged. ``None``: nothing dropped."""
    if block is None:
        yield
        return
    patched = [(block.mixer, "forward"), (block.mixer, "forward_from")]
    if block.mlp is not None:
        patched.append((block.mlp, "forward"))
    try:
        for module, name in patched:
            method = getattr(module, name)

            def dropped(*args: Any, method: Callable = method, **kwargs: Any) -> torch.Tensor:
                return _NoGradient.apply(method(*args, **kwargs))

            setattr(module, name, dropped)  # an instance attribute, over the class's method
        yield
    finally:
        for module, name in patched:
            module.__dict__.pop(name, None)


def _restored(
    corrupted: torch.Tensor, docs: torch.Tensor, positions: torch.Tensor, original: torch.Tensor
) -> torch.Tensor:
    """The corrupted run's activation [N, T, C] with ``original`` [N, C] at each document's
    position."""
    restored = corrupted.clone()
    restored[docs, positions] = original
    return restored


def _state_prefixes(block: nn.Module, original: torch.Tensor, corrupted: torch.Tensor) -> tuple:
    """The block's mixer's states after every position (its prefix) in the original and the
    corrupted run, from the block's inputs there."""
    with torch.no_grad():
        return tuple(block.mixer.prefix(block.mixer_norm(x)) for x in (original, corrupted))


def _pattern_term(
    block: nn.Module, restored: torch.Tensor, kept: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """Per document, the readout's change through the attention pattern of ``block`` as its
    input moves from the corrupted run's to ``restored``: the pattern's change, exact, times
    the readout's gradient with respect to the pattern (``kept``: the corrupted run's
    pattern and that gradient)."""
    pattern, slope = kept
    with torch.no_grad():
        moved = _pattern(block, restored) - pattern
    return _dot(moved, slope)


def _path_gradients(
    model: LanguageModel,
    original: Batch,
    corrupted: Batch,
    module_sites: Sequence[str],
    state_layers: Sequence[int | None],
    roles: Sequence[str],
    inputs: Sequence[str],
    points: Sequence[float],
    readout: Readout,
    exact_at: Mapping[str, int],
) -> tuple[dict[str, torch.Tensor], dict[tuple[int, str], Any], _Run]:
    """The gradients of the readout of the original's answer averaged over the path from the
    corrupted to the original input embeddings: [N, T, C] per module site; per state site's
    layer and role [N, S], the state (its parts flattened) after each document's role
    position; and the corrupted run (on the path, or run for its activations)."""
    answer = original.answer
    with torch.no_grad():
        delta = model.embed(original.tokens) - model.embed(corrupted.tokens)
    grads: dict[str, torch.Tensor] = {}
    state_grads: dict[tuple[int, str], Any] = {
        (layer, role): 0.0 for layer in state_layers for role in roles
    }
    corrupted_run = None
    for alpha in points:
        shift = alpha * delta
        run = _gradient_run(
            model, corrupted, answer, module_sites, inputs, shift, readout, exact_at
        )
        if alpha == 0.0:
            corrupted_run = run
        for site in module_sites:
            grads[site] = grads.get(site, 0.0) + run.grads[site] / len(points)
        prefix = prefix_cache(model, run.inputs)
        states = {layer: prefix.block_prefix(model, layer) for layer in set(state_layers)}
        for layer, role in state_grads:
            g = _state_gradient(
                model, layer, prefix, states[layer], corrupted, answer, role, readout
            )
            state_grads[(layer, role)] += _flat(g) / len(points)
    if corrupted_run is None:  # integrated gradients: the corrupted run itself is not on the path
        corrupted_run = _plain_run(model, corrupted, module_sites, inputs)
    return grads, state_grads, corrupted_run


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per document (the first dimension), the sum of a * b, in float64 -> [N]."""
    return (a.double() * b.double()).flatten(1).sum(1)


def _pattern_sites(model: LanguageModel, sites: Sequence[str]) -> dict[str, int]:
    """Of ``sites``, those that are the input of a softmax-attention layer, with its index."""
    return {
        layer_site(i, "input"): i
        for i, block in enumerate(model.layers)
        if isinstance(block.mixer, Attention) and layer_site(i, "input") in sites
    }


def _pattern(block: nn.Module, residual: torch.Tensor) -> torch.Tensor:
    """The attention pattern of ``block`` (a softmax-attention layer) with ``residual`` as
    its input, as its forward computes it (the norm, the mixer's short convolution)."""
    x = block.mixer_norm(residual)
    if block.mixer.short_conv is not None:
        x = block.mixer.short_conv(x)
    return block.mixer.probabilities(x)


@contextmanager
def _explicit_patterns(model: LanguageModel, layers: Sequence[int]) -> Iterator[dict]:
    """While open, the attention layers ``layers`` mix through their pattern as a tensor of
    its own (the same function), each kept under its layer's index."""
    patterns: dict[int, torch.Tensor] = {}
    mixers = [model.layers[i].mixer for i in layers]
    try:
        for i, mixer in zip(layers, mixers, strict=True):

            def mix(x: torch.Tensor, mixer: Attention = mixer, i: int = i) -> torch.Tensor:
                patterns[i] = mixer.probabilities(x)
                return mixer.attend(x, patterns[i])

            mixer.mix = mix  # an instance attribute, over the class's method
        yield patterns
    finally:
        for mixer in mixers:
            mixer.__dict__.pop("mix", None)


def _flat(states: torch.Tensor | tuple) -> torch.Tensor:
    """A state's parts [N, ...] as one [N, S] tensor."""
    return torch.cat([part.flatten(1) for part in _parts(states)], 1)


def _gradient_run(
    model: LanguageModel,
    corrupted: Batch,
    answer: torch.Tensor,
    sites: Sequence[str],
    inputs: Sequence[str],
    shift: torch.Tensor | None,
    readout: Readout,
    exact_at: Mapping[str, int] | None = None,
) -> _Run:
    """The corrupted documents' forward with ``shift`` added to their input embeddings, and
    the gradient of the summed readout of ``answer`` at every site of ``sites``; at a site
    of ``exact_at`` (site -> its attention layer) without the part through that layer's
    pattern, which is kept with the readout's gradient there."""
    exact_at = exact_at or {}
    with (
        torch.enable_grad(),
        _kept(model, sites) as acts,
        record(model, inputs) as block_inputs,
        _explicit_patterns(model, list(exact_at.values())) as kept_patterns,
    ):
        x = model.embed(corrupted.tokens)
        if shift is not None:
            x = x + shift
        for layer in model.layers:
            x = layer(x)
        logits = model.head(x, corrupted.query)
        total = readout(logits, answer).sum()
        missing = [site for site in sites if site not in acts]
        if missing:
            raise ValueError(f"sites: {missing[0]} is not reached by the model's forward")
        kept = [acts[site] for site in sites]
        patterns = [kept_patterns[layer] for layer in exact_at.values()]
        names = [*sites, *(f"{site} (its layer's pattern)" for site in exact_at)]
        found = _gradients(total, kept + patterns, names, retain=bool(exact_at))
        grads = dict(zip(sites, found[: len(sites)], strict=True))
        slopes = dict(zip(exact_at, found[len(sites) :], strict=True))
        for site, pattern in zip(exact_at, patterns, strict=True):
            (through,) = torch.autograd.grad(pattern, acts[site], slopes[site], retain_graph=True)
            grads[site] = grads[site] - through
    detached = {site: act.detach() for site, act in acts.items()}
    pairs = {site: (p.detach(), slopes[site]) for site, p in zip(exact_at, patterns, strict=True)}
    inputs_kept = [block_inputs[name] for name in inputs]
    return _Run(detached, grads, inputs_kept, logits.detach(), pairs)


def _plain_run(
    model: LanguageModel, corrupted: Batch, sites: Sequence[str], inputs: Sequence[str]
) -> _Run:
    """The corrupted documents' forward without gradients, its activations kept."""
    with torch.no_grad(), record(model, sorted(set(sites) | set(inputs))) as acts:
        logits = model(corrupted.tokens, at=corrupted.query)
    return _Run(acts, {}, [acts[name] for name in inputs], logits)


@contextmanager
def _kept(model: LanguageModel, sites: Sequence[str]) -> Iterator[dict[str, torch.Tensor]]:
    """Hooks that hand on a copy of each site's activation (a node of its own in the
    graph, so a gradient there counts only what follows the site) and keep it."""
    kept: dict[str, torch.Tensor] = {}
    handles = []
    try:
        for name in sites:

            def keep(module: object, inputs: object, output: torch.Tensor, name=name):
                kept[name] = output.clone()
                return kept[name]

            handles.append(get_site(model, name).register_forward_hook(keep))
        yield kept
    finally:
        for handle in handles:
            handle.remove()


def _gradients(
    total: torch.Tensor,
    tensors: Sequence[torch.Tensor],
    names: Sequence[str],
    state_parts: bool = False,
    retain: bool = False,
) -> list[torch.Tensor]:
    """d total / d each tensor. Every site lies on the way to the readout, so a gradient
    that does not reach one means something after it runs without autograd. With
    ``state_parts`` the tensors are the parts of one recurrent state: a part that the
    readout does not read from that position has gradient 0 when another part has one
    (Mamba-3's previous input, which only the next step reads, at the query itself)."""
    if not tensors:
        return []
    try:
        found = torch.autograd.grad(total, list(tensors), allow_unused=True, retain_graph=retain)
    except RuntimeError as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise NoGradientError(f"attribution: no gradient through the model ({first})") from None
    if state_parts and any(g is not None for g in found):
        pairs = zip(tensors, found, strict=True)
        found = [torch.zeros_like(t) if g is None else g for t, g in pairs]
    for name, g in zip(names, found, strict=True):
        if g is None:
            raise NoGradientError(
                f"attribution: no gradient reaches {name} (a mixer after it runs without "
                "autograd); use the exact method"
            )
    return list(found)


def _state_gradient(
    model: LanguageModel,
    layer: int,
    prefix: PrefixCache,
    states: Prefix,
    corrupted: Batch,
    answer: torch.Tensor,
    role: str,
    readout: Readout,
) -> tuple[torch.Tensor, ...]:
    """The readout's gradient with respect to block ``layer``'s recurrent state after each
    document's ``role`` position, in the run ``prefix`` holds (``states``: its block's
    prefix, ``PrefixCache.block_prefix``; a part per state tensor, [N, ...] each; zero where
    the position lies after the query; ``answer``: the answer whose readout is
    differentiated)."""
    block = model.layers[layer]
    dst, at = corrupted.roles[role], corrupted.query
    docs = torch.arange(len(dst), device=dst.device)
    out = tuple(torch.zeros_like(part) for part in _parts(states.after(docs, dst)))
    for start in dst[dst <= at].unique().tolist():
        rows = (dst == start).nonzero()[:, 0]
        at_start = _parts(states.after(rows, start))
        parts = tuple(part.detach().requires_grad_() for part in at_start)
        lo = max(0, start - states.halo)
        window = prefix.inputs[layer][rows, lo:]
        with torch.enable_grad():
            state = parts if isinstance(states.states, tuple) else parts[0]
            x = block.forward_from(window, start - lo, state, replace=True)
            logits = run_from(model, prefix, layer + 1, rows, start, x, at[rows])
            total = readout(logits, answer[rows]).sum()
            names = [layer_site(layer, "mixer.state")] * len(parts)
            found = _gradients(total, parts, names, state_parts=True)
        for whole, g in zip(out, found, strict=True):
            whole[rows] = g
    return out


def _parts(states: torch.Tensor | tuple) -> tuple[torch.Tensor, ...]:
    return states if isinstance(states, tuple) else (states,)


def attribution_patching(
    model: LanguageModel,
    original: Batch,
    corrupted: Batch,
    sites: Sequence[str] | None = None,
    roles: Sequence[str] | None = None,
    method: str = "attribution",
    steps: int = DEFAULT_STEPS,
) -> common.InterchangeResult:
    """The interchange table of :func:`~mecheval.interventions.interchange`, its restored
    likelihoods estimated by ``method`` (see the module doc)."""
    points = path_points(method, steps)
    sites, roles, original, corrupted = common.prepare(model, original, corrupted, sites, roles)
    known = set(state_site_names(model))
    for site in sites:
        if state_site_layer(site) is not None and site not in known:
            raise ValueError(f"sites: {site!r} is not a state site of this model")
    answer, candidates = original.answer, original.candidates
    with torch.no_grad():
        s_orig = common.score_rows(model(original.tokens, at=original.query), answer, candidates)
        s_corr = common.score_rows(model(corrupted.tokens, at=corrupted.query), answer, candidates)
    rows = common.baseline_rows(s_orig, s_corr, common.batch_metrics(original))
    readout, to_likelihood = readout_of(method)
    if method == "attribution-gd":
        estimates = grad_drop_cells(model, original, corrupted, sites, roles, readout)
    else:
        exact_patterns = method == "attribution-qk"
        estimates = estimate_cells(
            model, original, corrupted, sites, roles, points, readout, exact_patterns
        )
    per_example = []
    for (site, role), estimate in estimates.cells.items():
        values = to_likelihood(estimate)
        rows.append(("restored", site, role, "likelihood", values.mean().item()))
        per_example.append(common.example_rows(site, role, values, s_orig, s_corr))
    return common.assemble(rows, per_example)
