"""What every sequence mixer shares: the Mixer contract (input/output sites, states, resuming)
and the Prefix a mixer resumes from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field
from torch import nn

from mecheval.models.mixers.modules import ShortConv
from mecheval.models.sites import Site

#: What a mixer carries across a cut besides its window (:attr:`Mixer.carries`).
Carry = Literal["state", "history"]


def table1_constant(value: Any) -> Any:
    """An option the paper's Table 1 lists that mecheval builds with one value only (no
    dropout, one Hyena head and block, ...): accepted, so that configs written after Table 1
    load, and any other value is an error. Every such option is listed in
    docs/architecture.md ("Options fixed by the paper's Table 1")."""
    bounds = {} if isinstance(value, bool) else {"ge": value, "le": value}
    return Field(value, description=f"paper Table 1; only {value!r}", **bounds)


def mark_inert(parameter: nn.Parameter) -> nn.Parameter:
    """Declare a parameter that the forward multiplies by 0 on purpose (it exists so that
    parameter counts and state dicts equal a reference's, e.g. Hyena's zeroed skip D): its
    gradient is always 0, and the architecture contract's gradient check expects that."""
    parameter.inert = True  # type: ignore[attr-defined]
    return parameter


def is_inert(parameter: nn.Parameter) -> bool:
    return getattr(parameter, "inert", False)


class Mixer(nn.Module):
    """A causal sequence mixer [B, T, d] -> [B, T, d] framed by two sites.

    Subclasses implement :meth:`mix`; the sites ``input`` and ``output`` make
    ``layers.{i}.mixer.input`` / ``layers.{i}.mixer.output`` addressable. ``short_conv`` is
    the short-convolution switch's conv on the mixer's input (``model.short_conv`` on an
    architecture without convs of its own): the backbone sets it, :meth:`mix` sees its output.
    """

    def __init__(self) -> None:
        super().__init__()
        self.input = Site()
        self.short_conv: ShortConv | None = None
        self.output = Site()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.input(x)
        if self.short_conv is not None:
            x = self.short_conv(x)
        return self.output(self.mix(x))

    def mix(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def init_special(self) -> None:
        """Re-initialise parameters whose init is part of the architecture (after the generic
        normal(0.02) init of every Linear and Embedding). Default: nothing special."""

    # ------------------------------------------------------------ running from a prefix
    # An intervention at position p leaves every position before p as the corrupted run had
    # it. A mixer that can carry its state across a cut lets the engine run a patched row from
    # p on only: :meth:`prefix` once over the corrupted documents (every position's final
    # state), then :meth:`forward_from` per patched row (the state carried into p its initial
    # state). The defaults (no state: recompute the whole window) are right for every causal
    # mixer, plugins included. A mixer with a state sets :attr:`carries` and overrides
    # :meth:`halo`, :meth:`final_states` and :meth:`mix_from`; one whose window carries
    # everything (a short conv and per-position maps) overrides :meth:`halo` alone.

    #: What the mixer carries from one position to the next besides its window: None
    #: (nothing), "state" (a fixed-size recurrent state, which the state site
    #: ``layers.{i}.mixer.state`` patches: :meth:`final_states` is the state after every
    #: position, [B, T, ...] or a tuple of such, and :meth:`mix_from` takes ``replace``) or
    #: "history" (every input before the cut: attention's keys and values, a long
    #: convolution's input; :meth:`final_states` is that input at every position, [B, T, ...]).
    carries: Carry | None = None

    #: Whether the intervention engine resumes this mixer from its prefix (interventions/
    #: prefix.py) or recomputes its window from the document's start. Resuming gathers each
    #: row's state, so it pays where the whole window is a sequential scan (Mamba, GLA) and
    #: loses where a parallel form recomputes the window faster than states of many floats
    #: per position are gathered (Mamba-2, Gated DeltaNet, DeltaNet, Based set it False:
    #: docs/performance.md). The state site works either way; both paths compute the same
    #: numbers (tests/test_prefix.py).
    resume_from_prefix = True

    def halo(self) -> int | None:
        """How many positions before the cut :meth:`mix_from` reads besides its initial state
        (a short conv of k taps: k - 1); None: it cannot resume, its window starts at 0."""
        return None

    def final_states(self, x: torch.Tensor) -> Any:
        """What the mixer carries out of every position of ``x`` [B, T, d] (the input
        :meth:`mix` sees), as :attr:`carries` says; None where it carries nothing."""
        return None

    def mix_from(
        self, x: torch.Tensor, offset: int, initial_state: Any, replace: bool = False
    ) -> torch.Tensor:
        """:meth:`mix`'s outputs at positions ``offset``.. of the window ``x`` [R, W, d],
        given the state carried into window position ``offset`` (:meth:`Prefix.initial_state`):
        [R, W - offset, d]. With ``replace`` (mixers that carry a "state" only)
        ``initial_state`` is the state *after* position ``offset`` instead, which its output
        there reads: the state site."""
        if replace:
            raise NotImplementedError(f"{type(self).__name__} has no recurrent state site")
        return self.mix(x)[:, offset:]

    def prefix(self, x: torch.Tensor) -> Prefix | None:
        """This mixer's run over ``x`` [B, T, d] (its ``input`` site's values) kept for
        resuming it at any position, the short-conv switch's conv included; None where it
        cannot resume (:meth:`halo` None)."""
        halo = self.halo()
        if halo is None:
            return None
        if self.short_conv is not None:
            x = self.short_conv(x)
            halo += self.short_conv.kernel_size - 1
        return Prefix(halo, self.final_states(x), self.carries)

    def forward_from(
        self,
        x: torch.Tensor,
        offset: int,
        initial_state: Any,
        replace: bool = False,
        whole: bool = False,
    ) -> torch.Tensor:
        """:meth:`forward` at window positions ``offset``.. (see :meth:`mix_from`). Every
        site sees the positions it computes, a suffix of the document (the ``input`` site the
        window, ``output`` positions ``offset``..): ``patch(..., length=)`` reads them so.
        ``whole``: the window starts at position 0 and is recomputed, as the defaults do,
        whatever the mixer's own resuming (the engine does so where it keeps no prefix)."""
        x = self.input(x)
        if self.short_conv is not None:
            x = self.short_conv(x)
        if whole:
            y = Mixer.mix_from(self, x, offset, None)
        elif replace:
            y = self.mix_from(x, offset, initial_state, replace=True)
        else:  # a mixer without a state site need not take `replace`
            y = self.mix_from(x, offset, initial_state)
        return self.output(y)

    # ------------------------------------------------------------------------ state size
    def recurrent_state_size(self, seq_len: int) -> int | None:
        """Floats of the mixer's own state for one sequence after ``seq_len`` tokens (a
        recurrence's state; attention's keys and values), short convs aside. None: unknown
        (the default, e.g. a plugin that does not say)."""
        return None

    def state_size(self, seq_len: int) -> int | None:
        """Floats one sequence carries through this mixer at inference after ``seq_len``
        tokens (zoology's state size): :meth:`recurrent_state_size` plus the last k - 1
        inputs of every short conv of k taps (the switch's included). None if unknown."""
        own = self.recurrent_state_size(seq_len)
        if own is None:
            return None
        convs = (m for m in self.modules() if isinstance(m, ShortConv))
        return own + sum((conv.kernel_size - 1) * conv.weight.shape[0] for conv in convs)

    def max_length(self) -> int | None:
        """The longest sequence this mixer can take (e.g. an implicit filter's l_max); None
        for any length. Checked against the task's longest document when a config resolves."""
        return None


def with_history(before: torch.Tensor | None, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A convolution's input ``x`` [R, S, C] after its inputs ``before`` [R, P, C] (None:
    none), for a mixer resumed from a prefix: (the whole history [R, P + S, C], P)."""
    if before is None:
        return x, 0
    return torch.cat([before, x], dim=1), before.shape[1]


def index_states(states: Any, *index: torch.Tensor | int) -> Any:
    """``states[index]`` of a recurrent state kept per position: one tensor [B, T, ...] or a
    tuple of them (Based's S and z)."""
    if isinstance(states, tuple):
        return tuple(part[index] for part in states)
    return states[index]


def _nbytes(states: Any) -> int:
    parts = states if isinstance(states, tuple) else (states,)
    return sum(part.numel() * part.element_size() for part in parts if part is not None)


@dataclass(frozen=True)
class Prefix:
    """A mixer's run over documents, kept for resuming it at any position (:meth:`Mixer.prefix`):
    ``halo`` inputs before a cut that it reads, and ``states``, what it carries out of every
    position (None where it carries nothing), read as ``carries`` says."""

    halo: int
    states: Any
    carries: Carry | None

    def after(self, rows: torch.Tensor, positions: torch.Tensor | int) -> Any:
        """The recurrent state after ``positions`` of documents ``rows`` (a "state" mixer's:
        what its state site holds there)."""
        return index_states(self.states, rows, positions)

    def initial_state(self, rows: torch.Tensor, start: int) -> Any:
        """The state carried into position ``start`` of documents ``rows``: the state after
        ``start`` - 1, or the history before ``start``; None at 0 or where nothing is carried."""
        if self.states is None or start == 0:
            return None
        if self.carries == "history":
            return index_states(self.states, rows, slice(start))
        return self.after(rows, start - 1)

    @property
    def nbytes(self) -> int:
        return 0 if self.states is None else _nbytes(self.states)
