"""Do two versions of mecheval give the same results? For a refactor, byte for byte.

    python scripts/same_results.py record FOLDER [--quick]   # this checkout's results
    python scripts/same_results.py compare BEFORE AFTER       # exit 1 where they differ

``record`` runs every registered experiment at the tiny preset in this process (as the
tests' tiny catalog does: ``reproduce NAME --preset tiny -q --out FOLDER/runs``), with
``--quick`` also ``reproduce ar --preset quick``, and writes ``FOLDER/results.json``: per
experiment, the sha256 of every ``model.safetensors`` it wrote and of what it printed. What
is printed is compared with what a run cannot repeat masked: the output folder, the wall time
on the summary line, and the measured seconds of the attribution grading table.
``compare`` names every experiment, model and output that differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

#: What a second run of the same code prints differently: (pattern, replacement).
UNREPEATABLE = [
    (re.compile(r"failed, (?:\d+ min )?\d+ s$", re.MULTILINE), "failed, <time>"),
    # The attribution grading table's last two columns: seconds per method, measured.
    (re.compile(r"\| [\d.]+ \| [\d.]+ \|$", re.MULTILINE), "| <s> | <s> |"),
]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def printed(output: str, out: Path) -> str:
    output = output.replace(str(out), "<out>")
    for pattern, replacement in UNREPEATABLE:
        output = pattern.sub(replacement, output)
    return output


def record(folder: Path, quick: bool) -> None:
    from typer.testing import CliRunner

    from mecheval.cli import _register, app
    from mecheval.experiments.catalog import list_experiments

    _register()
    out = folder / "runs"
    commands = {e.name: [e.name, "--preset", "tiny"] for e in list_experiments()}
    if quick:
        commands["ar quick"] = ["ar", "--preset", "quick"]
    results = {}
    for name, args in commands.items():
        result = CliRunner().invoke(app, ["reproduce", *args, "-q", "--out", str(out)])
        if result.exit_code not in (0, 1):
            raise SystemExit(f"{name}: exit {result.exit_code}\n{result.output}")
        text = printed(result.output, out)
        (folder / f"{name.replace(' ', '-')}.txt").write_text(text)
        sweep = out / f"{args[0]}-{args[2]}"
        models = {
            str(path.relative_to(out)): sha256(path.read_bytes())
            for path in sorted(sweep.glob("*/model.safetensors"))
        }
        results[name] = {
            "exit": result.exit_code,
            "printed": sha256(text.encode()),
            "models": models,
        }
        print(f"{name}: exit {result.exit_code}, {len(models)} models", flush=True)
    (folder / "results.json").write_text(json.dumps(results, indent=1))


def _flat(recorded: dict) -> dict:
    """One experiment's record as key -> value, each model under its path."""
    return {"exit": recorded["exit"], "printed": recorded["printed"], **recorded["models"]}


def compare(before: Path, after: Path) -> int:
    a = json.loads((before / "results.json").read_text())
    b = json.loads((after / "results.json").read_text())
    differ = [f"{name}: only in {before}" for name in a.keys() - b.keys()]
    differ += [f"{name}: only in {after}" for name in b.keys() - a.keys()]
    for name in a.keys() & b.keys():
        before, after = _flat(a[name]), _flat(b[name])
        for key in sorted(before.keys() | after.keys()):
            if before.get(key) != after.get(key):
                differ.append(f"{name}: {key} differs")
    models = sum(len(v["models"]) for v in a.values())
    print("\n".join(sorted(differ)) or f"same: {len(a)} experiments, {models} models, outputs")
    return 1 if differ else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("folder", type=Path)
    rec.add_argument("--quick", action="store_true", help="also reproduce ar --preset quick")
    cmp = sub.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "record":
        args.folder.mkdir(parents=True, exist_ok=True)
        record(args.folder, args.quick)
    else:
        sys.exit(compare(args.before, args.after))


if __name__ == "__main__":
    main()
