"""`mecheval train`: train one model into a run folder (resumes, or skips when done)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from mecheval.cli.app import app, check_out
from mecheval.errors import ConfigError, validate


def _format(results: dict, split: str) -> str:
    r = results.get(split)
    if not r:
        return ""
    return f"{split} p(y)={r['likelihood']:.3f} acc={r['accuracy']:.3f}"


@app.command("train")
def train_command(
    config: Annotated[
        Path | None,
        typer.Argument(help="run config YAML (or use --preset instead)", show_default=False),
    ] = None,
    preset: Annotated[str | None, typer.Option(help="base config: paper | quick | tiny")] = None,
    task: Annotated[str, typer.Option(help="with --preset: task kind (ar, atr, …)")] = "ar",
    arch: Annotated[str, typer.Option(help="with --preset: architecture name")] = "attention",
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", help="override a field, e.g. --set training.lr=3e-4 (repeatable)"),
    ] = None,
    out: Annotated[Path, typer.Option(help="folder that holds run folders")] = Path("runs"),
    name: Annotated[str | None, typer.Option(help="run folder name (default: from config)")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="dataset cache folder")] = None,
    print_config: Annotated[
        bool, typer.Option("--print-config", help="print the resolved config and exit")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
    track_mechanism: Annotated[
        bool,
        typer.Option(
            "--track-mechanism",
            help="at every evaluation, restore @ key/value/query at the last layer's input "
            "on 64 dev documents (emergence.csv), to plot how the mechanism forms",
        ),
    ] = False,
) -> None:
    """Train a model: `mecheval train run.yaml` or `mecheval train --preset quick --arch mamba`.

    The run goes to OUT/NAME/. A finished run is skipped; an unfinished one resumes from its
    last checkpoint. Exit status: 0 done, 1 diverged, 2 bad config, 130 Ctrl-C, 143 SIGTERM
    (the run is marked failed, "crashed: interrupted", and resumes when run again).
    """
    from mecheval.cli.run_progress import run_reporter
    from mecheval.training import config as run_config
    from mecheval.training.folder import is_finished, peek_status
    from mecheval.training.presets import preset as preset_data
    from mecheval.training.resolved import ResolvedRun
    from mecheval.training.run import Terminated, stop_on_sigterm, train_run

    if (config is None) == (preset is None):
        raise ConfigError("train: give either a CONFIG file or --preset (not both)")
    if config is not None:
        cfg = run_config.load_config(config, overrides or [])
    else:
        assert preset is not None
        data = preset_data(preset, task, arch)
        cfg = run_config.config_from_data(data, overrides or [], source="preset")
    if name is None and cfg.name is None and preset is not None:
        # Keeps a quick and a paper run of the same model apart under one --out.
        name = f"{preset}-{run_config.default_name(cfg)}"
    if name is not None:
        cfg = validate(run_config.RunConfig, dict(cfg.model_dump(mode="json"), name=name))
    cfg = run_config.resolve(cfg)
    if print_config:
        sys.stdout.write(run_config.dump_yaml(cfg))
        return
    assert cfg.name is not None
    run = ResolvedRun(cfg, check_out(out) / cfg.name, cache_dir)
    run_dir = run.run_dir
    skipped = is_finished(peek_status(run_dir))
    callbacks = []
    if track_mechanism:
        # The CLI wires a higher stage into training; training itself never imports it.
        from mecheval.experiments.mechanisms import EmergenceCallback

        callbacks.append(EmergenceCallback(cfg.task, cfg.model.n_layers, cache_dir=cache_dir))
    try:
        with stop_on_sigterm():
            status = train_run(run, callbacks, reporter=run_reporter(cfg.name, quiet))
    except KeyboardInterrupt as err:
        step = (peek_status(run_dir) or {}).get("step", 0)
        print(f"interrupted: {run_dir} at step {step}; run again to resume", file=sys.stderr)
        raise typer.Exit(128 + err.signum if isinstance(err, Terminated) else 130) from None
    metrics = status.get("metrics") or {}
    if status["state"] == "failed":
        print(
            f"failed: {run_dir}: {status.get('reason')} (step {status.get('step')})",
            file=sys.stderr,
        )
        raise typer.Exit(1)
    parts = [p for p in (_format(metrics, "dev"), _format(metrics, "test")) if p]
    wall = status.get("wall_time")
    timing = f"{status['step']} steps in {wall:.1f} s" if wall is not None else ""
    word = "done (already, skipped)" if skipped else "done"
    print(f"{word}: {run_dir}  " + " | ".join([*parts, timing]))
