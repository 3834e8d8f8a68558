"""Every command that README.md and docs/*.md show runs as shown.

Each shell block of the pages is run as a script, its commands in order, in its own copy of
a scratch folder that holds what the pages assume: ``configs/`` (the repository's), the
custom architecture page's plugin file, a sweep file of that plugin, a finished run, a
finished sweep, and every registered experiment finished at the tiny preset. Each command
must exit 0 without a traceback; a plain ``mecheval ...`` runs in a process forked from one
that has imported mecheval (tests/cli_processes.py), anything else through bash. What
changes in a command before it runs is in :data:`SUBSTITUTIONS` (placeholders, and presets
that would train for minutes, at the ``tiny`` preset: the same pipeline in seconds); the
commands that cannot run here are in :data:`NOT_RUN`, each with its reason; a ``reproduce``
the session's tiny catalog already ran is held to what it gave there
(:func:`ran_by_the_catalog`); a command two blocks show runs in the first
(:func:`run_by_an_earlier_block`), one another test runs with checks of its own there
(:data:`RUN_BY_ANOTHER_TEST`). A command added to a page is run by default.

The pages' Python blocks are run too: those another test runs with its own checks are
claimed by :func:`_tested_elsewhere` (the claim checked against that test's own reading of
the page); any other is executed as written in a copy of the scratch folder.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_processes import preloaded, run_command

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELLS = ("bash", "sh", "shell", "console")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)

#: Commands not run, exactly as a page shows them (comments stripped), with the reason.
NOT_RUN = {
    "make quick": "the main job itself (minutes): its pipeline is `reproduce ar`, run below",
    "make test": "the test suite that runs this test",
    "mecheval sweep my-sweep.yaml --backend ray --address auto": (
        "joins a running Ray cluster (--address auto); the tests run a local one"
    ),
    "mecheval sweep configs/sweep-example.yaml --backend ray --address auto": (
        "joins a running Ray cluster (--address auto); the tests run a local one"
    ),
    "mecheval reproduce ar --preset paper --device cuda --workers 7": "needs a CUDA GPU",
    "pip install -e '.[cuda]'": "needs a CUDA GPU and its toolkit",
    (
        "pytest -q tests/test_training_precision.py tests/test_training_group.py "
        "tests/test_kernels.py -k cuda"
    ): "needs a CUDA GPU (these tests skip without one)",
    "python benchmarks/bench_models.py --device cuda --bf16 --fused --length 35": (
        "needs a CUDA GPU"
    ),
    (
        "python benchmarks/bench_training.py --paper --device cuda --widths 64 --group 7 "
        "--modes single trainer group eager --steps 40 --warmup 5 --flops --lrs 7"
    ): "needs a CUDA GPU",
    "python benchmarks/bench_streams.py --widths 64 --group 7 --steps 40": "needs a CUDA GPU",
    "python benchmarks/bench_paper_scale.py --device cuda": "needs a CUDA GPU",
}

#: (pattern, replacement, why), applied in this order to every command that runs.
SUBSTITUTIONS = [
    (r"runs/<name>", "runs/done-mamba", "a finished 2-layer Mamba run (it has state sites)"),
    (r"runs/<sweep>", "runs/ar-example", "the example sweep's folder, finished"),
    (r"\bmy_mixer\.py\b", "gated_linear_attention.py", "the custom architecture page's plugin"),
    (r"\bmy_mixer\b", "my-gla", "... and the architecture it registers"),
    (r"--preset (quick|paper)\b", "--preset tiny", "the same pipeline at the tiny preset"),
    (
        r"--preset tiny --widths \S+ --lrs \S+",
        "--preset tiny --widths 16 --lrs 3e-3",
        "a slice of the grid: at the tiny preset, its one width and LR",
    ),
    (
        r"^(mecheval (?:--plugin \S+ )?reproduce (?!--list)(?:(?!--preset).)*)$",
        r"\1 --preset tiny",
        "a reproduce at its default preset (quick): at the tiny preset",
    ),
    (
        r"(runs/\S+/[\w-]+)-(?:quick|paper)\b",
        r"\1-tiny",
        "... and the folder such a reproduce writes",
    ),
    (
        r"^(mecheval reproduce (?:(?!--archs).)*--compile(?:(?!--archs).)*)$",
        r"\1 --archs attention",
        "torch.compile's first compile of seven architectures: 3 min 22 s on the 2-core CPU",
    ),
    (
        r"^(mecheval reproduce (?:(?!--archs).)*--seeds (?:(?!--archs).)*)$",
        r"\1 --archs attention,mamba",
        "each seed trains every architecture again: two show each seed's label and the"
        " agreement (tests/test_reproduce_subset.py holds more)",
    ),
    (
        r"^(mecheval train configs/\S+\.yaml.*)$",
        r"\1 --set task.n_train=64 --set task.n_dev=16 --set task.n_test=16"
        r" --set training.steps=4 --set training.eval_every=4",
        "a paper-scale config: its task and training shrunk to seconds",
    ),
]


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    before: str  # the line above the fence (a marker such as <!-- interop: NAME -->)
    language: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(languages: tuple[str, ...]) -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            if match.group(1) in languages:
                line = text.count("\n", 0, match.start()) + 1
                before = text[: match.start()].rstrip("\n").rpartition("\n")[2]
                name = page.relative_to(ROOT).as_posix()
                found.append(Block(name, line, before, *match.groups()))
    return found


def commands(code: str) -> list[str]:
    """The block's commands: comments dropped, continuation lines joined, blank lines out."""
    joined = re.sub(r"\\\n\s*", " ", code)
    lines = (re.sub(r"(^|\s)#.*$", "", line).strip() for line in joined.splitlines())
    return [" ".join(line.split()) for line in lines if line]


def substituted(command: str) -> str:
    for pattern, replacement, _ in SUBSTITUTIONS:
        command = re.sub(pattern, replacement, command)
    return command


def shell_blocks() -> list[Block]:
    return blocks(SHELLS)


def test_the_pages_have_commands_and_every_not_run_entry_is_on_a_page() -> None:
    shown = {c for block in shell_blocks() for c in commands(block.code)}
    assert len(shown) > 20
    assert not set(NOT_RUN) - shown, "NOT_RUN names commands no page shows"


def test_the_substitutions_turn_placeholders_and_long_presets_into_runnable_commands() -> None:
    assert substituted("mecheval intervene runs/<name> --sites x") == (
        "mecheval intervene runs/done-mamba --sites x"
    )
    assert substituted("mecheval reproduce mamba-conv") == (
        "mecheval reproduce mamba-conv --preset tiny"
    )
    assert substituted("mecheval reproduce ar --preset paper --widths 64") == (
        "mecheval reproduce ar --preset tiny --widths 64"
    )
    assert substituted("mecheval reproduce --list") == "mecheval reproduce --list"
    assert substituted("mecheval report runs/here/ar-quick runs/b/ar-paper --html") == (
        "mecheval report runs/here/ar-tiny runs/b/ar-tiny --html"
    )
    assert substituted("mecheval reproduce ar --preset paper --compile") == (
        "mecheval reproduce ar --preset tiny --compile --archs attention"
    )
    assert substituted("mecheval reproduce ar --preset paper --widths 64 --lrs 1e-3,3e-4") == (
        "mecheval reproduce ar --preset tiny --widths 16 --lrs 3e-3"
    )
    assert substituted("mecheval reproduce ar --seeds 0,1,2") == (
        "mecheval reproduce ar --seeds 0,1,2 --preset tiny --archs attention,mamba"
    )
    assert substituted("mecheval reproduce ar --archs attention --seeds 1 --out o") == (
        "mecheval reproduce ar --archs attention --seeds 1 --out o --preset tiny"
    )
    assert substituted("mecheval --plugin my_mixer.py check-mixer my_mixer") == (
        "mecheval --plugin gated_linear_attention.py check-mixer my-gla"
    )
    for block in shell_blocks():
        for command in commands(block.code):
            if command not in NOT_RUN:
                assert "<" not in substituted(command), (block.id, command)


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """As ``bash -c command`` in ``cwd``; a plain ``mecheval ...`` in a process forked from
    one that has imported mecheval (tests/cli_processes.py)."""
    return run_command(command, cwd)


@pytest.mark.slow
def test_a_forked_command_gives_what_the_mecheval_program_gives(tmp_path) -> None:
    """tests/cli_processes.py: a plain ``mecheval ...`` in a forked process has the exit
    status and output of the program itself; anything else runs through bash."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for command in ("mecheval reproduce --list", "mecheval train --preset tiny --arch nope"):
        forked = run_command(command, tmp_path)
        program = subprocess.run(
            command.split(), cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert (forked.returncode, forked.stdout, forked.stderr) == (
            program.returncode,
            program.stdout,
            program.stderr,
        )
    assert run_command("mecheval train --preset tiny --arch nope", tmp_path).returncode == 2
    piped = run_command("mecheval reproduce --list | head -n 1 > first.txt", tmp_path)
    assert piped.returncode == 0 and (tmp_path / "first.txt").read_text().startswith("ar ")


@pytest.mark.slow
def test_a_forked_command_starts_with_mecheval_imported(tmp_path, monkeypatch) -> None:
    """The command server's preload took, whatever folder the tests run from: a forked
    command starts with torch and mecheval's CLI imported instead of importing them again."""
    monkeypatch.chdir(tmp_path)
    names = ["torch", "mecheval.cli", "mecheval.experiments.reproduce"]
    assert preloaded(names) == names


def _ok(result: subprocess.CompletedProcess, command: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in output, (
        f"{command}\nexit {result.returncode}\n{output[-3000:]}"
    )


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_experiments) -> Path:
    """What the pages assume: configs/, the plugin and a sweep of it, a run, a sweep; and
    every registered experiment finished at the tiny preset (tests/conftest.py), so that a
    page's ``reproduce`` reports instead of training again: tests/test_reproduce_all.py
    holds each experiment's training from scratch. Built once per session: under
    pytest-xdist the first worker to ask builds it, the others wait and share it."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by the session's workers
    folder = base / "docs-workspace"
    runs = tiny_experiments.runs()  # outside the lock: every worker helps build them
    with FileLock(str(base / "docs-workspace.lock")):
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            _build_workspace(folder, runs)
            (folder / ".built").touch()
    return folder


def _build_workspace(folder: Path, runs: Path) -> None:
    from test_custom_architecture import doc_example

    shutil.copytree(runs, folder / "runs")
    shutil.copytree(ROOT / "configs", folder / "configs")
    (folder / "gated_linear_attention.py").write_text(doc_example())
    # The custom architecture page's my-sweep.yaml ("model.architecture: my-gla").
    (folder / "my-sweep.yaml").write_text(
        "name: my-gla-example\nbase: {preset: tiny, task: ar}\n"
        "grid: {model.architecture: [my-gla], training.seed: [0, 1]}\n"
    )
    for command in (
        "mecheval train --preset tiny --arch mamba --out runs --name done-mamba -q",
        "mecheval sweep configs/sweep-example.yaml -q",
    ):
        _ok(_run(command, folder), command)


def _own_copy(workspace: Path, tmp_path: Path) -> Path:
    here = tmp_path / "workspace"
    shutil.copytree(workspace, here, symlinks=True)
    return here


#: A page's ``reproduce NAME`` at the tiny preset (with or without ``--workers N``, which
#: changes how runs are shared out, not what they give: tests/test_experiments.py): the
#: session's tiny catalog ran it (tests/conftest.py, ``reproduce NAME --preset tiny -q``)
#: into the folder the workspace copies, so running it again would only report again.
_CATALOG_COMMAND = re.compile(
    r"mecheval reproduce ([\w-]+)(?: --workers \d+)? --preset tiny(?: --workers \d+)?"
)


def ran_by_the_catalog(command: str) -> str | None:
    """The experiment the tiny catalog ran as ``command`` (substituted), or None."""
    match = _CATALOG_COMMAND.fullmatch(command)
    return match.group(1) if match else None


def test_a_catalog_command_is_one_the_catalog_runs() -> None:
    from mecheval.experiments import known
    from mecheval.experiments.catalog import list_experiments

    names = {experiment.name for experiment in list_experiments()} | {known.NAME}
    claimed = {
        ran_by_the_catalog(substituted(c))
        for block in shell_blocks()
        for c in commands(block.code)
        if c not in NOT_RUN
    } - {None}
    assert claimed and claimed <= names
    assert ran_by_the_catalog("mecheval reproduce hybrids --workers 2 --preset tiny") == "hybrids"
    assert ran_by_the_catalog("mecheval reproduce mqar --preset tiny --workers 2") == "mqar"
    for other in (
        "mecheval reproduce ar --preset tiny --archs attention",
        "mecheval reproduce ar --seeds 0,1,2 --preset tiny",
        "mecheval --plugin p.py reproduce ar --preset tiny",
        "mecheval reproduce ar --preset quick",
    ):
        assert ran_by_the_catalog(other) is None, other


def _run_by_another_test() -> dict[str, str]:
    """Commands (substituted) that another test runs exactly as written, with checks of its
    own: torch.compile's cold compile is the longest command of the pages, and the eager run
    it must equal is the tiny catalog's."""
    from test_training_precision import PAGE_COMPILE_COMMAND

    return {
        PAGE_COMPILE_COMMAND: (
            "tests/test_training_precision.py::test_the_pages_compiled_reproduce_equals_the_eager_one"
        )
    }


RUN_BY_ANOTHER_TEST = _run_by_another_test()


def test_a_command_another_test_runs_is_on_a_page() -> None:
    shown = {substituted(c) for block in shell_blocks() for c in commands(block.code)}
    assert set(RUN_BY_ANOTHER_TEST) <= shown


def run_by_an_earlier_block(shown: list[Block]) -> dict[tuple[str, str], str]:
    """(block id, command) -> the id of the block, earlier in ``shown``, that runs the same
    command (substituted): each distinct command runs once. A block that skips one still
    runs the rest of its commands on a workspace that holds what the pages assume (a page's
    later command that needed the skipped one's output would fail, not pass unseen)."""
    first: dict[str, str] = {}
    earlier = {}
    for block in shown:
        for command in commands(block.code):
            if command in NOT_RUN:
                continue
            command = substituted(command)
            if first.setdefault(command, block.id) != block.id:
                earlier[(block.id, command)] = first[command]
    return earlier


def test_a_command_shown_twice_runs_in_the_first_block_that_shows_it() -> None:
    def block(page: str, code: str) -> Block:
        return Block(page, 1, "", "bash", code)

    shown = [
        block("a", "mecheval models list\nmecheval reproduce --list"),
        block("b", "mecheval reproduce --list  # again\nmecheval models list --layers x"),
        block("c", "mecheval models list\nmecheval reproduce ar --preset quick"),
        block("d", "mecheval reproduce ar --preset tiny\nmake test"),
    ]
    assert run_by_an_earlier_block(shown) == {
        ("b:1", "mecheval reproduce --list"): "a:1",
        ("c:1", "mecheval models list"): "a:1",
        ("d:1", "mecheval reproduce ar --preset tiny"): "c:1",  # the same once substituted
    }
    assert run_by_an_earlier_block(shell_blocks())  # the pages repeat some


@pytest.mark.parametrize("block", shell_blocks(), ids=lambda b: b.id)
def test_every_shell_command_on_the_pages_runs(
    block: Block, workspace: Path, tiny_experiments, tmp_path
) -> None:
    """The block's commands in order, in a copy of the workspace of its own (two pages may
    train runs of one name with different configs, which a run folder refuses); a
    ``reproduce`` the tiny catalog ran is held to what it gave there, and a command an
    earlier block shows is left to that block (:func:`run_by_an_earlier_block`)."""
    here = _own_copy(workspace, tmp_path)
    earlier = run_by_an_earlier_block(shell_blocks())
    for command in commands(block.code):
        if command not in NOT_RUN:
            command = substituted(command)
            name = ran_by_the_catalog(command)
            if name:
                done = tiny_experiments[name]
                assert done.exit_code == 0 and "Traceback" not in done.output, command
            elif (block.id, command) not in earlier and command not in RUN_BY_ANOTHER_TEST:
                _ok(_run(command, here), command)


def _tested_elsewhere(block: Block) -> str | None:
    """The test that runs a Python block with checks of its own (None: no other test)."""
    from test_custom_architecture import doc_example
    from test_interop import snippets

    if block.before.startswith("<!-- interop: "):
        assert block.code in snippets().values(), block.id
        return "tests/test_interop.py: against the engine, with pyvene and nnsight"
    if block.code == doc_example():
        return "tests/test_custom_architecture.py: as a plugin, through every command"
    return None


PYTHON_BLOCKS = blocks(("python", "py"))


def test_the_pages_python_blocks_are_found_and_the_claimed_ones_are_run_elsewhere() -> None:
    claimed = [b for b in PYTHON_BLOCKS if _tested_elsewhere(b)]
    from test_interop import snippets

    assert len(claimed) == len(snippets()) + 1  # every interop block, the plugin


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda b: b.id)
def test_every_python_block_on_the_pages_runs(block: Block, request, tmp_path) -> None:
    """A block no other test runs is run here as written, in a copy of the workspace."""
    if _tested_elsewhere(block):
        return
    here = _own_copy(request.getfixturevalue("workspace"), tmp_path)
    (here / "block.py").write_text(block.code)
    _ok(_run(f"{sys.executable} block.py", here), block.id)
