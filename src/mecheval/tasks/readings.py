"""How a task's restores read as mechanism labels: which label a restored role names, the
task's label vocabulary. interventions/labels.py applies it; a task's config names its own
(``readings``), so that each task family speaks of its own mechanisms.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

#: The label ``candidates only (no binding)`` (interventions/labels.py): the model picks among
#: the document's answer candidates at chance.
CANDIDATES_ONLY = "candidates only (no binding)"


def _frozen(mapping: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class Readings:
    """A task's label vocabulary.

    ``at_label_site``: role -> the label a restore of that role at the label site (the last
    layer's input) names. ``in_state``: role -> the label a restore of that role at a
    recurrent state site (``layers.{i}.mixer.state``, any layer) names; the plan then measures
    every state site. ``first_reached``: False, the role that recovers most names the label (AR's
    reading); True, the first label, state sites first and then ``at_label_site`` in its order,
    whose restore recovers at least ``min_fraction`` (a state that carries the answer also
    makes the element's restore recover: the state is the more specific reading).
    ``at_chance``: the label of a model whose accuracy is at the chance of a guess among the
    answer candidates while its argmax is a candidate (AR: it picks among the document's values
    without binding; a task whose every answer class is a candidate: ``not learned``).
    ``chance_is_floor``: an accuracy below that chance reads ``at_chance`` too (where every
    answer is a candidate, no model below chance has learned anything; AR's model below chance
    may still bind in part). ``state_adds``: the state sites do not compete with the label
    site; the label site's roles decide the label, and a state reading that recovers at least
    ``min_fraction`` is added to it, naming its layer ("direct retrieval, layer 0; held in the
    state before the query (layer 0)").
    """

    at_label_site: Mapping[str, str]
    in_state: Mapping[str, str] = field(default_factory=dict)
    first_reached: bool = False
    at_chance: str = CANDIDATES_ONLY
    chance_is_floor: bool = False
    state_adds: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "at_label_site", _frozen(self.at_label_site))
        object.__setattr__(self, "in_state", _frozen(self.in_state))


#: Retrieval (AR, ATR and their families): where the key's information is when the last layer
#: reads it (the paper's Fig. 3 reading).
RETRIEVAL = Readings(
    {
        "value": "induction",
        "next_key": "induction (next key)",
        "query": "direct retrieval, layer 0",
        "key": "direct retrieval, layer >= 1",
    }
)

#: State tracking (parity, S3): where the changed element's information is carried to the
#: answer (tasks/state_tracking.py). The state reading restores a layer's recurrent state at the
#: query, the state its answer reads: where it recovers, the element's information reached the
#: answer in that state. (At the element's own position a state misses what a short conv
#: still holds of the element for its next k - 1 positions, as Mamba's does.)
STATE_TRACKING = Readings(
    {"key": "at the element", "query": "only at the query"},
    in_state={"query": "in the state after it"},
    first_reached=True,
    at_chance="not learned",
    chance_is_floor=True,
)

#: Retrieval of a binding that changes (tasks/reassign_ar.py): where the latest binding comes
#: back, read as retrieval's, and, added to it, whether a layer's recurrent state restored at
#: the divider brings the answer back: the value the query key holds last is in that state
#: when the query comes.
RETRIEVAL_AND_STATE = Readings(
    RETRIEVAL.at_label_site,
    in_state={"divider": "held in the state before the query"},
    state_adds=True,
)
