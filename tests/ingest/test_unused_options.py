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
    (again,) = ingest_paths(con, [log], tz="America/New_York")
    assert again.status == "unchanged"
    read_in = con.execute("select json_extract_string(meta, '$.timestamps_time_zone') from runs").fetchone()[0]
    want = f"--tz America/New_York not applied: this content was ingested before, its stamps read in {read_in}"
    assert any(n.startswith(want) for n in again.notes), again.notes
    (replaced,) = ingest_paths(con, [log], tz="America/New_York", replace=True)  # the way out it names
    assert replaced.status == "replaced" and not replaced.notes
    (same,) = ingest_paths(con, [log], tz="America/New_York")  # the zone it was read in: nothing to say
    assert same.status == "unchanged" and not same.notes
    (tiny,) = ingest_paths(con, [FIX / "canonical" / "tiny.jsonl"])
    (tiny,) = ingest_paths(con, [FIX / "canonical" / "tiny.jsonl"], tz="UTC")  # no wall-clock stamps at all
    assert tiny.status == "unchanged" and not tiny.notes

    (named,) = ingest_paths(con, [FIX / "canonical" / "tiny.jsonl"], run_id="X")
    assert named.run_ids == ["tiny"]
    assert any(n.startswith("--run-id X not used: the file's records name their own run (tiny)") for n in named.notes)
    (engine,) = ingest_paths(con, [FIX / "vllm" / "bench.json"], run_id="X")
    assert engine.run_ids == ["X"] and not any("--run-id" in n for n in engine.notes)


def test_the_same_content_loaded_again_as_another_run_is_said(tmp_path):
    """A copy of a file under another name, or the file under another --run-id, is a second run
    of the same records: loaded (a run name is the user's to give), and said on its line."""
    folder = tmp_path / "logs\nforged"  # a path is shown on one line
    folder.mkdir()
    a = folder / "a.jsonl"
    a.write_text("".join(line for line in (FIX / "canonical" / "tiny.jsonl").open() if '"kind":"run"' not in line))
    b = tmp_path / "b.jsonl"
    b.write_bytes(a.read_bytes())
    con = store.connect(tmp_path / "t.duckdb")
    (first,) = ingest_paths(con, [a])
    assert first.run_ids == ["a"] and not first.notes
    (copy,) = ingest_paths(con, [b])
    assert copy.status == "ingested" and copy.run_ids == ["b"]
    assert copy.notes == [
        f"the same content was ingested before from {str(a)!r} as run a: its records are now stored twice, "
        "also as run b (a fleet of this store counts them twice)"
    ]
    (other,) = ingest_paths(con, [a], run_id="X")
    assert other.run_ids == ["X"] and len(other.notes) == 1 and "also as run X" in other.notes[0]
    # other content under a name of its own, and the same content again under its name: nothing to say
    c = tmp_path / "c.jsonl"
    c.write_text(a.read_text().replace("0.995", "0.996"))
    (changed,) = ingest_paths(con, [c])
    (again,) = ingest_paths(con, [a])
    assert not changed.notes and again.status == "unchanged" and not again.notes
