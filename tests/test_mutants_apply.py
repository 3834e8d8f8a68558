"""Every named mutant of scripts/mutants.py still applies: its edit's text occurs exactly once
in its file and its tests exist. `make mutants` (minutes, not part of `make test`) stops at
the first edit that no longer applies; this keeps a refactor from breaking it unseen."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mutants() -> list:
    spec = importlib.util.spec_from_file_location("mutants", ROOT / "scripts" / "mutants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mutants", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.MUTANTS


def test_every_mutant_edit_applies_once_and_names_existing_tests() -> None:
    found = mutants()
    assert len(found) >= 25
    assert len({m.name for m in found}) == len(found)
    for mutant in found:
        text = (ROOT / mutant.file).read_text(encoding="utf-8")
        assert text.count(mutant.old) == 1, (mutant.name, mutant.file)
        assert mutant.new != mutant.old, mutant.name
        for test in mutant.tests:
            assert (ROOT / test.partition("::")[0]).is_file(), (mutant.name, test)
