"""`mecheval --help` and every command's: flags take no value placeholder, and the commands
are listed in pipeline order with their whole first paragraph."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from mecheval.cli import PIPELINE_ORDER, _register, app


def help_text(*path: str) -> str:
    _register()
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.output


def command_paths() -> list[tuple[str, ...]]:
    """Every command and group, as the words that name it (() is the root)."""
    _register()
    root = typer.main.get_command(app)
    paths: list[tuple[str, ...]] = []

    def walk(command, path: tuple[str, ...]) -> None:
        paths.append(path)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, (*path, name))

    walk(root, ())
    return paths


def listed_commands(text: str) -> list[str]:
    section = text.split("Commands:\n", 1)[1]
    return re.findall(r"^  (\S+)", section, flags=re.MULTILINE)


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "mecheval")
def test_flags_show_no_value_placeholder(path: tuple[str, ...]) -> None:
    text = help_text(*path)
    assert "<bool>" not in text
    # A repeatable option names what it takes (FILE, SITE, KEY=VALUE), not its Python type.
    assert not re.findall(r"^  -.*<list\[", text, flags=re.MULTILINE), text
    assert re.search(r"^  --help +Show this message", text, flags=re.MULTILINE), text


def test_quiet_reads_as_a_flag() -> None:
    text = help_text("reproduce")
    assert re.search(r"^  -q, --quiet +no progress display$", text, flags=re.MULTILINE), text
    # Options that take a value keep their placeholder.
    assert re.search(r"^  --workers <int> ", text, flags=re.MULTILINE), text


def test_commands_are_listed_in_pipeline_order() -> None:
    _register()
    registered = set(typer.main.get_command(app).commands)
    # A new command must be given its place in the pipeline, not fall to the end unseen.
    assert registered == set(PIPELINE_ORDER)
    assert listed_commands(help_text()) == list(PIPELINE_ORDER)


def test_command_summaries_are_whole() -> None:
    section = help_text().split("Commands:\n", 1)[1]
    assert "..." not in section
    # "Fig. 3-style" is not taken for the end of the first sentence.
    assert "print the Fig. 3-style table" in " ".join(section.split())
