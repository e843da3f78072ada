"""benchmarks/mutation_probe.py stays current: every planted bug's text is in the file it plants it in
(a missing text is reported as a hole only when the whole probe runs, which no CI run does)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import mutation_probe  # noqa: E402


def test_every_planted_bug_finds_its_line():
    missing = [what for path, old, _, what in mutation_probe.MUTANTS if old not in (ROOT / path).read_text()]
    assert not missing, f"probe out of date: {missing}"
