"""`make test` runs every test but the end-to-end ones marked ``slow``, `make test-slow`
those, and CI both, so that every test still runs before anything lands."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import SLOW_FIXTURES, pytest_collection_modifyitems

ROOT = Path(__file__).resolve().parents[1]


def _recipe(target: str) -> list[str]:
    """The commands of a Makefile target, its variables expanded."""
    text = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+) [:?]?= (.*)$", text, re.MULTILINE))
    body = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert body, f"Makefile: no target {target}"
    lines = [line.strip() for line in body.group(1).splitlines()]
    for _ in range(3):  # variables that name variables
        lines = [re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), ""), x) for x in lines]
    return lines


def test_make_test_and_make_test_slow_split_one_pytest_command_by_the_slow_marker() -> None:
    fast, slow = _recipe("test"), _recipe("test-slow")
    assert len(fast) == len(slow) == 1
    fast_args, slow_args = shlex.split(fast[0]), shlex.split(slow[0])
    assert fast_args[-2:] == ["-m", "not slow"] and slow_args[-2:] == ["-m", "slow"]
    assert fast_args[:-2] == slow_args[:-2] and "pytest" in fast_args


def test_ci_runs_both_tiers() -> None:
    lines = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    assert lines.index("make test") < lines.index("make test-slow")


def _item(*fixtures: str) -> SimpleNamespace:
    item = SimpleNamespace(fixturenames=list(fixtures), path=Path("test_x.py"), markers=[])
    item.add_marker = item.markers.append
    return item


def test_a_test_that_needs_every_experiment_or_ray_is_marked_slow() -> None:
    assert {"tiny_experiments", "local_ray"} <= SLOW_FIXTURES
    plain, catalog, ray = _item("tmp_path"), _item("tiny_experiments"), _item("local_ray")
    pytest_collection_modifyitems(None, [plain, catalog, ray])
    assert plain.markers == []
    assert [m.name for m in catalog.markers] == [m.name for m in ray.markers] == ["slow"]
    assert catalog.markers[0] == pytest.mark.slow
