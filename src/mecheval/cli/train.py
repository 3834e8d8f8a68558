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


ConfigFile = Annotated[
    Path | None,
    typer.Argument(help="run config YAML (or use --preset instead)", show_default=False),
]
Preset = Annotated[str | None, typer.Option(help="base config: paper | quick | tiny")]
Task = Annotated[str, typer.Option(help="with --preset: task kind (ar, atr, …)")]
Arch = Annotated[str, typer.Option(help="with --preset: architecture name")]
Overrides = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="override a field, e.g. --set training.lr=3e-4 (repeatable)",
    ),
]
RunsOut = Annotated[Path, typer.Option(help="folder that holds run folders")]
Name = Annotated[str | None, typer.Option(help="run folder name (default: from config)")]
CacheDir = Annotated[Path | None, typer.Option(help="dataset cache folder")]
PrintConfig = Annotated[
    bool, typer.Option("--print-config", help="print the resolved config and exit")
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")]
TrackMechanism = Annotated[
    bool,
    typer.Option(
        "--track-mechanism",
        help="at every evaluation, restore @ key/value/query at the last layer's input "
        "on 64 dev documents (emergence.csv), to plot how the mechanism forms",
    ),
]


@app.command("train")
def train_command(
    config: ConfigFile = None,
    preset: Preset = None,
    task: Task = "ar",
    arch: Arch = "attention",
    overrides: Overrides = None,
    out: RunsOut = Path("runs"),
    name: Name = None,
    cache_dir: CacheDir = None,
    print_config: PrintConfig = False,
    quiet: Quiet = False,
    track_mechanism: TrackMechanism = False,
) -> None:
    """Train a model: `mecheval train run.yaml` or `mecheval train --preset quick --arch mamba`.

    The run goes to OUT/NAME/. A finished run is skipped; an unfinished one resumes from its
    last checkpoint. Exit status: 0 done, 1 diverged, 2 bad config, 130 Ctrl-C, 143 SIGTERM
    (the run is marked failed, "crashed: interrupted", and resumes when run again).
    """
    from mecheval.training import config as run_config
    from mecheval.training.folder import is_finished, peek_status
    from mecheval.training.resolved import ResolvedRun

    cfg = _run_config(config, preset, task, arch, overrides or [], name)
    if print_config:
        sys.stdout.write(run_config.dump_yaml(cfg))
        return
    assert cfg.name is not None
    run = ResolvedRun(cfg, check_out(out) / cfg.name, cache_dir)
    skipped = is_finished(peek_status(run.run_dir))
    callbacks = []
    if track_mechanism:
        # The CLI wires a higher stage into training; training itself never imports it.
        from mecheval.experiments.mechanisms import EmergenceCallback

        callbacks.append(EmergenceCallback(cfg.task, cfg.model.n_layers, cache_dir=cache_dir))
    status = _train(run, callbacks, quiet)
    _print_outcome(run.run_dir, status, skipped)


def _run_config(config, preset, task: str, arch: str, overrides: list[str], name):
    """The resolved config of a CONFIG file or a --preset, with --set and --name applied."""
    from mecheval.training import config as run_config
    from mecheval.training.presets import preset as preset_data

    if (config is None) == (preset is None):
        raise ConfigError("train: give either a CONFIG file or --preset (not both)")
    if config is not None:
        cfg = run_config.load_config(config, overrides)
    else:
        assert preset is not None
        data = preset_data(preset, task, arch)
        cfg = run_config.config_from_data(data, overrides, source="preset")
    if name is None and cfg.name is None and preset is not None:
        # Keeps a quick and a paper run of the same model apart under one --out.
        name = f"{preset}-{run_config.default_name(cfg)}"
    if name is not None:
        cfg = validate(run_config.RunConfig, dict(cfg.model_dump(mode="json"), name=name))
    return run_config.resolve(cfg)


def _train(run, callbacks: list, quiet: bool) -> dict:
    """Train the run; a Ctrl-C or SIGTERM exits 130 / 143 with where to resume."""
    from mecheval.cli.run_progress import run_reporter
    from mecheval.training.folder import peek_status
    from mecheval.training.run import Terminated, stop_on_sigterm, train_run
    from mecheval.training.stacking.group import replays_alone, train_runs

    try:
        with stop_on_sigterm():
            reporter = run_reporter(run.cfg.name, quiet)
            if not replays_alone(run):
                return train_run(run, callbacks, reporter=reporter)
            # On a GPU a lone run's step is replayed as a CUDA graph: a stack of one.
            return train_runs([run], callbacks=callbacks, reporter_for=lambda _: reporter)[0]
    except KeyboardInterrupt as err:
        step = (peek_status(run.run_dir) or {}).get("step", 0)
        print(f"interrupted: {run.run_dir} at step {step}; run again to resume", file=sys.stderr)
        raise typer.Exit(128 + err.signum if isinstance(err, Terminated) else 130) from None


def _print_outcome(run_dir: Path, status: dict, skipped: bool) -> None:
    """One line: done with the dev/test scores and the time, or failed (exit 1) with why."""
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
