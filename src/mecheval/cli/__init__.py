"""The `mecheval` command line: one sub-command group per pipeline stage."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from mecheval.errors import ConfigError

app = typer.Typer(
    name="mecheval",
    help="Mechanistic evaluation of sequence-model architectures.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def options(
    plugin: Annotated[
        list[Path] | None,
        typer.Option(
            help="a .py file that registers custom architectures (repeatable; see "
            "docs/custom-architecture.md)",
        ),
    ] = None,
) -> None:
    """Mechanistic evaluation of sequence-model architectures."""
    if plugin:
        from mecheval.models.registry import use_plugins

        use_plugins(plugin)


def _register() -> None:
    # Each stage's commands live in their own module; importing registers them on `app`.
    from mecheval.cli import (
        experiments,  # noqa: F401
        intervene,  # noqa: F401
        models,  # noqa: F401
        report,  # noqa: F401
        task,  # noqa: F401
        train,  # noqa: F401
    )


def main() -> None:
    _register()
    try:
        app()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
