"""The figures by name. A spec registers itself once with ``@figure(name, caption)``.

A spec takes the prepared results table (:func:`~mecheval.report.select.prepare`) and returns
a layout, or raises :class:`~mecheval.report.select.NoData`; ``FIGURES[name](df)`` does the
rest: prepares the table, names the figure in the error, renders the layout under the name.
The specs live in :mod:`mecheval.report.specs` (the paper's figures) and
:mod:`mecheval.report.extra_specs` (the others, registered after them), which the package
imports, so ``FIGURES`` is full (in the specs' order) whenever :mod:`mecheval.report` is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import pandas as pd

from mecheval.errors import ConfigError
from mecheval.report.render import FigureResult, Layout
from mecheval.report.results import normalise
from mecheval.report.select import NoData, prepare

Spec = Callable[[pd.DataFrame], Layout]
FIGURES: dict[str, Callable[[pd.DataFrame], FigureResult]] = {}


def figure(name: str, caption: str) -> Callable[[Spec], Spec]:
    """Register ``spec`` as the figure ``name``, shown with ``caption`` (one line: what to
    read from it): the one place a figure's name is written."""

    def register(spec: Spec) -> Spec:
        if name in FIGURES:
            raise ValueError(f"figure {name!r} is registered twice")

        @functools.wraps(spec)
        def make(df: pd.DataFrame) -> FigureResult:
            try:
                layout = spec(prepare(df))
            except NoData as err:
                # One line that says which figure, e.g. for the report's "without data" list.
                raise ConfigError(f"figure {name}: {err}") from None
            result = layout.render(name)
            result.caption = caption
            return result

        FIGURES[name] = make
        return spec

    return register


def available_figures(
    df: pd.DataFrame, names: Sequence[str] | None = None
) -> tuple[list[FigureResult], dict[str, str]]:
    """Every figure (``names`` None) or those named (possibly none) that the table has data
    for, and why the others are missing (name -> the one-line ConfigError message)."""
    results, skipped = [], {}
    df = normalise(df)
    for name in list(FIGURES) if names is None else names:
        if name not in FIGURES:
            raise ConfigError(f"--figure: unknown figure {name!r} (valid: {', '.join(FIGURES)})")
        try:
            results.append(FIGURES[name](df))
        except ConfigError as err:
            skipped[name] = str(err)
    return results, skipped
