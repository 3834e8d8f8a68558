"""docs/interop.md runs: its snippets (pyvene, plain hooks, nnsight) give the engine's number.

The code blocks marked ``<!-- interop: NAME -->`` in docs/interop.md are executed here as
written, only their ``RUN``/``SITE``/``ROLE`` lines pointed at a run trained by the test, so
the page cannot drift from what works. pyvene and nnsight are not dependencies of mecheval:
their tests are skipped, saying how to install them, where they are missing
(``pip install 'mecheval[interop]'`` brings both).
"""

from __future__ import annotations

import linecache
import re
from pathlib import Path

import pytest

from mecheval.experiments.mechanisms import InterventionPlan, intervene_run
from mecheval.training.config import config_from_data
from mecheval.training.presets import preset
from mecheval.training.run import train

DOC = Path(__file__).resolve().parents[1] / "docs" / "interop.md"
_BLOCK = re.compile(r"<!-- interop: (\w+) -->\n```python\n(.*?)```", re.DOTALL)
#: (site, role) cells compared: the page's own (the last block's input at the query), a block
#: boundary and a site inside a block (the mixer's output: ``.output`` for pyvene, ``E_output``
#: for nnsight, a hook rather than a direct patch for the engine).
CELLS = [("layers.1.input", "query"), ("layers.0.input", "key"), ("layers.0.mixer.output", "key")]
ARCHS = ["attention", "mamba"]
TOLERANCE = 1e-6


def snippets() -> dict[str, str]:
    return {name: code for name, code in _BLOCK.findall(DOC.read_text())}


def run_doc(names: list[str], run: Path, site: str, role: str) -> dict:
    """Execute the setup block and then ``names`` with RUN, SITE and ROLE set; the namespace."""
    blocks = snippets()
    setup = blocks["setup"]
    for variable, value in (("RUN", str(run)), ("SITE", site), ("ROLE", role)):
        line = re.compile(rf"^{variable} = .*$", re.MULTILINE)
        assert len(line.findall(setup)) == 1, f"docs/interop.md setup: no single {variable} line"
        setup = line.sub(lambda _, v=variable, x=value: f"{v} = {x!r}", setup)
    namespace: dict = {"__name__": "interop_doc"}
    for name, code in [("setup", setup), *((name, blocks[name]) for name in names)]:
        # nnsight reads the source of a ``with trace`` block back through linecache.
        filename = f"<docs/interop.md: {name}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        exec(compile(code, filename, "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The page's tiny preset, attention and Mamba, trained for a few steps."""
    out = tmp_path_factory.mktemp("interop")
    trained = {}
    for arch in ARCHS:
        data = preset("tiny", "ar", arch)
        cfg = config_from_data(data, ["training.steps=12", "training.eval_every=12", "name=r"])
        assert train(cfg, out / arch)["state"] == "done"
        trained[arch] = out / arch
    return trained


def engine_cell(runs, arch: str, site: str, role: str) -> tuple[float, float]:
    """(restored, corrupted) likelihood from mecheval's engine, through the page's engine block."""
    ns = run_doc(["engine"], runs[arch], site, role)
    return ns["engine"], ns["result"].value("corrupted")


def check(library: str, runs, arch: str, site: str, role: str) -> None:
    engine, corrupted = engine_cell(runs, arch, site, role)
    # The restore must move the answer by far more than the tolerance, or a patch that did
    # nothing would pass.
    assert abs(engine - corrupted) > 10 * TOLERANCE, (engine, corrupted)
    restored = run_doc([library], runs[arch], site, role)["restored"]
    assert abs(restored - engine) <= TOLERANCE, (library, restored, engine)


def test_the_page_has_every_block() -> None:
    assert set(snippets()) == {"setup", "pyvene", "hooks", "nnsight", "engine"}


@pytest.mark.parametrize("arch", ARCHS)
def test_the_page_measures_what_mecheval_intervene_measures(runs, arch) -> None:
    """The page's documents and scoring are `mecheval intervene`'s defaults (test split, every
    document, all of them), so its engine block gives the number the CLI prints."""
    site, role = CELLS[0]
    engine, _ = engine_cell(runs, arch, site, role)
    measured = intervene_run(runs[arch], InterventionPlan(sites=(site,), roles=(role,)))
    assert measured is not None
    assert measured.result.value("restored", site=site, role=role) == engine


@pytest.mark.parametrize(("site", "role"), CELLS)
@pytest.mark.parametrize("arch", ARCHS)
def test_plain_hooks_reproduce_the_engine(runs, arch, site, role) -> None:
    check("hooks", runs, arch, site, role)


@pytest.mark.parametrize(("site", "role"), CELLS)
@pytest.mark.parametrize("arch", ARCHS)
def test_pyvene_reproduces_the_engine(runs, arch, site, role) -> None:
    pytest.importorskip(
        "pyvene", reason="pyvene is a test-only extra: pip install 'mecheval[interop]'"
    )
    check("pyvene", runs, arch, site, role)


@pytest.mark.parametrize(("site", "role"), CELLS)
@pytest.mark.parametrize("arch", ARCHS)
def test_nnsight_reproduces_the_engine(runs, arch, site, role) -> None:
    pytest.importorskip(
        "nnsight", reason="nnsight is a test-only extra: pip install 'mecheval[interop]'"
    )
    check("nnsight", runs, arch, site, role)
