"""Mutation fuzzing of every ingest format (scripts/fuzz.py): damaged copies of the fixtures
must end as rejects or one clear error, never exit 3 or 130, each case under 10 s, with
``lines_read = accepted + rejected + skipped``, no non-finite value stored and an earlier run
left unchanged.  The default run tries six seeded cases per format; ``-m slow`` 100 (the same
cases every run: a longer run over other seeds is ``python scripts/fuzz.py --cases N --seed S``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("tracelat_fuzz", REPO / "scripts" / "fuzz.py")
fuzz = sys.modules.setdefault("tracelat_fuzz", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(fuzz)


def _check(fmt: str, cases: int, seed: int, tmp_path: Path) -> None:
    results = fuzz.fuzz_format(fmt, cases, tmp_path / fmt, seed=seed)
    assert len(results) == cases
    problems = [f"case {r.case} [{'+'.join(r.mutations)}]: {p}" for r in results for p in r.problems]
    assert not problems, "\n".join(problems)
    assert all(r.exit_code in (0, 2) for r in results)


@pytest.mark.parametrize("fmt", sorted(fuzz.FORMATS))
def test_fuzz_few(fmt, tmp_path):
    _check(fmt, 6, 0, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", sorted(fuzz.FORMATS))
def test_fuzz_many(fmt, tmp_path):
    _check(fmt, 100, 1, tmp_path)


def test_mutators_change_the_input():
    import random

    data = (REPO / "fixtures" / "canonical" / "tiny.jsonl").read_bytes()
    others = [(REPO / "fixtures" / "sglang" / "server.log").read_bytes()]
    changed = {m.__name__ for m in fuzz.MUTATIONS for k in range(5) if m(random.Random(k), data, others) != data}
    assert changed == {m.__name__ for m in fuzz.MUTATIONS}
