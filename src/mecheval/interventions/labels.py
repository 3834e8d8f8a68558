"""Mechanism labels: how a checkpoint solves the task, read as the paper reads Fig. 3.

The label is read from the restore table at the last layer's input (``layers.{L-1}.input``),
the paper's site: what the last layer's mixer finds there at the value, the key or the
query. A one-layer model has no layer before its mixer, but it can have a short mixing step
inside the block (a short conv, H3's shift SSM: ``local_sites``, from
``models.sites.local_mixing_sites``): the label is read at its output, the last point before
the only sequence mixer, where a key bound to the next token shows as a restore at the value
(Olsson et al.'s one-layer attention with a length-2 conv: induction). Where the block has
several (DeltaNet's q, k and v convs), at the one whose best role recovers most. A one-layer
model without one is read at ``layers.0.output``, where only the query can recover: every
such model that answers reads as direct retrieval at its only layer.

With o = p(y|o), c = p(y|c) and r = the restored likelihood at a role, a role *recovers*
the fraction (r − c) / (o − c) of what the corruption removed. The labels, in the order
they are tried:

- ``candidates only (no binding)``: on the original documents the in-context accuracy
  (argmax is one of the document's answer candidates: AR its values, ATR its yield's
  terminals) is ≥ ``min_in_context_accuracy`` (:data:`CANDIDATES_MIN_IN_CONTEXT_ACCURACY`,
  0.9), the accuracy is within ``chance_tolerance`` (:data:`CHANCE_TOLERANCE`, 0.05
  absolute, both bounds inclusive) of the chance level mean(1 / candidates) of a guess
  among the in-context candidates, and the in-context accuracy exceeds the accuracy by more
  than ``chance_tolerance`` (so where the chance level is itself ≈ 1, a single candidate per
  document, binding and candidate-picking cannot be told apart and this label is not given;
  below a chance of 0.8 the first two conditions imply the third). The model learned
  *which* tokens can answer (the candidate class, read from the context) but not *which one
  the key binds*: it has learned something, but not retrieval. It goes first: before
  ``not learned``, which it would otherwise read as (with 16 pairs o ≈ 1/16 < 0.2), hiding
  what was learned; before ``inconclusive`` and the restore labels, because with accuracy
  at chance no restore pattern can be the mechanism of a retrieval the model does not do
  (with 4 pairs, o ≈ 0.25 passes ``min_original`` and a restore could read as a weak
  "induction"). 0.05 is about two standard errors of an accuracy at chance 0.25 over 320
  test documents (√(0.25·0.75/320) ≈ 0.024): a model 7 points above chance (the quick H3's
  32 % against 25 %) binds in part and keeps its restore label. Needs the in-context
  scores in the table and the chance level (``chance``); without them it is skipped.
- ``not learned``: o < ``min_original``.
- ``inconclusive``: the range o − c < ``min_gap``. Corrupting the key barely moves the
  answer, so no restore can show where the key's information went: a measurement without
  range, not evidence of "no mechanism" (ATR documents whose answer does not need the key
  show it). The label and its string report the range.
- otherwise the role with the largest fraction, if it is ≥ ``min_fraction``:
  ``value`` -> ``induction`` (the key was associated at the value before the last layer);
  ``next_key`` -> ``induction (next key)`` (Mamba's variant, paper §4.4);
  ``query`` -> ``direct retrieval, layer 0`` (the answer is already at the query);
  ``key`` -> ``direct retrieval, layer >= 1`` (the last layer reads the key itself).
- ``unclear`` when no role recovers ``min_fraction``.

Those are retrieval's labels (AR, ATR and their families). A task names its own label
vocabulary (its config's ``readings``, tasks/readings.py). State tracking (parity, S3) reads
where the changed element's information is carried to the answer, the first of these whose
restore recovers ``min_fraction``: ``in the state after it`` (a recurrent state site,
``layers.{i}.mixer.state``, of any layer, restored at the query: the state the answer reads
carries the element's information), ``at the element`` (the element's position at the label
site: the last layer reads the element itself), ``only at the query`` (the query's position
at the label site). Every state is a candidate there, so an accuracy at or below chance reads
``not learned``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import pandas as pd

from mecheval.interventions.carriers import Carrier, carrier
from mecheval.interventions.intervals import (
    BOOTSTRAP,
    Bootstrap,
    recovered_fraction,
    restore_intervals,
)
from mecheval.interventions.null import Null
from mecheval.models.sites import last_layer_input, layer_site, state_site_layer
from mecheval.tasks.readings import CANDIDATES_ONLY, RETRIEVAL, Readings

#: Retrieval's labels by the role that recovers (tasks/readings.py's ``RETRIEVAL``).
LABELS = RETRIEVAL.at_label_site


#: The label ``candidates only (no binding)``: the in-context accuracy it needs at least.
CANDIDATES_MIN_IN_CONTEXT_ACCURACY = 0.9
#: ... and how far (absolute, inclusive) the accuracy may be from the chance level.
CHANCE_TOLERANCE = 0.05
#: Float rounding allowance of the inclusive threshold comparisons (|0.3 − 0.25| ≠ 0.05).
_EPS = 1e-12


@dataclass(frozen=True)
class Thresholds:
    min_original: float = 0.2
    min_gap: float = 0.05
    min_fraction: float = 0.5
    #: a second role whose fraction's interval lies at or above this (and above the null)
    #: shares the answer with the label's role: the label is fragile (``MechanismLabel.rivals``)
    min_rival: float = 0.1
    min_in_context_accuracy: float = CANDIDATES_MIN_IN_CONTEXT_ACCURACY
    chance_tolerance: float = CHANCE_TOLERANCE


@dataclass(frozen=True)
class MechanismLabel:
    label: str
    site: str
    original: float
    corrupted: float
    restored: dict[str, float] = field(default_factory=dict)
    recovered: dict[str, float] = field(default_factory=dict)
    thresholds: Thresholds = Thresholds()
    #: on the original documents (None: the table has no such rows / no chance given)
    accuracy: float | None = None
    in_context_accuracy: float | None = None
    in_context_mass: float | None = None
    #: mean(1 / in-context candidates): the accuracy of a guess among them
    chance: float | None = None
    #: the key of ``recovered`` whose fraction decided a restore label (None: no role did)
    role: str | None = None
    #: per key of ``recovered``: the 95 % bootstrap interval of its fraction over the
    #: documents (interventions/intervals.py); empty where no per-document table was given
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: the restore at positions that play no role, at the label site (interventions/null.py):
    #: a role's fraction counts only above ``null.high``. None: not measured
    null: Null | None = None
    #: of a hybrid read as retrieval: the layer that brings the answer to the query
    #: (interventions/carriers.py), which the label then names. None: not read
    carrier: Carrier | None = None
    #: the other roles at the label site that bring back a share of the answer too (their
    #: interval at or above ``min_rival`` and the null), largest first: where the answer
    #: comes back through two roles, which one passes the bar turns with small changes to
    #: the model (another machine's rounding, another seed). Read where the role that
    #: recovers most names the label (retrieval), not where the first role reached does
    rivals: tuple[str, ...] = ()

    @property
    def bar(self) -> float:
        """What the deciding fraction must reach: ``min_fraction``, or the null's upper bound
        where that is higher."""
        floor = -math.inf if self.null is None else self.null.high
        return max(self.thresholds.min_fraction, floor)

    @property
    def fragile(self) -> str | None:
        """Where the label could read otherwise, the fractions that say so in words, the
        label's role first (``query 52 % [44, 60]``, ``query 66 % [60, 72], key 17 % [13,
        21]``); None where it could not (or no interval was measured). A label is fragile
        where its deciding fraction's interval crosses its threshold (:attr:`bar`; an
        ``unclear``: where a role's interval reaches it), or where :attr:`rivals` share the
        answer (an ``unclear``: where they bring back together what the bar asks of one)."""
        lead = self.lead
        if lead is None:
            return None
        low, high = self.intervals[lead]
        crosses = low < self.bar if self.role is not None else high >= self.bar
        shared = sum(self.recovered[k] for k in (lead, *self.rivals)) >= self.bar
        if crosses or (self.rivals and shared):
            return ", ".join(self._cite(k) for k in (lead, *self.rivals))
        return None

    @property
    def lead(self) -> str | None:
        """The fraction a fragile label cites first: the deciding role's, or of an
        ``unclear`` the role that recovers most (among those whose interval reaches the bar,
        where any does); None where there is none with an interval."""
        if self.role is not None:
            return self.role if self.role in self.intervals else None
        if self.label != "unclear" or not self.intervals:
            return None
        near = [k for k, (_, high) in self.intervals.items() if high >= self.bar]
        return max(near or self.intervals, key=self.recovered.__getitem__)

    def _cite(self, key: str) -> str:
        low, high = self.intervals[key]
        return f"{key} {100 * self.recovered[key]:.0f} % [{100 * low:.0f}, {100 * high:.0f}]"

    @property
    def headline(self) -> str:
        """The label, marked where it is fragile: ``direct retrieval, layer 0 (fragile:
        query 52 % [44, 60])``."""
        fragile = self.fragile
        return f"{self.label} (fragile: {fragile})" if fragile else self.label

    @property
    def range(self) -> float:
        """original − corrupted: what the corruption removed, which restores can recover."""
        return self.original - self.corrupted

    def binding_line(self) -> str:
        """Accuracy beside the binding scores, in %: "" where they were not measured."""
        if self.accuracy is None or self.in_context_accuracy is None:
            return ""
        line = (
            f"accuracy {self.accuracy:.1%}, in-context accuracy {self.in_context_accuracy:.1%}, "
            f"in-context mass {self.in_context_mass:.1%}"
        )
        if self.chance is not None:
            line += f" (chance among the in-context candidates {self.chance:.1%})"
        return line

    def __str__(self) -> str:
        parts = ", ".join(
            f"{r} {v:.0%}"
            + (
                f" [{self.intervals[r][0]:.0%}, {self.intervals[r][1]:.0%}]"
                if r in self.intervals
                else ""
            )
            for r, v in self.recovered.items()
        )
        if self.label == CANDIDATES_ONLY:
            return (
                f"{self.label} (in-context accuracy {self.in_context_accuracy:.3f}, accuracy "
                f"{self.accuracy:.3f} at the chance of a guess among the in-context candidates "
                f"{self.chance:.3f}; at {self.site}: original {self.original:.3f}, corrupted "
                f"{self.corrupted:.3f}, recovered {parts})"
            )
        null = ""
        if self.null is not None:
            mean = round(self.null.recovered, 2) + 0.0  # no "-0%"
            null = f"; the null (no role) recovers {mean:.0%}, at most {self.null.high:.0%}"
        return (
            f"{self.headline} (at {self.site}: original {self.original:.3f}, corrupted "
            f"{self.corrupted:.3f}, range {self.range:.3f}; recovered {parts}{null})"
        )


def label_site(n_layers: int) -> str:
    """The site the label is read at, for a model without short mixing steps in a one-layer
    block (module docstring)."""
    return last_layer_input(n_layers) if n_layers >= 2 else layer_site(0, "output")


def label_sites(n_layers: int, local_sites: Sequence[str] = ()) -> list[str]:
    """The sites a label can be read at, in the order they are tried (module docstring): a
    one-layer model's short mixing steps (``local_sites``), then :func:`label_site`."""
    return [*(local_sites if n_layers == 1 else ()), label_site(n_layers)]


def readable_sites(
    table: pd.DataFrame,
    n_layers: int,
    local_sites: Sequence[str] = (),
    readings: Readings = RETRIEVAL,
) -> list[str]:
    """The sites the label is read at among those where ``table`` restores a labelled role:
    the measured short mixing steps of a one-layer block, else :func:`label_site`. Empty
    when the table has none of them (other sites only, such as a recurrent state's): then
    no label can be read."""
    restored = table[(table.metric == "likelihood") & (table.condition == "restored")]
    measured = set(restored.site[restored.role.isin(list(readings.at_label_site))])
    local = [site for site in local_sites if site in measured] if n_layers == 1 else []
    return local or [site for site in [label_site(n_layers)] if site in measured]


def _recovered(
    likelihood: pd.DataFrame, site: str, corrupted: float, gap: float, labelled: Sequence[str]
) -> tuple[dict[str, float], dict[str, float]]:
    """(restored likelihood per role, fraction of the gap it recovers per ``labelled`` role)
    at ``site``."""
    at_site = likelihood[(likelihood.condition == "restored") & (likelihood.site == site)]
    restored = {r: float(v) for r, v in zip(at_site.role, at_site.value, strict=True)}
    recovered = {
        r: float(recovered_fraction(v, corrupted, gap))
        for r, v in restored.items()
        if r in labelled
    }
    return restored, recovered


def _best_state(
    likelihood: pd.DataFrame, role: str, corrupted: float, gap: float
) -> tuple[str, float, float] | None:
    """(state site, restored likelihood, fraction recovered) of the state site whose restore
    of ``role`` recovers most (the first in layer order among equals); None: none measured."""
    rows = likelihood[(likelihood.condition == "restored") & (likelihood.role == role)]
    states = [
        (str(site), float(value))
        for site, value in zip(rows.site, rows.value, strict=True)
        if state_site_layer(str(site)) is not None
    ]
    if not states:
        return None
    states.sort(key=lambda s: state_site_layer(s[0]) or 0)
    site, value = max(states, key=lambda s: s[1])
    return site, value, float(recovered_fraction(value, corrupted, gap))


def candidates_only(
    accuracy: float, in_context_accuracy: float, chance: float, thresholds: Thresholds
) -> bool:
    """Whether the numbers read ``candidates only (no binding)`` (module docstring)."""
    tolerance = thresholds.chance_tolerance
    return (
        in_context_accuracy >= thresholds.min_in_context_accuracy - _EPS
        and abs(accuracy - chance) <= tolerance + _EPS
        and in_context_accuracy - accuracy > tolerance + _EPS
    )


def label_mechanism(
    table: pd.DataFrame,
    n_layers: int,
    thresholds: Thresholds = Thresholds(),
    chance: float | None = None,
    local_sites: Sequence[str] = (),
    readings: Readings = RETRIEVAL,
    per_example: pd.DataFrame | None = None,
    bootstrap: Bootstrap = BOOTSTRAP,
    nulls: Mapping[str, Null] | None = None,
    layer_names: Sequence[str] | None = None,
) -> MechanismLabel:
    """Label from an interchange table (the engine's ``InterchangeResult.table``) and the
    chance level of its documents (``tasks.scores.chance_level`` of their candidates).
    ``local_sites``: a one-layer block's short mixing steps (``models.sites.
    local_mixing_sites``), read instead of ``layers.0.output``; ``readings``: the task's.
    ``per_example`` (the engine's per-document table) gives each fraction its ``bootstrap``
    interval; ``nulls`` (per site, interventions/null.py): a role's fraction counts only above
    the null's upper bound at the label's site. ``layer_names`` (a hybrid's): a retrieval
    label names the layer that carries it, read from every block boundary (carriers.py)."""
    likelihood = table[table.metric == "likelihood"]
    binding = _binding(table, chance)
    original, corrupted = _condition(likelihood, "original"), _condition(likelihood, "corrupted")
    gap = original - corrupted
    sites = _sites_to_read(table, n_layers, local_sites, readings)
    site, restored, recovered = _best_site(likelihood, sites, corrupted, gap, readings)
    names = dict(readings.at_label_site)
    state_sites = _read_states(likelihood, readings, corrupted, gap, (restored, recovered, names))
    label = _without_restores(binding, readings, thresholds, original, gap)
    null = (nulls or {}).get(site)
    # the role that decides a restore label (None: the label needs no restore, or unclear)
    best = None if label else _deciding_role(readings, state_sites, recovered, thresholds, null)
    label = label or ("unclear" if best is None else names[best])
    intervals = _intervals(per_example, recovered, state_sites, site, bootstrap)
    label_site = site if readings.state_adds else state_sites.get(best or "", site)
    read = MechanismLabel(
        label,
        label_site,
        original,
        corrupted,
        restored,
        recovered,
        thresholds,
        **binding,
        role=best,
        intervals=intervals,
        null=null,
    )
    read = _naming_the_carrier(_with_rivals(read, readings), likelihood, layer_names, readings)
    return _adding_the_state(read, readings, state_sites, names, thresholds)


def _sites_to_read(
    table: pd.DataFrame, n_layers: int, local_sites: Sequence[str], readings: Readings
) -> list[str]:
    """The label sites the table restores; none is an error naming where restores belong."""
    sites = readable_sites(table, n_layers, local_sites, readings)
    if not sites:
        where = " or ".join(label_sites(n_layers, local_sites))
        roles = "/".join(readings.at_label_site)
        raise ValueError(f"label: the table has no restores at {where} ({roles})")
    return sites


def _with_rivals(read: MechanismLabel, readings: Readings) -> MechanismLabel:
    """The label with its :attr:`~MechanismLabel.rivals`: the label site's other roles whose
    fraction's interval lies at or above ``min_rival`` and above the null's upper bound. None
    are read where the first role reached names the label (``readings.first_reached``: there
    a state and the element it carries recover together by design)."""
    lead = read.lead
    if readings.first_reached or lead is None:
        return read
    floor = -math.inf if read.null is None else read.null.high
    rivals = [
        role
        for role in readings.at_label_site
        if role != lead
        and role in read.intervals
        and read.intervals[role][0] >= read.thresholds.min_rival
        and read.intervals[role][0] > floor
    ]
    rivals.sort(key=read.recovered.__getitem__, reverse=True)
    return replace(read, rivals=tuple(rivals))


def _adding_the_state(
    read: MechanismLabel,
    readings: Readings,
    state_sites: dict[str, str],
    names: dict[str, str],
    thresholds: Thresholds,
) -> MechanismLabel:
    """With ``readings.state_adds``: a restore label with the state readings that recover at
    least ``min_fraction`` added, each naming its layer ("direct retrieval, layer 0; held in
    the state before the query (layer 0)"); any other label as read."""
    if not readings.state_adds or read.role is None:
        return read
    held = [
        f"{names[key]} (layer {state_site_layer(site)})"
        for key, site in state_sites.items()
        if read.recovered[key] >= thresholds.min_fraction
    ]
    return replace(read, label="; ".join([read.label, *held])) if held else read


def _naming_the_carrier(
    read: MechanismLabel,
    likelihood: pd.DataFrame,
    layer_names: Sequence[str] | None,
    readings: Readings,
) -> MechanismLabel:
    """A hybrid's retrieval label naming the layer that carries it (carriers.py); any other
    label as read."""
    if layer_names is None or read.role is None or readings.at_label_site != LABELS:
        return read
    found = carrier(likelihood, layer_names, read.original, read.corrupted, read.bar)
    return read if found is None else replace(read, label=str(found), carrier=found)


def _best_site(
    likelihood: pd.DataFrame,
    sites: Sequence[str],
    corrupted: float,
    gap: float,
    readings: Readings,
) -> tuple[str, dict[str, float], dict[str, float]]:
    """(site, restored, recovered) of the first site whose best role recovers most (max keeps
    the first of equals)."""
    labelled = list(readings.at_label_site)
    read = [(site, *_recovered(likelihood, site, corrupted, gap, labelled)) for site in sites]
    return max(read, key=lambda r: max(r[2].values(), default=-math.inf))


def _without_restores(
    binding: dict, readings: Readings, thresholds: Thresholds, original: float, gap: float
) -> str | None:
    """The labels read before any restore: at chance, not learned, inconclusive (in that
    order); None where the restores decide."""
    if _at_chance(binding, readings, thresholds):
        return readings.at_chance
    if original < thresholds.min_original:
        return "not learned"
    if gap < thresholds.min_gap:
        return "inconclusive"
    return None


def _intervals(
    per_example: pd.DataFrame | None,
    recovered: Mapping[str, float],
    state_sites: Mapping[str, str],
    site: str,
    bootstrap: Bootstrap,
) -> dict[str, tuple[float, float]]:
    """The interval of each recovered fraction (none without ``per_example``): a role's at the
    label's ``site``, a state's (key "<role> (state)") at its own site in ``state_sites``."""
    if per_example is None:
        return {}
    where = {key: (state_sites.get(key, site), key.removesuffix(" (state)")) for key in recovered}
    wanted = per_example.set_index(["site", "role"]).index.isin(list(where.values()))
    bounds = restore_intervals(per_example[wanted], bootstrap).set_index(["site", "role"])
    return {
        key: tuple(bounds.loc[at, ["recovered_low", "recovered_high"]].astype(float))
        for key, at in where.items()
        if at in bounds.index
    }


def _condition(likelihood: pd.DataFrame, condition: str) -> float:
    return float(likelihood[likelihood.condition == condition].value.iloc[0])


def _binding(table: pd.DataFrame, chance: float | None) -> dict[str, float | None]:
    """The original documents' accuracies and candidate mass, and their chance level."""

    def at_original(metric: str) -> float | None:
        rows = table[(table.metric == metric) & (table.condition == "original")]
        return float(rows.value.iloc[0]) if len(rows) else None

    return {
        "accuracy": at_original("accuracy"),
        "in_context_accuracy": at_original("in_context_accuracy"),
        "in_context_mass": at_original("in_context_mass"),
        "chance": chance,
    }


def _read_states(
    likelihood: pd.DataFrame,
    readings: Readings,
    corrupted: float,
    gap: float,
    into: tuple[dict, dict, dict],
) -> dict[str, str]:
    """The state sites' readings (each state role at the state site that recovers it most),
    added to ``into`` (restored, recovered, names) beside the label site's roles as
    "<role> (state)"; returns the state site of each."""
    restored, recovered, names = into
    state_sites: dict[str, str] = {}
    for role, name in readings.in_state.items():
        best_state = _best_state(likelihood, role, corrupted, gap)
        if best_state is not None:
            key = f"{role} (state)"
            state_sites[key], restored[key], recovered[key] = best_state
            names[key] = name
    return state_sites


def _at_chance(binding: dict, readings: Readings, thresholds: Thresholds) -> bool:
    """Whether the original documents read the task's at-chance label: candidates only, or
    (where chance is the floor) accuracy at chance."""
    accuracy, in_context, chance = (
        binding["accuracy"],
        binding["in_context_accuracy"],
        binding["chance"],
    )
    return (
        accuracy is not None
        and in_context is not None
        and chance is not None
        and candidates_only(accuracy, in_context, chance, thresholds)
    ) or (
        readings.chance_is_floor
        and accuracy is not None
        and chance is not None
        and accuracy <= chance + thresholds.chance_tolerance + _EPS
    )


def _deciding_role(
    readings: Readings,
    state_sites: dict[str, str],
    recovered: dict,
    thresholds: Thresholds,
    null: Null | None = None,
) -> str | None:
    """The role whose restore names the mechanism, None where none reaches the threshold
    (and, at the label site, rises above the ``null``'s upper bound)."""
    floor = -math.inf if null is None else null.high
    if readings.state_adds:  # the label site's roles decide; the states are added after
        recovered = {role: f for role, f in recovered.items() if role not in state_sites}
        state_sites = {}

    def counts(role: str) -> bool:
        above_null = role in state_sites or recovered[role] > floor
        return recovered[role] >= thresholds.min_fraction and above_null

    if readings.first_reached:  # state sites first, then the label site's roles in order
        order = [*state_sites, *(r for r in readings.at_label_site if r in recovered)]
        reached = [r for r in order if counts(r)]
        return reached[0] if reached else None
    best = max(recovered, key=recovered.__getitem__)  # the role that recovers most
    return best if counts(best) else None
