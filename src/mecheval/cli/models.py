"""`mecheval models ...`: the architecture registry, parameter counts and sites."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from mecheval.cli.app import app, command_group
from mecheval.errors import validate
from mecheval.models import ModelConfig, build_model, count_parameters, site_names, state_size
from mecheval.models.registry import available_architectures, get_architecture

models_app = command_group("models", "Inspect the model zoo.")

WIDTHS = (16, 32, 64, 128, 256)


@models_app.command("list")
def list_models(
    vocab_size: int = typer.Option(8192, help="vocabulary size used for the counts"),
    max_len: int = typer.Option(64, help="position-embedding length used for the counts"),
    n_layers: int = typer.Option(2, help="number of layers"),
    sites: bool = typer.Option(True, help="also list each architecture's sites"),
    layers: str | None = typer.Option(
        None,
        help="a hybrid's layers instead of every architecture: names, comma-separated "
        "(mamba,attention), or a YAML list (parallel layers too; docs/hybrids.md)",
    ),
) -> None:
    """Parameter counts per architecture and width, the state each carries per sequence at
    inference, and each architecture's sites (or one hybrid's: --layers)."""
    models = {name: {"architecture": name} for name in available_architectures()}
    if layers is not None:
        hybrid = _hybrid_layers(layers)
        models = {validate(ModelConfig, hybrid, prefix="--layers").architecture: hybrid}
        n_layers = len(hybrid["layers"])
    console = Console()
    table = Table(title=f"parameters (vocab {vocab_size}, {n_layers} layers, max_len {max_len})")
    states = Table(
        title=f"state: floats per sequence after {max_len} tokens (KV cache, recurrent states, "
        "conv buffers)"
    )
    for t in (table, states):
        t.add_column("architecture")
        for d in WIDTHS:
            t.add_column(f"d={d}", justify="right")
    site_lists = {}
    shape = {"n_layers": n_layers, "vocab_size": vocab_size, "max_len": max_len}
    for name, model_fields in models.items():
        row, state_row = [name], [name]
        for d in WIDTHS:
            model = build_model(ModelConfig(**model_fields, d_model=d, **shape))
            row.append(f"{count_parameters(model):,}")
            size = state_size(model, max_len)
            state_row.append("—" if size is None else f"{size:,}")
        site_lists[name] = site_names(model)
        table.add_row(*row)
        states.add_row(*state_row)
    console.print(table)
    console.print(states)
    if sites:
        for name, names in site_lists.items():
            what = "a hybrid" if layers is not None else get_architecture(name).description
            console.print(f"[bold]{name}[/bold] ({what})")
            console.print("  " + "\n  ".join(names), highlight=False)


def _hybrid_layers(text: str) -> dict:
    """``--layers``' value as ModelConfig fields: a YAML list, or names comma-separated."""
    import yaml

    from mecheval.errors import ConfigError

    try:
        value = yaml.safe_load(text if text.lstrip().startswith("[") else f"[{text}]")
    except yaml.YAMLError:
        raise ConfigError(f"--layers: expected names or a YAML list (got {text!r})") from None
    return {"layers": value}


@app.command("check-mixer")
def check_mixer(
    name: Annotated[
        str,
        typer.Argument(
            help="a registered architecture (see models list), or a hybrid's layers joined "
            "by + (a parallel layer's branches by ~): mamba+attention~hyena"
        ),
    ],
    option: Annotated[
        list[str] | None,
        typer.Option(
            "--set", metavar="KEY=VALUE", help="a mixer option, key=value (YAML value), repeatable"
        ),
    ] = None,
) -> None:
    """Run the architecture contract on NAME: shapes, causality, batch independence, query
    logits, gradients, sites, site patching, resuming, and the intervention engine. Exit 1 on
    a failure. A hybrid's layers take their default options."""
    import yaml

    from mecheval.contract import run_checks
    from mecheval.errors import ConfigError

    options = {}
    for item in option or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected key=value")
        options[key] = yaml.safe_load(value)
    results = run_checks(name, options)
    table = Table(title=f"mecheval check-mixer {name}")
    for column in ("check", "result", "detail", "s"):
        table.add_column(column, justify="right" if column == "s" else "left")
    for r in results:
        verdict = "[green]pass[/green]" if r.passed else "[red]FAIL[/red]"
        table.add_row(r.name, verdict, r.detail, f"{r.seconds:.1f}")
    Console().print(table)
    failed = [r.name for r in results if not r.passed]
    if failed:
        typer.echo(f"{name}: {len(failed)} of {len(results)} checks failed: {', '.join(failed)}")
        raise typer.Exit(1)
    typer.echo(f"{name}: all {len(results)} checks passed")
