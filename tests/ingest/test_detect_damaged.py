"""Format detection looks past a damaged first line (issue 15 item 11)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline import ingest, store
from pipeline.errors import InputError

from .conftest import load

FIX = Path(__file__).resolve().parents[2] / "fixtures"


@pytest.mark.parametrize(
    "fixture,fmt",
    [
        ("canonical/tiny.jsonl", "jsonl"),
        ("vllm/requests.jsonl", "vllm-requests"),
        ("sglang/sglang-request-metrics-20260301_10.log", "sglang-metrics"),
        ("trtllm/iteration_log.txt", "trtllm-iterlog"),
    ],
)
@pytest.mark.long
def test_damaged_first_line_is_a_reject(con, tmp_path, fixture, fmt):
    lines = (FIX / fixture).read_text().splitlines()
    lines[0] = lines[0][: len(lines[0]) // 3]  # a truncated copy: the first line cut short
    f = tmp_path / Path(fixture).name
    f.write_text("\n".join(lines) + "\n")
    assert ingest.detect(f).name == fmt
    (res,) = load(con, f)
    assert res.format == fmt and res.accepted > 0
    assert con.execute("select list(line_no) from rejects").fetchone()[0] == [1]


def test_one_json_line_in_prose_is_no_trace(tmp_path):
    first = (FIX / "canonical" / "tiny.jsonl").read_text().splitlines()[1]
    f = tmp_path / "README"
    f.write_text("# Notes\n\nThe trace looks like this:\n\n" + first + "\n\nthen more text\nand more\nand more\n")
    with pytest.raises(InputError, match="unknown format"):
        ingest.detect(f)


def test_same_named_files_in_same_named_folders_stay_apart(con, tmp_path):
    # x/vllm/requests.jsonl and y/vllm/requests.jsonl: the folder alone does not tell them apart
    src = (FIX / "vllm" / "requests.jsonl").read_text()
    tmp_path = tmp_path / "logs"  # the store lies beside, not inside, the folder ingested
    for top in ("x", "y"):
        (tmp_path / top / "vllm").mkdir(parents=True)
        (tmp_path / top / "vllm" / "requests.jsonl").write_text(src)
    (tmp_path / "x" / "other").mkdir()
    (tmp_path / "x" / "other" / "solo.jsonl").write_text(src)
    res = load(con, tmp_path)
    assert sorted(r for x in res for r in x.run_ids) == ["solo", "x/vllm/requests", "y/vllm/requests"]
    assert [(r.accepted, r.rejected) for r in res] == [(len(src.splitlines()), 0)] * 3, [r.line() for r in res]
    assert ingest._distinct_run_names([Path("a/p.jsonl"), Path("b/p.jsonl")]) == {
        Path("a/p.jsonl"): "a/p",
        Path("b/p.jsonl"): "b/p",
    }


def test_a_rotated_log_keeps_its_name_with_the_part_before_it(con, tmp_path):
    """server.log and server.log.1 in one folder are one run's log: they share the name "server".
    Told apart by their folders, they had none to tell them apart by and took the whole absolute path."""
    lines = (FIX / "vllm" / "server_epoch.log").read_text().splitlines(keepends=True)[:130]
    d = tmp_path / "rot"
    d.mkdir()
    (d / "server.log.1").write_text("".join(lines[:100]))
    (d / "server.log").write_text("".join(lines[100:]))
    res = load(con, d)
    assert {r for x in res for r in x.run_ids} == {"server"}, [x.line() for x in res]
    whole = store.connect(":memory:")
    try:
        ref = load(whole, _write(tmp_path / "whole" / "server.log", "".join(lines)))
        assert [r.run_ids for r in ref] == [["server"]]
        steps = "select count(*), round(sum(dur_ms), 6), min(iter), max(iter) from iterations"
        assert con.execute(steps).fetchall() == whole.execute(steps).fetchall()
    finally:
        whole.close()
    # rotated parts beside another folder's log of the same name: one name per folder
    assert ingest._distinct_run_names([Path("a/s.log"), Path("a/s.log.1"), Path("b/s.log")]) == {
        Path("a/s.log"): "a/s",
        Path("a/s.log.1"): "a/s",
        Path("b/s.log"): "b/s",
    }


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def test_a_file_named_twice_is_ingested_once_under_its_own_name(con, tmp_path):
    """Named twice (or named and inside a folder named), a file collided with itself: its run took
    the folders' names, and ingesting it again alone loaded it a second time as another run."""
    d = tmp_path / "logs"
    d.mkdir()
    f = d / "requests.jsonl"
    f.write_text((FIX / "vllm" / "requests.jsonl").read_text())
    res = load(con, f, d / ".." / "logs" / "requests.jsonl", d)
    assert [r.run_ids for r in res] == [["requests"]], [r.line() for r in res]
    (again,) = load(con, f)
    assert again.status == "unchanged"
    assert con.execute("select count(*), count(distinct run_id) from requests").fetchone() == (64, 1)


@pytest.mark.parametrize("cut", [300, 3000])
def test_gzip_cut_before_the_first_engine_line_says_damaged_not_unknown(tmp_path, cut):
    """A .gz copied short (cut before its first Iteration line) is a damaged file, not an unknown
    format: 300 bytes decompress to nothing, 3000 to a few header lines of the vLLM log."""
    import gzip

    blob = gzip.compress((FIX / "vllm" / "server.log").read_bytes())
    assert len(blob) > cut
    f = tmp_path / "server.log.gz"
    f.write_bytes(blob[:cut])
    with pytest.raises(InputError) as err:
        ingest.detect(f)
    msg = str(err.value)
    assert "unknown format" not in msg
    assert str(f) in msg and "truncated" in msg and "gzip -t" in msg and "Re-copy" in msg
    assert re.search(r"\b\d+ bytes\b", msg), msg  # how much could be read


def test_a_file_named_like_a_run_of_an_earlier_ingest_is_refused_not_merged(con, tmp_path):
    """Every AIPerf export is profile_export.jsonl: a second one, ingested in a later command without
    --run-id, went into the first's run (20 requests over 416 s, 9.6 tok/s instead of 50.8), and no
    check noticed."""
    src = (FIX / "aiperf" / "profile_export.jsonl").read_text()
    a, b = tmp_path / "c1" / "profile_export.jsonl", tmp_path / "c2" / "profile_export.jsonl"
    for f in (a, b):
        f.parent.mkdir()
        f.write_text(src)
    (first,) = load(con, a)
    before = con.execute("select count(*) from requests").fetchall()[0][0]
    with pytest.raises(InputError, match=r"run 'profile_export' already holds .*c1/profile_export.jsonl.*--run-id"):
        load(con, b)
    assert con.execute("select count(*) from requests").fetchall()[0][0] == before
    # named, it joins (the user says it is one run) or stands apart
    (joined,) = load(con, b, run_id="c2")
    assert joined.run_ids == ["c2"] and joined.accepted == first.accepted
    # the same file again is no other file: unchanged, as before
    (again,) = load(con, a)
    assert again.status == "unchanged"


def test_a_skipped_file_does_not_lengthen_the_run_names_of_the_others(con, tmp_path):
    """Names were made unique over every file of the folder, the skipped ones too: a README named
    requests.md beside another folder's requests.jsonl made its run "a/requests"."""
    d = tmp_path / "logs"
    (d / "a").mkdir(parents=True)
    (d / "b").mkdir()
    (d / "a" / "requests.jsonl").write_text((FIX / "vllm" / "requests.jsonl").read_text())
    (d / "b" / "requests.md").write_text("# how the requests were made\n\nby hand\n")
    res = load(con, d)
    assert [r.run_ids for r in res if r.status != "skipped"] == [["requests"]], [r.line() for r in res]
    assert [r.status for r in res if r.path.endswith(".md")] == ["skipped"]


def test_a_damaged_file_in_a_folder_says_it_is_damaged(tmp_path):
    """In a folder ingest a cut-off .gz was "skipped (no known format); name it with --format NAME":
    only naming the format showed that the file was damaged. The folder's line says so now."""
    import gzip

    from pipeline.cli import run_captured

    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "a.jsonl").write_text((FIX / "canonical" / "tiny.jsonl").read_text())
    body = "\n".join('{"kind":"iteration","iter":%d,"dur_ms":1.0}' % i for i in range(2000)).encode()
    (folder / "bad.jsonl.gz").write_bytes(gzip.compress(body)[:20])
    code, out = run_captured("ingest", folder, "--db", tmp_path / "t.duckdb")
    assert code == 2, out
    line = next(x for x in out.splitlines() if x.startswith(f"{folder / 'bad.jsonl.gz'}: skipped"))
    assert "damaged or truncated gzip" in line and "no known format" not in line, line
    assert line.endswith("; or remove it from the folder"), line
