"""The `mecheval` app: its command groups, listed in pipeline order, and the checks every
command shares. Each command module registers on :data:`app`; cli/__init__.py runs it."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from mecheval.errors import ConfigError

#: The commands in pipeline order (docs/architecture.md: tasks, models, training,
#: interventions, then the experiments over them), the order --help lists them in.
PIPELINE_ORDER = (
    "task",
    "models",
    "check-mixer",
    "train",
    "intervene",
    "sweep",
    "results",
    "report",
    "reproduce",
)

#: Plain (click) help, not typer's rich panels: those show a type on every option, flags
#: included (`--quiet <bool>` reads as if it took a value; `--quiet true` then fails oddly),
#: and keep a docstring's line breaks in mid-paragraph. Every Typer of the CLI takes it.
HELP_MARKUP = None


class CommandGroup(TyperGroup):
    """A command group whose --help lists its commands in :data:`PIPELINE_ORDER` (others after,
    as registered), each with the first paragraph of its help, whole: click cuts it at the
    terminal width or at the first full stop ("print the Fig." of "Fig. 3-style")."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        rank = {name: i for i, name in enumerate(PIPELINE_ORDER)}
        # A command missing from PIPELINE_ORDER still shows, last (tests/test_cli_help.py
        # fails on it, so that it gets its place).
        return sorted(super().list_commands(ctx), key=lambda name: rank.get(name, len(rank)))

    # The formatter is click's (vendored by newer typer, so no click import here).
    def format_commands(self, ctx: typer.Context, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.short_help or _first_paragraph(command.help or "")))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _first_paragraph(text: str) -> str:
    return " ".join(inspect.cleandoc(text).split("\n\n")[0].split())


app = typer.Typer(
    name="mecheval",
    help="Mechanistic evaluation of sequence-model architectures.",
    cls=CommandGroup,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=HELP_MARKUP,
)


@app.callback()
def options(
    plugin: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="FILE",
            help="a .py file that registers custom architectures (repeatable; see "
            "docs/custom-architecture.md)",
        ),
    ] = None,
) -> None:
    """Mechanistic evaluation of sequence-model architectures."""
    if plugin:
        from mecheval.models.registry import use_plugins

        use_plugins(plugin)


def command_group(name: str, description: str) -> typer.Typer:
    """The group of commands ``mecheval NAME ...``, its --help as the top level's."""
    group = typer.Typer(
        help=description, cls=CommandGroup, no_args_is_help=True, rich_markup_mode=HELP_MARKUP
    )
    app.add_typer(group, name=name)
    return group


def check_out(out: Path) -> Path:
    """``--out`` must be a folder (or not exist yet): checked before anything is written."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file, expected a folder")
    return out
