"""Canonical ingest: the ingest rules of docs/canonical-format.md and every bad input of the foundation issue."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest

from pipeline import ingest
from pipeline.ingest import reader
from pipeline.errors import InputError

IT = {"kind": "iteration", "t_start": 0.0, "t_end": 0.01, "decode_tokens": 1}


def write(path: Path, lines: list) -> Path:
    path.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return path


def it(i: int, **kw) -> dict:
    return {**IT, "iter": i, "t_start": i * 0.01, "t_end": (i + 1) * 0.01} | kw


def rejects(con) -> dict[int, str]:
    return dict(con.execute("select line_no, reason from rejects").fetchall())


def counts(con) -> tuple[int, int, int]:
    return tuple(con.execute("select count(*) from iterations").fetchall()[0]) + tuple(
        con.execute("select (select count(*) from requests), (select count(*) from runs)").fetchall()[0]
    )


def snapshot(con) -> dict:
    return {
        t: sorted(map(str, con.execute(f"select * exclude (ingest_id) from {t}").fetchall()))
        for t in ("iterations", "requests", "tokens", "runs", "rejects")
    }


def test_read_equals_accepted_plus_rejected_plus_skipped(con, tmp_path):
    f = write(tmp_path / "r.jsonl", [it(0), "garbage", "", it(1), {"kind": "nope"}, it(2)])
    (res,) = ingest.ingest_paths(con, [f])
    assert (res.lines_read, res.accepted, res.rejected, res.skipped) == (6, 3, 2, 1)
    row = con.execute("select lines_read, lines_accepted, lines_rejected, lines_skipped from ingests").fetchall()[0]
    assert row == (6, 3, 2, 1)


def test_empty_file(con, tmp_path):
    f = tmp_path / "empty.jsonl"
    f.write_text("")
    (res,) = ingest.ingest_paths(con, [f])
    assert (res.lines_read, res.accepted, res.rejected) == (0, 0, 0)
    assert counts(con) == (0, 0, 0)
    assert "0 read" in res.line()


def test_truncated_last_line_is_rejected_rest_kept(con, tmp_path):
    f = tmp_path / "trunc.jsonl"
    f.write_text(json.dumps(it(0)) + "\n" + json.dumps(it(1))[:25])
    (res,) = ingest.ingest_paths(con, [f])
    assert res.accepted == 1 and res.rejected == 1
    assert "not valid JSON" in rejects(con)[2]


def test_garbage_in_the_middle_does_not_abort(con, tmp_path):
    f = write(tmp_path / "g.jsonl", [it(0), "\x00\x01garbage}", "[1,2,3]", it(1)])
    ingest.ingest_paths(con, [f])
    r = rejects(con)
    assert set(r) == {2, 3}
    assert "not a JSON object" in r[3]
    assert counts(con)[0] == 2


@pytest.mark.parametrize(
    "record, expect",
    [
        (it(0, t_start="abc"), 't_start: expected a number, got "abc"'),
        (it(0, dur_ms=-5.0, t_start=None, t_end=None), "dur_ms is negative"),
        ('{"kind":"iteration","iter":0,"dur_ms":NaN}', "dur_ms: NaN or infinite"),
        (it(0, t_start=2.0, t_end=1.0), "t_end (1.0) is before t_start (2.0)"),
        (it(0, decode_tokens=-1), "decode_tokens: negative count"),
        (it(0, t_start=1.0, t_end=1.5, dur_ms=20.0), "dur_ms (20.0) disagrees with (t_end - t_start) * 1000 (500.0)"),
        (it(0, kv_usage=1.5), "kv_usage: expected a fraction 0..1"),
        ({"kind": "iteration", "t_start": 0, "t_end": 1}, "missing required field iter"),
        (
            {"kind": "request", "req_id": "a", "t_arrival": 2.0, "t_first_token": 1.0},
            "t_first_token is before t_arrival",
        ),
        (
            {"kind": "request", "req_id": "a", "t_arrival": 0.0, "status": "weird"},
            "status: expected one of ok, error, aborted",
        ),
        (
            {"kind": "request", "req_id": "a", "t_arrival": 0, "token_times": [0.2, 0.1]},
            "token_times must be non-decreasing",
        ),
        ('{"kind":"request","req_id":"a","t_arrival":0,"token_times":[0.1,NaN]}', "token_times: contains null, NaN"),
        ({"kind": "request", "req_id": "a", "t_arrival": 0, "token_times": [0.1, None]}, "token_times: contains null"),
        ({"kind": "request", "req_id": "a", "t_arrival": 0, "token_times": [0.1, "x"]}, "token_times: contains null"),
        ({"kind": "iteration", "iter": 1.5, "dur_ms": 1}, "iter: expected an integer, got 1.5"),
        ({"kind": "request", "req_id": "a", "t_arrival": "5"}, 't_arrival: expected a number, got "5"'),
        ({"kind": "what", "x": 1}, "unknown kind what"),
        ({"x": 1}, "missing field kind"),
    ],
)
def test_bad_records_have_clear_reasons(con, tmp_path, record, expect):
    f = write(tmp_path / "bad.jsonl", [it(5), record])
    (res,) = ingest.ingest_paths(con, [f])
    assert res.rejected == 1 and res.accepted == 1
    assert expect in rejects(con)[2]
    raw = con.execute("select raw from rejects").fetchall()[0][0]
    assert raw == (record if isinstance(record, str) else json.dumps(record))


def test_duplicates_in_a_run_rejected_first_kept(con, tmp_path):
    req = {"kind": "request", "req_id": "a", "t_arrival": 0.0}
    f = write(tmp_path / "d.jsonl", [it(0), it(1), it(0, t_end=0.5), req, req | {"t_arrival": 1.0}])
    ingest.ingest_paths(con, [f])
    r = rejects(con)
    assert "duplicate iter 0 in run d (first at line 1)" in r[3]
    assert "duplicate req_id a" in r[5]
    assert con.execute("select t_end from iterations where iter = 0").fetchall() == [(0.01,)]


def test_duplicates_across_files_point_to_the_first(con, tmp_path):
    ingest.ingest_paths(con, [write(tmp_path / "a.jsonl", [{"kind": "run", "run_id": "R"}, it(0)])])
    ingest.ingest_paths(con, [write(tmp_path / "b.jsonl", [{"kind": "run", "run_id": "R"}, it(0, t_end=9.0)])])
    reason = rejects(con)[2]
    # another file's record: re-loading this one would meet it again, so no --replace advice
    assert "already stored from line 2 of" in reason and "a.jsonl, another file" in reason, reason
    # whether the file or a converter named the run is not known where the duplicate is found:
    # the advice gives both ways out (--run-id does not move records that name their run)
    assert "--replace" not in reason
    assert "give it another --run-id (for records that name no run) or edit the run id in the file" in reason
    assert "which --run-id does not change" in reason


def test_a_file_edited_and_ingested_again_is_told_to_use_replace(con, tmp_path):
    f = write(tmp_path / "a.jsonl", [{"kind": "run", "run_id": "R"}, it(0)])
    ingest.ingest_paths(con, [f])
    write(f, [{"kind": "run", "run_id": "R"}, it(0, t_end=9.0)])  # new content, same path
    reason = rejects(con)[2] if ingest.ingest_paths(con, [f]) else None
    assert "already stored from line 2 of" in reason and "use --replace to re-load that file" in reason, reason


def test_unknown_fields_are_kept(con, tmp_path):
    f = write(tmp_path / "x.jsonl", [it(0, gpu_temp_c=71, note={"a": [1, 2]})])
    ingest.ingest_paths(con, [f])
    extra = json.loads(con.execute("select extra from iterations").fetchall()[0][0])
    assert extra == {"gpu_temp_c": 71, "note": {"a": [1, 2]}}


@pytest.mark.parametrize("line_end", ["\n", "\r\n"])  # DuckDB's reader, and the Python line reader
def test_fields_of_another_kind_are_kept_as_unknown_fields(con, tmp_path, line_end):
    """A request's field on a step (or a step's on a request) is no field of that record: it goes
    to extra like any unknown field, also when nothing else about the line is unusual."""
    req = {"kind": "request", "req_id": "a", "t_arrival": 1.0, "decode_tokens": 3, "engine": "vllm"}
    lines = [it(0, t_arrival=5.0, status="ok"), it(1), it(2, other=1.5, req_id="r"), req]
    f = tmp_path / "k.jsonl"
    f.write_bytes("".join(json.dumps(x, separators=(",", ":")) + line_end for x in lines).encode())
    ingest.ingest_paths(con, [f])
    assert rejects(con) == {}
    extras = dict(con.execute("select iter, extra from iterations").fetchall())
    assert {i: json.loads(e) if e else None for i, e in extras.items()} == {
        0: {"t_arrival": 5.0, "status": "ok"},
        1: None,
        2: {"other": 1.5, "req_id": "r"},
    }
    assert json.loads(con.execute("select extra from requests").fetchall()[0][0]) == {
        "decode_tokens": 3,
        "engine": "vllm",
    }
    # and the record's own fields are read as usual
    assert con.execute("select t_start, t_end from iterations where iter = 0").fetchall() == [(0.0, 0.01)]


def test_unknown_fields_of_a_run_record_join_its_meta(con, tmp_path):
    """Runs have no extra column: a run record's unknown fields are kept in its meta, meta's own keys
    first; a later record of the run merges over them as metas do (RFC 7386: a null removes a key)."""
    lines = [
        {"kind": "run", "run_id": "R", "engine": "vllm", "tp": 4, "a": 2, "note": None, "meta": {"a": 1}},
        {"kind": "run", "run_id": "S", "pp": 2},
        {"kind": "run", "run_id": "T", "meta": {"x": 1}},
        it(0, run_id="R"),
    ]
    ingest.ingest_paths(con, [write(tmp_path / "r.jsonl", lines)])
    ingest.ingest_paths(con, [write(tmp_path / "r2.jsonl", [{"kind": "run", "run_id": "R", "tp": 8}])])
    metas = {r: json.loads(m) if m else None for r, m in con.execute("select run_id, meta from runs").fetchall()}
    assert metas == {"R": {"tp": 8, "a": 1}, "S": {"pp": 2}, "T": {"x": 1}}
    stored = con.execute("select meta from run_records where run_id = 'R' order by ingest_id").fetchall()
    assert [json.loads(m) for (m,) in stored] == [{"tp": 4, "a": 1}, {"tp": 8}]  # null fields left out
    assert con.execute("select engine from runs where run_id = 'R'").fetchall() == [("vllm",)]


def test_a_parquet_run_row_gets_no_meta_from_other_kinds_null_columns(con, tmp_path):
    """A Parquet row holds every column of the file: the run row's null step columns are no fields."""
    import duckdb

    f = tmp_path / "mix.parquet"
    duckdb.connect().execute(
        "copy (select * from (values ('run', 'R', NULL::bigint, NULL::double, 'vllm', NULL::bigint), "
        "('iteration', 'R', 0, 1.0, NULL, NULL), ('run', 'R', NULL, NULL, NULL, 4)) "
        f"t(kind, run_id, iter, t_start, engine, tp)) to '{f}'"
    )
    ingest.ingest_paths(con, [f])
    assert con.execute("select meta from run_records order by line_no").fetchall() == [(None,), ('{"tp":4}',)]
    assert con.execute("select engine, meta from runs").fetchall() == [("vllm", '{"tp":4}')]


def test_missing_required_fields_are_named_on_lines_with_unknown_fields(con, tmp_path):
    """A line with an unknown field takes the second look at its JSON types; a required field
    missing there is as missing as on a plain line (it was once taken as present and wrong, with
    no words for it, and the step stored without its iter)."""
    lines = [
        {"kind": "iteration", "t_start": 1.0, "t_end": 2.0, "x": 1},
        {"kind": "request", "req_id": "a", "x": 1},
        {"kind": "iteration", "t_start": 1.0, "t_end": 2.0},
        {"kind": "request", "req_id": "b", "token_times": [1.0], "note": "n"},
    ]
    ingest.ingest_paths(con, [write(tmp_path / "m.jsonl", lines)])
    assert rejects(con) == {
        1: "missing required field iter",
        2: "missing required field t_arrival",
        3: "missing required field iter",
        4: "missing required field t_arrival",
    }
    assert counts(con)[:2] == (0, 0)


def test_missing_optional_fields_are_null_not_zero(con, tmp_path):
    ingest.ingest_paths(con, [write(tmp_path / "n.jsonl", [{"kind": "iteration", "iter": 0, "dur_ms": 4.0}])])
    row = con.execute("select prefill_tokens, context_tokens, dur_ms, t_start from iterations").fetchall()[0]
    assert row == (None, None, 4.0, None)


def test_missing_file_and_empty_directory(con, tmp_path):
    with pytest.raises(InputError, match="no such file"):
        ingest.ingest_paths(con, [tmp_path / "nope.jsonl"])
    (tmp_path / "d").mkdir()
    with pytest.raises(InputError, match="directory holds no files"):
        ingest.ingest_paths(con, [tmp_path / "d"])


def test_directory_ingests_each_file(con, tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    write(d / "one.jsonl", [it(0)])
    write(d / "two.jsonl", [it(0)])
    res = ingest.ingest_paths(con, [d])
    assert [r.run_ids for r in res] == [["one"], ["two"]]


def test_same_file_names_in_different_folders_stay_separate_runs(con, tmp_path):
    for sub in ("c1", "c2"):
        (tmp_path / sub).mkdir()
        write(tmp_path / sub / "profile.jsonl", [it(0), it(1)])
    write(tmp_path / "c2" / "other.jsonl", [it(0)])
    ingest.ingest_paths(con, [tmp_path])
    got = dict(con.execute("select run_id, count(*) from iterations group by 1").fetchall())
    assert got == {"c1/profile": 2, "c2/profile": 2, "other": 1}


def test_directory_skips_unknown_files_but_a_named_one_is_an_error(con, tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    write(d / "run.jsonl", [it(0)])
    (d / "NOTES.txt").write_text("operator notes, not a trace\n")
    res = ingest.ingest_paths(con, [d])
    assert [(Path(r.path).name, r.status) for r in res] == [("NOTES.txt", "skipped"), ("run.jsonl", "ingested")]
    assert "skipped (no known format)" in res[0].line()
    with pytest.raises(InputError, match="unknown format"):
        ingest.ingest_paths(con, [d / "NOTES.txt"])


def test_a_folder_of_simulated_runs_is_ingested_without_their_truth_files(con, tmp_path):
    """`tracelat simulate` writes NAME.truth.json beside its trace: a folder of simulated runs made
    `ingest DIR` (and a nightly night) exit 2 on our own file. It is left out of a folder; named,
    it is still no trace, and a foreign *.truth.json in a folder is still reported."""
    from pipeline.sim import WorkloadSpec, run_simulation

    d = tmp_path / "sims"
    d.mkdir()
    run_simulation(d / "a.jsonl", run_id="a", spec=WorkloadSpec(requests=20))
    assert (d / "a.truth.json").exists()
    (d / "b.truth.json").write_text('{"engine": "other", "note": "not ours"}\n')
    res = ingest.ingest_paths(con, [d])
    assert [(Path(r.path).name, r.status) for r in res] == [("a.jsonl", "ingested"), ("b.truth.json", "skipped")]
    with pytest.raises(InputError, match="unknown format"):
        ingest.ingest_paths(con, [d / "a.truth.json"])


def test_reingest_is_noop_and_replace_reloads(con, tmp_path):
    f = write(tmp_path / "a.jsonl", [it(0), it(1), "bad"])
    ingest.ingest_paths(con, [f])
    before = snapshot(con)
    (res,) = ingest.ingest_paths(con, [f])
    assert res.status == "unchanged"
    assert snapshot(con) == before
    (res,) = ingest.ingest_paths(con, [f], replace=True)
    assert res.status == "replaced" and res.accepted == 2
    assert snapshot(con) == before
    assert con.execute("select count(*) from ingests").fetchall()[0][0] == 1


def test_replace_after_edit_removes_old_rows(con, tmp_path):
    f = write(tmp_path / "a.jsonl", [it(0), it(1), it(2)])
    ingest.ingest_paths(con, [f])
    write(f, [it(0)])
    ingest.ingest_paths(con, [f], replace=True)
    assert counts(con)[0] == 1


def test_run_identity_rules(con, tmp_path):
    lines = [
        it(0),  # before any run record: --run-id
        {"kind": "run", "run_id": "A", "engine": "e1"},
        it(0),  # A
        it(0, run_id="B"),  # own run_id wins
        {"kind": "run", "run_id": "C"},
        it(0),  # C
        it(1),  # C
    ]
    f = write(tmp_path / "multi.jsonl", lines)
    ingest.ingest_paths(con, [f], run_id="cli")
    got = con.execute("select run_id, count(*) from iterations group by 1 order by 1").fetchall()
    assert got == [("A", 1), ("B", 1), ("C", 2), ("cli", 1)]
    runs = dict(con.execute("select run_id, engine from runs").fetchall())
    assert runs == {"A": "e1", "B": None, "C": None, "cli": None}


@pytest.mark.parametrize("bad", [[1], {"a": 1}, 1.5, True, "", "  "])
@pytest.mark.long
def test_a_rejected_run_id_names_no_run(con, tmp_path, monkeypatch, bad):
    """A run record whose run_id is rejected does not carry the lines below it into a run named
    by that value's text ('[1]', '1.5', ''): they stay with the run before it, or the file's."""
    from .test_fast_path import stores_of_both_paths

    lines = [it(0), {"kind": "run", "run_id": bad, "engine": "e"}, it(1), it(2, run_id=bad), it(3)]
    f = write(tmp_path / "night.jsonl", lines)
    fast, batch = stores_of_both_paths(tmp_path, monkeypatch, f, ingest.canonical.convert_jsonl)
    assert fast == batch
    assert fast["iterations"] == batch["iterations"] and len(fast["iterations"]) == 3
    assert all(r.startswith("('night', ") for r in fast["iterations"]), fast["iterations"]
    assert [r[0] for r in fast["ingests"]] == [5] and fast["ingests"][0][2] == 2
    (res,) = ingest.ingest_paths(con, [f])
    assert res.run_ids == ["night"]
    got = rejects(con)
    assert set(got) == {2, 4}
    expect = "run_id: empty" if isinstance(bad, str) else "run_id: expected a string or integer"
    assert all(r.startswith(expect) for r in got.values()), got


def test_an_integer_run_id_is_its_decimal_text(con, tmp_path):
    f = write(tmp_path / "n.jsonl", [{"kind": "run", "run_id": 7}, it(0), it(1, run_id=8)])
    ingest.ingest_paths(con, [f])
    assert con.execute("select run_id, count(*) from iterations group by 1 order by 1").fetchall() == [
        ("7", 1),
        ("8", 1),
    ]
    assert rejects(con) == {}


def test_file_name_is_last_resort_and_run_carries_across_batches(con, tmp_path, monkeypatch):
    from pipeline.ingest import reader

    monkeypatch.setattr(reader, "BATCH_BYTES", 64)  # many batches: the run must carry over
    f = write(
        tmp_path / "night-01.trace.jsonl", [it(0), {"kind": "run", "run_id": "Z"}] + [it(i) for i in range(1, 30)]
    )
    ingest.ingest_paths(con, [f])
    got = dict(con.execute("select run_id, count(*) from iterations group by 1").fetchall())
    assert got == {"night-01": 1, "Z": 29}


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_compressed_files(con, tmp_path, codec):
    text = "".join(json.dumps(it(i)) + "\n" for i in range(50)).encode()
    f = tmp_path / "c.data"  # the extension says nothing; magic bytes decide
    if codec == "gzip":
        f.write_bytes(gzip.compress(text))
    else:
        import zstandard

        f.write_bytes(zstandard.ZstdCompressor().compress(text))
    (res,) = ingest.ingest_paths(con, [f])
    assert res.accepted == 50


def test_corrupt_gzip_fails_cleanly_and_changes_nothing(con, tmp_path):
    ingest.ingest_paths(con, [write(tmp_path / "ok.jsonl", [it(0)])])
    before = snapshot(con)
    text = "".join(json.dumps(it(i, run_id="g")) + "\n" for i in range(20000)).encode()
    blob = bytearray(gzip.compress(text))
    mid = len(blob) // 2
    blob[mid : mid + 64] = b"\xff" * 64
    f = tmp_path / "broken.jsonl.gz"
    f.write_bytes(bytes(blob))
    with pytest.raises(InputError, match="corrupt after line"):
        ingest.ingest_paths(con, [f])
    assert snapshot(con) == before
    assert con.execute("select count(*) from ingests").fetchall()[0][0] == 1


def test_parquet_canonical(con, tmp_path):
    import polars as pl

    df = pl.DataFrame(
        {
            "kind": ["iteration", "iteration", "request"],
            "iter": [0, 1, None],
            "t_start": [0.0, 0.01, None],
            "t_end": [0.01, 0.03, None],
            "req_id": [None, None, "q"],
            "t_arrival": [None, None, 0.0],
            "t_first_token": [None, None, 0.01],
            "t_finish": [None, None, 0.03],
            "output_tokens": [None, None, 2],
            "token_times": [None, None, [0.01, 0.03]],
        }
    )
    f = tmp_path / "p.parquet"
    df.write_parquet(f)
    (res,) = ingest.ingest_paths(con, [f])
    assert res.format == "parquet" and res.accepted == 3
    assert con.execute("select sum(t) from tokens").fetchall()[0][0] == pytest.approx(0.04)


def test_unknown_format_lists_known(con, tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("hello world\nnothing here\n")
    with pytest.raises(InputError, match="unknown format; known formats: .*jsonl"):
        ingest.ingest_paths(con, [f])


def test_rejected_record_does_not_block_a_later_valid_one(con, tmp_path):
    f = write(tmp_path / "v.jsonl", [it(0), it(1, t_start=5.0, t_end=1.0), it(1)])
    (res,) = ingest.ingest_paths(con, [f])
    assert (res.accepted, res.rejected) == (2, 1)
    assert "t_end (1.0) is before t_start (5.0)" in rejects(con)[2]
    assert con.execute("select count(*) from iterations where iter = 1").fetchall() == [(1,)]


def test_duplicate_across_batches_of_one_file_names_the_line(con, tmp_path, monkeypatch):
    from pipeline.ingest import reader

    monkeypatch.setattr(reader, "BATCH_BYTES", 64)
    f = write(tmp_path / "b.jsonl", [it(0), it(1), it(2), it(1)])
    ingest.ingest_paths(con, [f])
    assert rejects(con) == {4: "duplicate iter 1 in run b (first at line 2)"}


def test_a_failing_file_keeps_the_files_before_it_and_says_so(con, tmp_path):
    good = write(tmp_path / "a_good.jsonl", [it(0)])
    bad = tmp_path / "b_bad.jsonl.gz"
    blob = bytearray(gzip.compress(("".join(json.dumps(it(i)) + "\n" for i in range(20000))).encode()))
    blob[len(blob) // 2 : len(blob) // 2 + 64] = b"\xff" * 64
    bad.write_bytes(bytes(blob))
    with pytest.raises(
        InputError, match=r"corrupt after line .*1 file\(s\) before it were ingested and kept: .*a_good"
    ):
        ingest.ingest_paths(con, [good, bad])
    assert con.execute("select run_id, count(*) from iterations group by 1").fetchall() == [("a_good", 1)]


REQ = {"kind": "request", "req_id": "q", "t_arrival": 1.0, "t_first_token": 1.1, "t_finish": 1.5, "output_tokens": 3}


@pytest.mark.parametrize(
    "record, expect",
    [
        (it(0, t_end=1.797e308), "t_end: 1.797e308 is no time in seconds (magnitude over 1e11"),
        (it(0, t_start=-1.797e308), "t_start: -1.797e308 is no time in seconds"),
        (it(0, t_start=1.7e18, t_end=1.7e18 + 1e7), "t_start: 1700000000000000000.0 is no time in seconds"),  # ns
        (it(0, t_start=0.0, t_end=2e7), "t_end - t_start (20000000.0 s) is longer than 1e7 s"),
        (it(0, t_start=None, t_end=None, dur_ms=1e300), "dur_ms: 1e300 ms is longer than 1e7 s"),
        (it(0, prefill_tokens=2**60), "prefill_tokens: implausibly large (over 2^53)"),
        (it(2**60), "iter: implausibly large (over 2^53)"),
        (REQ | {"t_finish": 1e12}, "t_finish: 1000000000000.0 is no time in seconds"),
        (REQ | {"t_finish": 2e7}, "the request lasts longer than 1e7 s after t_arrival"),
        (REQ | {"output_tokens": 2**62}, "output_tokens: implausibly large"),
        (REQ | {"token_times": [1.1, 1e300]}, "token_times: holds values that are no time in seconds"),
    ],
)
def test_extreme_finite_values_are_rejected(con, tmp_path, record, expect):
    f = write(tmp_path / "x.jsonl", [it(5), record])
    (res,) = ingest.ingest_paths(con, [f])
    assert (res.accepted, res.rejected) == (1, 1), rejects(con)
    assert expect in rejects(con)[2], rejects(con)


def test_report_after_an_extreme_value(tmp_path):
    import subprocess
    import sys

    steps = [it(i, context_tokens=100 + i, prefill_tokens=i % 3) for i in range(60)]
    steps[30]["t_end"] = 1.797e308
    lines = [{"kind": "run", "run_id": "x"}, *steps, REQ]
    f = write(tmp_path / "x.jsonl", lines)
    db = str(tmp_path / "x.duckdb")
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "pipeline", *a, "--db", db],  # noqa: E731
        capture_output=True,
        text=True,
    )
    r = run("ingest", str(f))
    assert r.returncode == 0 and "1 rejected" in r.stdout, r.stdout + r.stderr
    r = run("report", "x", "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert summary["iteration_ms"]["count"] == 59 and summary["iteration_ms"]["max"] == pytest.approx(10.0)


def test_every_problem_of_a_record_is_named_in_field_order(con, tmp_path):
    # one OR of all conditions decides whether reasons are built: a record with several
    # problems must still name each (field checks in field order, then cross-field checks),
    # and one whose only checks are NULL (absent fields) must pass
    bad = it(0, t_start=2.0, t_end=1.0, decode_tokens=-1, kv_usage=1.5) | {"dur_ms": None}
    quiet = {"kind": "iteration", "iter": 1, "dur_ms": 3.0}
    f = write(tmp_path / "many.jsonl", [bad, quiet])
    (res,) = ingest.ingest_paths(con, [f])
    assert (res.accepted, res.rejected) == (1, 1)
    assert rejects(con)[1] == (
        "decode_tokens: negative count -1; kv_usage: expected a fraction 0..1, got 1.5; "
        "t_end (1.0) is before t_start (2.0)"
    )


@pytest.mark.parametrize("keep", [0.6, 0.9])
@pytest.mark.long
def test_cut_gzip_names_its_last_whole_line(con, tmp_path, keep):
    """A compressed file cut short: the error names the last whole line it holds, which zcat shows
    (it said "after line 0" for a file whose first batch broke, and "cannot read the start of the
    file" for a small one, whatever was readable)."""
    text = "".join(json.dumps(it(i, run_id="g")) + "\n" for i in range(3000)).encode()
    blob = gzip.compress(text)
    f = tmp_path / "cut.jsonl.gz"
    f.write_bytes(blob[: int(len(blob) * keep)])
    readable = gzip.GzipFile(fileobj=io.BytesIO(f.read_bytes()))
    got = b""
    try:
        while chunk := readable.read(1):
            got += chunk
    except EOFError:
        pass
    whole = got.count(b"\n")
    assert 0 < whole < 3000
    with pytest.raises(InputError, match=rf"corrupt after line {whole} ") as err:
        ingest.ingest_paths(con, [f])
    # the salvage command writes a file of the same kind beside it (it said part.jsonl for any file)
    assert f"`zcat {f} > {tmp_path / 'cut.part.jsonl'}` and ingest that" in str(err.value)
    log, zst = tmp_path / "server.log.gz", tmp_path / "trace.zst"
    log.write_bytes(blob[:100])
    zst.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(20))  # zstd's magic number
    assert reader.salvage(log) == f"zcat {log} > {tmp_path / 'server.part.log'}"
    assert reader.salvage(zst) == f"zstdcat {zst} > {tmp_path / 'trace.part'}"


@pytest.mark.parametrize("tz", ["Nope/Zone", "", "../etc/passwd"])
def test_an_unknown_tz_is_refused_before_any_file_even_one_without_wall_times(con, tmp_path, tz):
    """--tz matters to server logs only, but a typo must not pass unnoticed on a canonical file."""
    f = write(tmp_path / "c.jsonl", [it(0)])
    with pytest.raises(InputError, match="is not a known time zone"):
        ingest.ingest_paths(con, [f], tz=tz)
    assert counts(con) == (0, 0, 0)
    assert con.execute("select count(*) from ingests").fetchall()[0][0] == 0
    (res,) = ingest.ingest_paths(con, [f], tz="Europe/Berlin")
    assert res.accepted == 1
