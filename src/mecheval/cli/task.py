"""`mecheval task ...`: look at task documents and corpus statistics."""

from __future__ import annotations

from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mecheval.cli.app import command_group
from mecheval.errors import ConfigError
from mecheval.tasks import SPLITS, TASKS, TaskConfig, TaskDataset, build_datasets
from mecheval.tasks.registry import parse_task
from mecheval.tasks.stats import dataset_stats

task_app = command_group("task", "Inspect the synthetic tasks.")

ROLE_STYLE = {
    "key": "bold red",
    "value": "bold green",
    "next_key": "cyan",
    "divider": "magenta",
    "query": "bold yellow",
    "stale_key": "red",
    "stale_value": "green",
}
# The arguments that `task show` and `task stats` share.
Kind = Annotated[str, typer.Argument(help=f"task kind: {' or '.join(TASKS)}")]
Overrides = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="override a task field, e.g. n_pairs=4 or task.n_pairs=4 (repeatable)",
    ),
]
Split = Annotated[str, typer.Option(help="train, dev or test")]


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


def _documents(
    kind: str, overrides: list[str] | None, split: str, n: int
) -> tuple[TaskConfig, TaskDataset]:
    """``n`` documents of ``split`` of the task ``kind`` with ``overrides``, and their config."""
    # Build only the split asked for, and only n documents of it: looking at a few documents
    # should not cost a paper-size build. (The documents are those of this smaller config.)
    if split not in SPLITS:
        raise ConfigError(f"--split: unknown {split!r} (expected one of: {', '.join(SPLITS)})")
    if n < 1:
        raise ConfigError(f"-n: expected at least 1 (got {n})")
    sizes = {f"n_{s}": (n if s == split else 0) for s in SPLITS}
    cfg = task_config(kind, overrides or [], **sizes)
    return cfg, build_datasets(cfg)[split]


@task_app.command("show")
def show(
    kind: Kind,
    n: Annotated[int, typer.Option("-n", help="number of documents")] = 3,
    overrides: Overrides = None,
    split: Split = "train",
) -> None:
    """Print documents with their roles marked, and the answer."""
    cfg, ds = _documents(kind, overrides, split, n)
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
    kind: Kind,
    n: Annotated[int, typer.Option("-n", help="number of documents to measure")] = 1000,
    overrides: Overrides = None,
    split: Split = "train",
) -> None:
    """Corpus statistics: lengths, tree depth and branching, repeats, role distances."""
    _, ds = _documents(kind, overrides, split, n)
    table = Table(title=f"{kind} {split}: {len(ds)} documents")
    table.add_column("statistic")
    cols = ("mean", "min", "median", "p90", "max")
    for c in cols:
        table.add_column(c, justify="right")
    for name, summary in dataset_stats(ds).items():
        table.add_row(name, *(f"{summary[c]:.3g}" for c in cols))
    Console().print(table)
