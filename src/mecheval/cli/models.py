"""`mecheval models ...`: the architecture registry, parameter counts and sites."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from mecheval.cli import app
from mecheval.models import ARCHITECTURES, ModelConfig, build_model, count_parameters, site_names

models_app = typer.Typer(help="Inspect the model zoo.", no_args_is_help=True)
app.add_typer(models_app, name="models")

WIDTHS = (16, 32, 64, 128, 256)


@models_app.command("list")
def list_models(
    vocab_size: int = typer.Option(8192, help="vocabulary size used for the counts"),
    max_len: int = typer.Option(64, help="position-embedding length used for the counts"),
    n_layers: int = typer.Option(2, help="number of layers"),
    sites: bool = typer.Option(True, help="also list each architecture's sites"),
) -> None:
    """Parameter counts per architecture and width, and each architecture's sites."""
    console = Console()
    table = Table(title=f"parameters (vocab {vocab_size}, {n_layers} layers, max_len {max_len})")
    table.add_column("architecture")
    for d in WIDTHS:
        table.add_column(f"d={d}", justify="right")
    site_lists = {}
    for name in ARCHITECTURES:
        row = [name]
        for d in WIDTHS:
            cfg = ModelConfig(
                architecture=name,
                d_model=d,
                n_layers=n_layers,
                vocab_size=vocab_size,
                max_len=max_len,
            )
            model = build_model(cfg)
            row.append(f"{count_parameters(model):,}")
        site_lists[name] = site_names(model)
        table.add_row(*row)
    console.print(table)
    if sites:
        for name, names in site_lists.items():
            console.print(f"[bold]{name}[/bold] ({ARCHITECTURES[name].description})")
            console.print("  " + "\n  ".join(names), highlight=False)
