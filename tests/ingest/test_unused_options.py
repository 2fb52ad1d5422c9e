"""Options that did nothing for a file say so on its line (a user took them for done)."""

from __future__ import annotations

from pathlib import Path

from pipeline import store
from pipeline.ingest import ingest_paths

FIX = Path(__file__).resolve().parents[2] / "fixtures"


def test_tz_on_an_unchanged_file_and_run_id_on_records_naming_their_run(tmp_path):
    con = store.connect(tmp_path / "t.duckdb")
    log = FIX / "vllm" / "server.log"
    (first,) = ingest_paths(con, [log])
    assert not any("--tz" in n for n in first.notes)
    (again,) = ingest_paths(con, [log], tz="UTC")
    assert again.status == "unchanged"
    assert any(n.startswith("--tz not applied: this content was ingested before") for n in again.notes), again.notes
    (replaced,) = ingest_paths(con, [log], tz="UTC", replace=True)  # the way out it names
    assert replaced.status == "replaced" and not replaced.notes

    (named,) = ingest_paths(con, [FIX / "canonical" / "tiny.jsonl"], run_id="X")
    assert named.run_ids == ["tiny"]
    assert any(n.startswith("--run-id X not used: the file's records name their own run (tiny)") for n in named.notes)
    (engine,) = ingest_paths(con, [FIX / "vllm" / "bench.json"], run_id="X")
    assert engine.run_ids == ["X"] and not any("--run-id" in n for n in engine.notes)
