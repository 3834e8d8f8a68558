"""`mecheval task ...`: look at task documents and corpus statistics."""

from __future__ import annotations

from typing import Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mecheval.cli import HELP_MARKUP, CommandGroup, app
from mecheval.errors import ConfigError
from mecheval.tasks import SPLITS, TASKS, TaskConfig, build_datasets
from mecheval.tasks.registry import parse_task
from mecheval.tasks.stats import dataset_stats

task_app = typer.Typer(
    help="Inspect the synthetic tasks.",
    cls=CommandGroup,
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
)
app.add_typer(task_app, name="task")

ROLE_STYLE = {
    "key": "bold red",
    "value": "bold green",
    "next_key": "cyan",
    "divider": "magenta",
    "query": "bold yellow",
    "stale_key": "red",
    "stale_value": "green",
}
_SET_HELP = "override a task field, e.g. n_pairs=4 or task.n_pairs=4 (repeatable)"


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        name = name.strip().removeprefix("task.")
        if not sep or not name or "." in name:
            raise ConfigError(f"--set: expected FIELD=VALUE or task.FIELD=VALUE (got {pair!r})")
        try:
            out[name] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ConfigError(f"--set {name}: cannot parse value {raw!r}") from None
    return out


def task_config(kind: str, overrides: list[str], **sizes: int) -> TaskConfig:
    if kind not in TASKS:
        raise ConfigError(f"task: unknown kind {kind!r} (expected one of: {', '.join(TASKS)})")
    data = {**sizes, **parse_overrides(overrides)}
    if data.pop("kind", kind) != kind:
        raise ConfigError("task.kind: give the kind as the command's argument, not in --set")
    return parse_task({"kind": kind, **data})


def _split_sizes(split: str, n: int) -> dict[str, int]:
    # Build only the split asked for, and only n documents of it: looking at a few documents
    # should not cost a paper-size build. (The documents are those of this smaller config.)
    if split not in SPLITS:
        raise ConfigError(f"--split: unknown {split!r} (expected one of: {', '.join(SPLITS)})")
    if n < 1:
        raise ConfigError(f"-n: expected at least 1 (got {n})")
    return {f"n_{s}": (n if s == split else 0) for s in SPLITS}


@task_app.command("show")
def show(
    kind: str = typer.Argument(..., help=f"task kind: {' or '.join(TASKS)}"),
    n: int = typer.Option(3, "-n", help="number of documents"),
    overrides: list[str] = typer.Option([], "--set", help=_SET_HELP),  # noqa: B008
    split: str = typer.Option("train", help="train, dev or test"),
) -> None:
    """Print documents with their roles marked, and the answer."""
    cfg = task_config(kind, overrides, **_split_sizes(split, n))
    ds = build_datasets(cfg)[split]
    names = cfg.id_names()
    console = Console(highlight=False)
    colour = console.is_terminal
    for i in range(len(ds)):
        marks: dict[int, list[str]] = {}
        for role, positions in ds.roles.items():
            marks.setdefault(int(positions[i]), []).append(role)
        parts = []
        for pos, tok in enumerate(ds.document(i)):
            name = escape(names[tok])
            roles = marks.get(pos)
            if not roles:
                parts.append(name)
            elif colour:
                parts.append(f"[{ROLE_STYLE.get(roles[0], 'bold')}]{name}[/]")
            else:
                parts.append(escape(f"[{','.join(roles)}:{names[tok]}]"))
        answer = escape(names[int(ds.answer[i])])
        extra = escape(cfg.describe(ds, i))
        # soft_wrap: one document per line when piped, so the output greps and diffs cleanly.
        console.print(f"{i}: " + " ".join(parts) + f" -> {answer}{extra}", soft_wrap=True)
    if colour:
        legend = "  ".join(f"[{ROLE_STYLE.get(role, 'bold')}]{role}[/]" for role in ds.roles)
        console.print("roles: " + legend)


@task_app.command("stats")
def stats(
    kind: str = typer.Argument(..., help=f"task kind: {' or '.join(TASKS)}"),
    n: int = typer.Option(1000, "-n", help="number of documents to measure"),
    overrides: list[str] = typer.Option([], "--set", help=_SET_HELP),  # noqa: B008
    split: str = typer.Option("train", help="train, dev or test"),
) -> None:
    """Corpus statistics: lengths, tree depth and branching, repeats, role distances."""
    cfg = task_config(kind, overrides, **_split_sizes(split, n))
    ds = build_datasets(cfg)[split]
    table = Table(title=f"{kind} {split}: {len(ds)} documents")
    table.add_column("statistic")
    cols = ("mean", "min", "median", "p90", "max")
    for c in cols:
        table.add_column(c, justify="right")
    for name, summary in dataset_stats(ds).items():
        table.add_row(name, *(f"{summary[c]:.3g}" for c in cols))
    Console().print(table)
