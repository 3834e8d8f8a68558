"""Named, targeted mutants of mecheval's core, and the tests that must kill them.

Each mutant is one deliberate bug (an exact source edit). For each, the repository's tracked
files are copied to a scratch folder, the edit is applied there, and the mutant's tests run
against that copy (``PYTHONPATH`` puts its ``src/`` first). A mutant is *killed* when its tests
fail, *survives* when they pass. The script prints a table and exits 1 if any mutant survived
(or if the unmutated tests fail, or an edit no longer applies).

    python scripts/mutants.py            # every mutant (make mutants)
    python scripts/mutants.py -k scan    # mutants whose name contains "scan"
    python scripts/mutants.py --list
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = [
    Mutant(
        "engine-writes-nothing",
        "the batched engine restores nothing at a block boundary",
        "src/mecheval/interventions/engine.py",
        "x[torch.arange(len(docs), device=x.device), dst] = values",
        "x[torch.arange(len(docs), device=x.device), dst] = x[torch.arange(len(docs)), dst]",
        ("tests/test_interventions.py",),
    ),
    Mutant(
        "source-from-corrupted",
        "the restored activation is read from the corrupted run",
        "src/mecheval/interventions/engine.py",
        "values = source[doc_of_row, src_pos]",
        "values = sp.base[sp.site][doc_of_row, src_pos]",
        ("tests/test_interventions.py",),
    ),
    Mutant(
        "patch-hook-writes-nothing",
        "patch() returns the activation unchanged",
        "src/mecheval/interventions/patch.py",
        "        output = output.clone()\n        output[",
        "        output = output.clone()\n        return output\n        output[",
        ("tests/test_interventions.py", "tests/test_mechanism_labels.py"),
    ),
    Mutant(
        "value-role-off-by-one",
        "AR's value role points one token past the value",
        "src/mecheval/tasks/family.py",
        '"value": key + 1,',
        '"value": key + 2,',
        ("tests/test_ar.py", "tests/test_mechanism_labels.py"),
    ),
    Mutant(
        "corrupt-the-value",
        "corruption replaces the value instead of the key",
        "src/mecheval/tasks/corrupt.py",
        'pos = batch.roles["key"].cpu()',
        'pos = batch.roles["value"].cpu()',
        ("tests/test_ar.py", "tests/test_pcfg_atr.py", "tests/test_interventions.py"),
    ),
    Mutant(
        "loss-on-every-position",
        "the training loss covers every next token, not the answer alone",
        "src/mecheval/training/metrics.py",
        "    logits = model(batch.tokens, at=batch.query)\n"
        "    return F.cross_entropy(logits.float(), batch.answer)",
        "    logits = model(batch.tokens)\n"
        "    targets = batch.tokens.roll(-1, 1).flatten()\n"
        "    return F.cross_entropy(logits.flatten(0, 1).float(), targets)",
        ("tests/test_training.py",),
    ),
    Mutant(
        "no-causal-mask",
        "attention sees the future",
        "src/mecheval/models/mixers/attention.py",
        "is_causal=True",
        "is_causal=False",
        ("tests/test_references.py", "tests/test_models.py"),
    ),
    Mutant(
        "scan-runs-backwards",
        "Mamba's selective scan runs from the last step to the first",
        "src/mecheval/models/ops/selective_scan.py",
        "    xt = x.transpose(0, 1)\n    dt = delta.transpose(0, 1)",
        "    xt = x.transpose(0, 1).flip(0)\n    dt = delta.transpose(0, 1).flip(0)",
        ("tests/test_mixers_ssm.py",),
    ),
    Mutant(
        "labels-swap-value-and-query",
        "the mechanism labels read value as direct retrieval and query as induction",
        "src/mecheval/tasks/readings.py",
        '        "value": "induction",\n        "next_key": "induction (next key)",\n'
        '        "query": "direct retrieval, layer 0",',
        '        "value": "direct retrieval, layer 0",\n'
        '        "next_key": "induction (next key)",\n'
        '        "query": "induction",',
        ("tests/test_mechanism_labels.py", "tests/test_mechanisms.py"),
    ),
    Mutant(
        "atr-parent-from-wrong-production",
        "an ATR parent query is answered with the grandparent",
        "src/mecheval/tasks/atr.py",
        '    if qtype == "parent":\n        return list(par)',
        '    if qtype == "parent":\n        return [par[p] if p >= 0 else -1 for p in par]',
        ("tests/test_pcfg_atr.py",),
    ),
    Mutant(
        "ar-keys-repeat",
        "AR keys may repeat within a document",
        "src/mecheval/tasks/ar.py",
        "keys = distinct_rows(gen, n, p, cfg.n_keys)",
        "keys = torch.randint(cfg.n_keys, (n, p), generator=gen)",
        ("tests/test_ar.py",),
    ),
    Mutant(
        "atr-yields-of-two",
        "ATR accepts yields of 2 symbols (the paper's code rejects them)",
        "src/mecheval/tasks/atr.py",
        "MIN_YIELD = 3",
        "MIN_YIELD = 2",
        ("tests/test_pcfg_atr.py",),
    ),
    Mutant(
        "hyena-skip-on",
        "Hyena's long-conv skip is trained by default (the paper's runs zero it)",
        "src/mecheval/models/mixers/hyena.py",
        "    long_conv_skip: bool = Field(\n        False,",
        "    long_conv_skip: bool = Field(\n        True,",
        ("tests/test_fidelity.py", "tests/test_mixers_conv.py"),
    ),
    Mutant(
        "mamba-zoology-init",
        "Mamba initialised like the zoology blocks, not as mamba_ssm",
        "src/mecheval/models/registry.py",
        '(Gu & Dao, 2023); no MLP, RMSNorm",\n        mlp=False,\n        norm="rms",\n'
        '        init="mamba",',
        '(Gu & Dao, 2023); no MLP, RMSNorm",\n        mlp=False,\n        norm="rms",\n'
        '        init="zoology",',
        ("tests/test_fidelity.py",),
    ),
    Mutant(
        "h3-head-dim-1",
        "H3 with zoology's default head_dim 1 instead of the paper's 2",
        "src/mecheval/models/mixers/h3.py",
        "    head_dim: int = Field(\n        2,",
        "    head_dim: int = Field(\n        1,",
        ("tests/test_fidelity.py",),
    ),
    Mutant(
        "positions-for-all",
        "every architecture gets position embeddings by default (the paper's runs: attention)",
        "src/mecheval/models/registry.py",
        # the decorator's default, which every built-in registration passes on (the
        # Architecture field's own default is never read by them)
        "    position_embedding: bool = False,\n",
        "    position_embedding: bool = True,\n",
        ("tests/test_fidelity.py",),
    ),
    Mutant(
        "run-folder-not-locked",
        "a second process may train a run folder another process is training",
        "src/mecheval/training/folder.py",
        "                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n",
        "                pass\n",
        ("tests/test_kill.py::test_a_run_folder_being_trained_is_refused_to_a_second_process",),
    ),
    Mutant(
        "finite-explosion-is-done",
        "a training loss far past a uniform guess's, but finite, does not fail the run",
        "src/mecheval/training/trainer.py",
        "    if value > ceiling:\n",
        "    if False:\n",
        ("tests/test_reliability.py",),
    ),
    Mutant(
        "deltanet-beta-one",
        "DeltaNet's write strength beta is always 1",
        "src/mecheval/models/mixers/deltanet.py",
        "beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)",
        "beta = torch.ones_like(self.b_proj(x)).transpose(1, 2)",
        ("tests/test_references.py", "tests/test_mixers_ssm.py"),
    ),
    Mutant(
        "scan-exp-swallows-nan",
        "the C scan's exp turns NaN into a finite decay",
        "src/mecheval/models/csrc/selective_scan.c",
        "    return x == x ? out : x;",
        "    return out;",
        ("tests/test_native.py",),
    ),
    Mutant(
        "long-conv-ignores-lag",
        "the C causal convolution reads the current position for every tap",
        "src/mecheval/models/csrc/long_conv.c",
        "const real *kj = kt + j * C, *us = ub + (t - j) * C;",
        "const real *kj = kt + j * C, *us = ub + t * C;",
        ("tests/test_mixers_conv.py",),
    ),
    Mutant(
        "vandermonde-power-sign",
        "the C Vandermonde kernel advances the powers by the conjugate",
        "src/mecheval/models/csrc/vandermonde.c",
        "    p_im[n] = p_re[n] * z_im[n] + p_im[n] * z_re[n];",
        "    p_im[n] = -p_re[n] * z_im[n] + p_im[n] * z_re[n];",
        ("tests/test_mixers_conv.py",),
    ),
    Mutant(
        "gla-gate-gradient",
        "the C GLA backward drops the gate's own factor from its gradient",
        "src/mecheval/models/csrc/gla.c",
        "                dg[at_k + i] = a * sum_g;",
        "                dg[at_k + i] = sum_g;",
        ("tests/test_mixers_new_b.py",),
    ),
    Mutant(
        "kernel-cache-ignores-headers",
        "the C kernels' build cache is keyed by the source file alone",
        "src/mecheval/models/native.py",
        "    for part in (source.read_bytes(), *headers, ",
        "    for part in (source.read_bytes(), ",
        ("tests/test_native.py",),
    ),
    Mutant(
        "engine-runs-unreachable-rows",
        "the engine runs rows whose patch cannot reach the query",
        "src/mecheval/interventions/engine.py",
        "    todo = (todo & reaches).nonzero()[:, 0]",
        "    todo = todo.nonzero()[:, 0]",
        ("tests/test_interventions.py",),
    ),
    Mutant(
        "attribution-drops-the-gradient",
        "attribution patching adds the activation difference without its gradient",
        "src/mecheval/interventions/attribution.py",
        "cells[(site, role)] = base + _dot(diff, g)",
        "cells[(site, role)] = base + diff.double().flatten(1).sum(1)",
        ("tests/test_attribution.py",),
    ),
    Mutant(
        "attribution-wrong-sign",
        "attribution patching takes the difference from the original to the corrupted run",
        "src/mecheval/interventions/attribution.py",
        "diff = source[site][docs, src] - corrupted_run.acts[site][docs, dst]",
        "diff = corrupted_run.acts[site][docs, dst] - source[site][docs, src]",
        ("tests/test_attribution.py",),
    ),
    Mutant(
        "attribution-state-before-the-position",
        "the state site's gradient is taken at the state carried into the position, not after it",
        "src/mecheval/interventions/attribution.py",
        "x = block.forward_from(window, start - lo, state, replace=True)",
        "x = block.forward_from(window, start - lo, state, replace=False)",
        ("tests/test_attribution.py",),
    ),
    Mutant(
        "attribution-log-not-mapped-back",
        "attribution-log reports its log-likelihood estimate as the likelihood",
        "src/mecheval/interventions/attribution.py",
        "return log_answer_probability, likelihood_of_log",
        "return log_answer_probability, lambda estimate: estimate",
        ("tests/test_attribution.py",),
    ),
    Mutant(
        "attribution-qk-pattern-counted-twice",
        "attribution-qk keeps the site's gradient through the pattern it also takes exactly",
        "src/mecheval/interventions/attribution.py",
        "grads[site] = grads[site] - through",
        "grads[site] = grads[site] + 0 * through",
        ("tests/test_attribution.py",),
    ),
    Mutant(
        "attribution-gd-mlp-kept",
        "GradDrop drops a layer's mixer output but lets the gradient through its MLP",
        "src/mecheval/interventions/attribution.py",
        'patched.append((block.mlp, "forward"))',
        "pass",
        ("tests/test_attribution.py",),
    ),
]


def tracked_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in out.stdout.splitlines() if (ROOT / line).is_file()]


def make_copy(dest: Path, files: list[str]) -> None:
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)


def run_tests(copy: Path, tests: tuple[str, ...]) -> int:
    env = {**os.environ, "PYTHONPATH": str(copy / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    env["MECHEVAL_CACHE"] = str(copy / ".cache")  # mutated C kernels build here, not in ~/.cache
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    return subprocess.run(cmd, cwd=copy, env=env, capture_output=True).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="only mutants whose name contains this")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if args.k in m.name]
    if args.list:
        for m in chosen:
            print(f"{m.name:34} {m.file:44} {m.what}")
        return 0
    if not chosen:
        print(f"no mutant matches -k {args.k!r}", file=sys.stderr)
        return 2
    files = tracked_files()
    for m in chosen:  # every edit must still apply exactly once before anything runs
        count = (ROOT / m.file).read_text().count(m.old)
        if count != 1:
            print(f"{m.name}: its edit matches {count} places in {m.file}", file=sys.stderr)
            return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="mecheval-mutants-") as tmp:
        base = Path(tmp) / "base"
        make_copy(base, files)
        all_tests = tuple(sorted({t for m in chosen for t in m.tests}))
        start = time.perf_counter()
        if run_tests(base, all_tests) != 0:
            print(f"the unmutated tests fail: {' '.join(all_tests)}", file=sys.stderr)
            return 2
        print(f"unmutated: {len(all_tests)} test files pass ({time.perf_counter() - start:.0f} s)")
        for m in chosen:
            copy = Path(tmp) / m.name
            shutil.copytree(base, copy)
            path = copy / m.file
            path.write_text(path.read_text().replace(m.old, m.new))
            start = time.perf_counter()
            code = run_tests(copy, m.tests)
            verdict = {0: "SURVIVED", 1: "killed"}.get(code, f"error (pytest exit {code})")
            results.append((m, verdict, time.perf_counter() - start))
            print(f"  {m.name}: {verdict} ({results[-1][2]:.0f} s)", flush=True)
            shutil.rmtree(copy)
    print()
    print("| mutant | what it breaks | tests | result |")
    print("|---|---|---|---|")
    for m, verdict, _ in results:
        tests = ", ".join(Path(t).name for t in m.tests)
        print(f"| {m.name} | {m.what} | {tests} | {verdict} |")
    survived = [m.name for m, verdict, _ in results if verdict != "killed"]
    print(f"\n{len(results) - len(survived)} of {len(results)} mutants killed")
    if survived:
        print(f"not killed: {', '.join(survived)}")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
