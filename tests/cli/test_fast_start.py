"""Help and light commands start without the heavy libraries (issue 11: fast start).

Each check runs in a fresh interpreter, since this test process has imported
everything already.  Wall time is not asserted (the machines running tests are
shared and noisy); which modules get imported is what decides it: Polars, SciPy,
Altair, NumPy and PyArrow cost 0.1-0.3 s each to import.
"""

from __future__ import annotations

import json
import subprocess
import sys

from pipeline.cli import COMMANDS

HEAVY = ("polars", "altair", "scipy", "numpy", "pyarrow", "duckdb")

# Runs the CLI in-process in a child, then reports which heavy modules it imported.
PROBE = """
import contextlib, io, json, sys
from pipeline.cli import main
args = json.loads(sys.argv[1])
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        main(args)
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
print(json.dumps({"code": code, "out": out.getvalue(),
                  "heavy": sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)}))
"""


def probe(args: list[str], cwd=None) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args), json.dumps(HEAVY)], capture_output=True, text=True, cwd=cwd
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_help_imports_no_heavy_library():
    res = probe(["--help"])
    assert res["code"] == 0 and "Usage: tracelat" in res["out"]
    assert res["heavy"] == []


def test_every_command_help_imports_no_heavy_library():
    # one interpreter per command: a module imported by one would hide another's
    for name in COMMANDS:
        res = probe([name, "--help"])
        assert res["code"] == 0 and f"Usage: tracelat {name}" in res["out"], name
        assert res["heavy"] == [], name


def test_runs_imports_duckdb_only(tmp_path):
    from pipeline import ingest, store

    db = tmp_path / "small.duckdb"
    f = tmp_path / "tiny.jsonl"
    f.write_text('{"kind":"run","run_id":"tiny"}\n{"kind":"iteration","iter":0,"t_start":1.0,"t_end":1.01}\n')
    con = store.connect(db)
    ingest.ingest_paths(con, [f])
    store.build_derived(con)
    con.close()
    res = probe(["runs", "--db", str(db)])
    assert res["code"] == 0 and "tiny" in res["out"]
    assert res["heavy"] == ["duckdb"]


def test_canonical_ingest_imports_duckdb_only(tmp_path):
    # DuckDB reads, checks and stores a canonical trace: NumPy (clock alignment of split
    # evidence) and PyArrow (line-by-line reading, converters, duplicates) stay unloaded
    db = tmp_path / "s.duckdb"
    f = tmp_path / "tiny.jsonl"
    f.write_text(
        '{"kind":"run","run_id":"tiny"}\n'
        '{"kind":"iteration","iter":0,"t_start":1.0,"t_end":1.01}\n'
        '{"kind":"request","req_id":"a","t_arrival":1.0,"t_first_token":1.01,"t_finish":1.02,"token_times":[1.01,1.02]}\n'
    )
    res = probe(["ingest", str(f), "--db", str(db)])
    assert res["code"] == 0 and "3 read, 3 accepted, 0 rejected" in res["out"], res
    assert res["heavy"] == ["duckdb"]
