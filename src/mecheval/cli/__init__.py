"""The `mecheval` command line: one sub-command group per pipeline stage."""

from __future__ import annotations

import sys

import typer

try:  # typer >= 0.20 carries its own copy of click, whose exceptions the CLI raises
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover
    from click import exceptions as click_errors

from mecheval.cli.app import PIPELINE_ORDER, app
from mecheval.errors import ConfigError

__all__ = ["PIPELINE_ORDER", "app", "main"]


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
    """The ``mecheval`` entry point. Every error a user can cause ends in one line on stderr
    (``error: ...``, exit 2), never a traceback or a framed usage box."""
    _register()
    try:
        code = app(standalone_mode=False)
    except click_errors.UsageError as err:
        if type(err).__name__ == "NoArgsIsHelpError":  # `mecheval`, `mecheval models`
            typer.echo(err.ctx.get_help() if err.ctx else "")
            sys.exit(2)
        where = f" (see {err.ctx.command_path} --help)" if err.ctx else ""
        print(f"error: {err.format_message()}{where}", file=sys.stderr)
        sys.exit(2)
    except click_errors.ClickException as err:
        print(f"error: {err.format_message()}", file=sys.stderr)
        sys.exit(err.exit_code)
    except typer.Abort:
        sys.exit(130)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
