"""`mecheval intervene RUN_DIR`: the paper's mechanistic metrics for one trained run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mecheval.cli.app import app
from mecheval.cli.experiments import Documents, check_documents
from mecheval.errors import ConfigError
from mecheval.interventions.attribution import DEFAULT_STEPS, METHODS

RunDir = Annotated[Path, typer.Argument(help="a finished run folder")]
Sites = Annotated[
    list[str] | None,
    typer.Option(
        "--sites",
        metavar="SITE",
        help="sites to patch (repeatable); default all module sites. A recurrent "
        "mixer's state is the site layers.{i}.mixer.state (docs/architecture.md)",
    ),
]
Roles = Annotated[
    list[str] | None,
    typer.Option("--roles", metavar="ROLE", help="roles to patch (repeatable); default all"),
]
Split = Annotated[str, typer.Option(help="dev | test")]
NDocs = Annotated[int | None, typer.Option("-n", help="documents (default: the split)")]
Metric = Annotated[
    str,
    typer.Option(help="likelihood | accuracy | in_context_mass | in_context_accuracy"),
]
Device = Annotated[
    str, typer.Option(help="run the model and the interventions on: cpu, cuda, cuda:N, mps")
]
Method = Annotated[
    str,
    typer.Option(
        help="exact (a patched forward per site and role) | attribution (activation "
        "difference times gradient: one backward) | integrated-gradients (gradients "
        "averaged on the path from the corrupted to the original embeddings) | "
        "attribution-log (attribution of log p(answer), mapped back) | attribution-qk "
        "(attribution-log with an attention layer's pattern taken exactly, AtP*'s fix) | "
        "attribution-gd (AtP*'s GradDrop: the mean magnitude of attribution-log's step with "
        "each layer's gradient dropped); an estimate is graded against the exact table on "
        "the same documents"
    ),
]
Steps = Annotated[int, typer.Option(help="integrated-gradients: points on the path")]


@app.command("intervene")
def intervene_command(
    run_dir: RunDir,
    sites: Sites = None,
    roles: Roles = None,
    split: Split = "test",
    n_docs: NDocs = None,
    metric: Metric = "likelihood",
    documents: Documents = "all",
    device: Device = "cpu",
    method: Method = "exact",
    steps: Steps = DEFAULT_STEPS,
) -> None:
    """Restore each (site, role) from the original into the key-corrupted document; print
    the Fig. 3-style table and the mechanism label; write interventions.csv into RUN_DIR
    (with an estimating --method also its table, attribution.csv, and its grade against
    the exact one, attribution.json)."""
    from mecheval.experiments.mechanisms import InterventionPlan, intervene_run
    from mecheval.training.config import check_device
    from mecheval.training.folder import load_run
    from mecheval.training.reporter import print_warning

    _check_options(split, metric, method, steps, n_docs)
    check_documents(documents)
    check_device(device, "--device")
    cfg, model = load_run(run_dir, device)
    _check_names(cfg, model, sites, roles)
    plan = InterventionPlan(
        sites=tuple(sites) if sites else None,
        roles=tuple(roles) if roles else None,
        split=split,
        n_docs=n_docs,
        documents=documents,
        methods=() if method == "exact" else (method,),
        steps=steps,
    )
    plan.check_tasks([cfg.task])
    measured = intervene_run(run_dir, plan, loaded=(cfg, model))
    assert measured is not None  # skip_existing is off
    if measured.unfinished:
        print_warning(
            f"{run_dir}: {measured.unfinished}; its weights are not its final ones, and "
            "its label is marked as read from an unfinished run"
        )
    if measured.graded:
        _print_estimate(run_dir, measured.graded[0], measured.n_docs, split, documents)
    else:
        _print_exact(run_dir, measured, metric, split, documents)


def _check_options(split: str, metric: str, method: str, steps: int, n_docs: int | None) -> None:
    from mecheval.interventions.result import RESTORE_METRICS

    if split not in ("dev", "test"):
        raise ConfigError(f"--split: expected dev or test, got {split!r}")
    if metric not in RESTORE_METRICS:
        raise ConfigError(f"--metric: expected one of {', '.join(RESTORE_METRICS)}, got {metric!r}")
    if method != "exact" and method not in METHODS:
        raise ConfigError(
            f"--method: expected exact or one of {', '.join(METHODS)}, got {method!r}"
        )
    if method != "exact" and metric != "likelihood":
        raise ConfigError(f"--metric: {method} estimates the likelihood only, got {metric!r}")
    if steps < 1:
        raise ConfigError(f"--steps: expected >= 1, got {steps}")
    if n_docs is not None and n_docs < 1:
        raise ConfigError(f"-n: expected >= 1, got {n_docs}")


def _check_names(cfg, model, sites: list[str] | None, roles: list[str] | None) -> None:
    """Every --sites a site of the run's model, every --roles a role of its task."""
    from mecheval.models import site_names
    from mecheval.models.sites import state_site_names

    # The recurrent-state sites are asked for by name; "all" means the module sites.
    known = site_names(model) + state_site_names(model)
    for site in sites or []:
        if site not in known:
            raise ConfigError(f"--sites: {site!r} is not a site of this model ({', '.join(known)})")
    task_roles = cfg.task.roles()
    for role in roles or []:
        if role not in task_roles:
            raise ConfigError(f"--roles: unknown {role!r} (expected: {', '.join(task_roles)})")


def _print_exact(run_dir: Path, measured, metric: str, split: str, documents: str) -> None:
    """The exact table and the mechanism label (or where one would be read)."""
    from mecheval.interventions import restore_view
    from mecheval.interventions.metrics import interval_view
    from mecheval.training.folder import INTERVENTIONS_FILE

    view = restore_view(measured.result.table, metric=metric)
    which = "" if documents == "all" else f" {documents}"
    what = "the true answer" if metric in ("likelihood", "accuracy") else "the candidates"
    typer.echo(f"{metric} of {what} (%), {split} split, {measured.n_docs}{which} documents:")
    typer.echo(view.to_markdown())
    if metric == "likelihood":
        typer.echo("\n95 % intervals of the restores (bootstrap over the documents):")
        typer.echo(interval_view(measured.result.per_example).to_markdown())
    if measured.label is None:
        where = " or ".join(measured.label_sites)
        typer.echo(
            f"\nmechanism: not read here; a label is read from the key, value and query "
            f"restores at {where} (add --sites {measured.label_sites[-1]})"
        )
    else:
        binding = measured.label.binding_line()
        if binding:
            typer.echo(f"\noriginal documents: {binding}")
        unfinished = measured.unfinished
        mark = f" (read from an unfinished run: {unfinished})" if unfinished else ""
        typer.echo(f"\nmechanism: {measured.label}{mark}")
    typer.echo(f"wrote {run_dir / INTERVENTIONS_FILE}")


def _print_estimate(run_dir: Path, graded, n_docs: int, split: str, documents: str) -> None:
    """The estimated table, its label beside the exact one, and its grade."""
    from mecheval.interventions import restore_view
    from mecheval.training.folder import ATTRIBUTION_FILE, GRADES_FILE, INTERVENTIONS_FILE

    which = "" if documents == "all" else f" {documents}"
    typer.echo(
        f"likelihood of the true answer (%), {split} split, {n_docs}{which} documents, "
        f"estimated by {graded.method}:"
    )
    typer.echo(restore_view(graded.result.table).to_markdown())
    typer.echo("")
    typer.echo(grade_text(graded.record))
    typer.echo(f"wrote {run_dir / INTERVENTIONS_FILE} (exact), {ATTRIBUTION_FILE}, {GRADES_FILE}")


def grade_text(record: dict) -> str:
    """A grade (experiments.mechanisms.grade_methods' record) in a few lines."""
    k = record["k"]
    recall = (
        "no cell recovers half the range exactly"
        if k == 0
        else f"top-{k} recall {record['recall']:.2f} ({k} cells recover half the range exactly)"
    )
    agree = {True: "agree", False: "differ", None: "not both read"}[record["agrees"]]
    speed = record["exact_seconds"] / record["seconds"] if record["seconds"] else float("nan")
    graded = (
        f"graded over {record['cells']} cells: Pearson r {record['pearson']:.3f}, "
        f"Spearman rho {record['spearman']:.3f}, {recall}, mean |error| "
        f"{100 * record['error']:.1f} points"
    )
    if not record.get("gradable", True):
        graded = (
            f"nothing to grade: the corruption moves the answer's likelihood by "
            f"{100 * record['effect']:.1f} points [{100 * record['effect_low']:.1f}, "
            f"{100 * record['effect_high']:.1f}] (95 % over the documents), inside its noise"
        )
    return (
        f"mechanism ({record['method']}): {record['label']}\n"
        f"mechanism (exact): {record['exact_label']}  -> labels {agree}\n"
        f"{graded}\n"
        f"time: {record['seconds']:.2f} s against the exact engine's "
        f"{record['exact_seconds']:.2f} s ({speed:.1f}x)"
    )
