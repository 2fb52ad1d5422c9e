"""docs/replay.md shows replay output on the bundled incident "generated with the code of
this commit": its figures must stay what the commands print (they drifted once, unseen)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.cli import run_captured

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "replay.md").read_text()
NUM = r"-?\d+(?:\.\d+)?(?:e[+-]\d+)?"
# "ttft_ms p90      74.78      71.77    -4.0% ..." and "     512      24.73       4202 ..."
VALIDATION_ROW = re.compile(rf"^((?:\w+_ms p\d+)|output_tokens_per_s|requests_per_s)\s+({NUM})\s+({NUM})\s", re.M)
SWEEP_ROW = re.compile(rf"^\s+(\S+(?: \(as recorded\))?)((?:\s+{NUM}){{7}})\s*$", re.M)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("docs") / "d.duckdb"
    code, out = run_captured("ingest", REPO / "fixtures" / "demo" / "incident.jsonl.gz", "--db", path)
    assert code == 0, out
    return path


def _close(doc: dict, got: dict) -> None:
    assert doc.keys() == got.keys()
    for key, values in doc.items():
        # printed to 4 significant digits: equal within rounding
        assert got[key] == pytest.approx(values, rel=1.5e-3), key


def _block(after: str) -> str:
    i = DOC.index(after)
    return DOC[i : DOC.index("```", i)]


@pytest.mark.long
def test_validation_figures_are_what_replay_prints(db):
    code, out = run_captured("replay", "demo-incident", "--db", db)
    assert code == 0, out
    block = _block("validation replay of demo-incident (recorded policy")
    rows = {m[1]: [float(m[2]), float(m[3])] for m in VALIDATION_ROW.finditer(block)}
    assert len(rows) == 14
    _close(rows, {m[1]: [float(m[2]), float(m[3])] for m in VALIDATION_ROW.finditer(out)})
    model = re.search(r"^model: .*$", block, re.M)[0]
    assert model in out


@pytest.mark.parametrize(
    "header, sweep",
    [
        ("  max_num_batched_tokens   ttft p50", "max_num_batched_tokens=256,512,1024,2048"),
        ("                kv_dtype   ttft p50", "kv_dtype=bf16,fp8"),
        ("         compute_speedup   ttft p50", "compute_speedup=1,2"),
    ],
)
def test_sweep_tables_are_what_replay_prints(db, tmp_path, monkeypatch, header, sweep):
    monkeypatch.chdir(tmp_path)  # the sweep's chart goes to reports/ here
    code, out = run_captured("replay", "demo-incident", "--db", db, "--sweep", sweep)
    assert code == 0, out
    block = DOC[DOC.index(header) :].split("\n\n", 1)[0]
    doc = {m[1]: [float(v) for v in m[2].split()] for m in SWEEP_ROW.finditer(block)}
    assert len(doc) >= 2
    got = {m[1]: [float(v) for v in m[2].split()] for m in SWEEP_ROW.finditer(out)}
    _close(doc, {k: got[k] for k in doc})
