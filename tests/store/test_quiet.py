"""Our connections never draw DuckDB's own progress bar (it appears on the terminal for any
query over 2 s, e.g. staging a big trace, and would cut into tracelat's output)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys, duckdb
from pipeline import store
q = "select current_setting('enable_progress_bar')"
db = sys.argv[1]
con = store.connect(db)
ours = [con.execute(q).fetchall()[0][0]]
con.close()
ro = store.connect(db, read_only=True)
ours.append(ro.execute(q).fetchall()[0][0])
ours.append(store.scratch().execute(q).fetchall()[0][0])
print(duckdb.connect().execute(q).fetchall()[0][0], *ours)
"""


def test_every_connection_kind_has_the_bar_off(tmp_path):
    # a plain process (pytest's capture turns DuckDB's default off by itself)
    out = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path / "s.duckdb")], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["True", "False", "False", "False"]  # DuckDB's default on; ours off
