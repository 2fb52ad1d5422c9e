"""Run metadata is merged from every file that names the run, and survives removing one of them."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from pipeline import ingest, store


def write(path: Path, *records: dict) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def run_row(con, run_id: str) -> dict:
    cur = con.execute("select * exclude (ingest_id) from runs where run_id = ?", [run_id])
    row = cur.fetchall()
    assert len(row) == 1, row
    d = dict(zip([c[0] for c in cur.description], row[0]))
    d["meta"] = json.loads(d["meta"]) if d["meta"] is not None else None
    return d


STEP = {"kind": "iteration", "iter": 0, "t_start": 0.0, "t_end": 0.01}


@pytest.mark.long
def test_replacing_the_file_that_created_a_run_keeps_what_other_files_said(con, tmp_path):
    log = write(
        tmp_path / "log.jsonl",
        {"kind": "run", "run_id": "x", "engine": "vllm", "meta": {"block": 16, "tp": 1}},
        STEP | {"run_id": "x"},
    )
    extra = write(
        tmp_path / "extra.jsonl", {"kind": "run", "run_id": "x", "gpu": "h100-sxm", "meta": {"tp": 2, "note": "b"}}
    )
    ingest.ingest_paths(con, [log, extra])
    before = run_row(con, "x")
    assert before["engine"] == "vllm" and before["gpu"] == "h100-sxm"
    assert before["meta"] == {"block": 16, "tp": 2, "note": "b"}  # later files patch earlier ones
    # the log is re-recorded (new content, same path) and replaces its old ingest
    write(
        log,
        {"kind": "run", "run_id": "x", "engine": "vllm", "engine_version": "0.9", "meta": {"block": 32}},
        STEP | {"run_id": "x"},
    )
    (res,) = ingest.ingest_paths(con, [log], replace=True)
    assert res.status == "replaced"
    after = run_row(con, "x")
    assert after["gpu"] == "h100-sxm"  # from extra.jsonl: was lost before run records were kept
    assert after["engine_version"] == "0.9"
    # extra.jsonl came earlier than the new log now, so the log's block wins and extra's keys stay
    assert after["meta"] == {"block": 32, "tp": 2, "note": "b"}
    # the same as a fresh store given the files in that order
    fresh = store.connect(tmp_path / "fresh.duckdb")
    ingest.ingest_paths(fresh, [extra, log])
    assert run_row(fresh, "x") == after


def test_replacing_the_file_that_added_metadata_removes_it(con, tmp_path):
    log = write(tmp_path / "log.jsonl", {"kind": "run", "run_id": "x", "model": "m"}, STEP | {"run_id": "x"})
    extra = write(tmp_path / "extra.jsonl", {"kind": "run", "run_id": "x", "gpu": "a100-80gb", "meta": {"k": 1}})
    ingest.ingest_paths(con, [log, extra])
    write(extra, {"kind": "run", "run_id": "x", "meta": {"j": 2}})
    ingest.ingest_paths(con, [extra], replace=True)
    row = run_row(con, "x")
    assert (row["model"], row["gpu"], row["meta"]) == ("m", None, {"j": 2})


def test_run_without_records_keeps_a_row_while_it_has_data(con, tmp_path):
    meta = write(tmp_path / "meta.jsonl", {"kind": "run", "run_id": "x", "gpu": "l40s"})
    data = write(tmp_path / "data.jsonl", STEP | {"run_id": "x"})
    ingest.ingest_paths(con, [meta, data])
    write(meta, {"kind": "run", "run_id": "y", "gpu": "l40s"})  # the metadata file now names another run
    ingest.ingest_paths(con, [meta], replace=True)
    assert run_row(con, "x")["gpu"] is None  # bare row: its steps are still there
    assert run_row(con, "y")["gpu"] == "l40s"


def test_two_records_for_one_run_in_one_file_merge_like_two_files(con, tmp_path):
    f = write(
        tmp_path / "two.jsonl",
        {"kind": "run", "run_id": "x", "meta": {"a": 1, "b": 1}},
        {"kind": "run", "run_id": "x", "meta": {"b": 2}},
        STEP | {"run_id": "x"},
    )
    ingest.ingest_paths(con, [f])
    assert run_row(con, "x")["meta"] == {"a": 1, "b": 2}


def test_store_from_before_run_records_is_migrated(tmp_path):
    db = tmp_path / "old.duckdb"
    con = store.connect(db)
    log = write(tmp_path / "log.jsonl", {"kind": "run", "run_id": "x", "gpu": "h200"}, STEP | {"run_id": "x"})
    ingest.ingest_paths(con, [log])
    con.execute("drop table run_records")  # as written by an older tracelat
    con.close()
    raw = duckdb.connect(str(db))
    assert "run_records" not in {r[0] for r in raw.execute("select table_name from duckdb_tables()").fetchall()}
    raw.close()
    con = store.connect(db)
    assert con.execute("select run_id, gpu from run_records").fetchall() == [("x", "h200")]
    extra = write(tmp_path / "extra.jsonl", {"kind": "run", "run_id": "x", "model": "m"})
    ingest.ingest_paths(con, [extra])
    write(extra, {"kind": "run", "run_id": "x", "model": "m2"})
    ingest.ingest_paths(con, [extra], replace=True)
    row = run_row(con, "x")
    assert (row["gpu"], row["model"]) == ("h200", "m2")  # the old file's gpu survives the replace
    con.close()


STEPS = [{"kind": "iteration", "iter": i, "t_start": i * 0.01, "t_end": (i + 1) * 0.01} for i in range(6)]


def request(prompt: int) -> dict:
    return {
        "kind": "request",
        "req_id": "A",
        "t_arrival": 0.0,
        "t_scheduled": 0.0,
        "t_first_token": 0.01,
        "t_finish": 0.05,
        "prompt_tokens": prompt,
        "output_tokens": 5,
    }


def contexts(con) -> list:
    return con.execute("select list(context_tokens order by iter) from iterations").fetchall()[0][0]


def test_context_estimate_follows_a_replaced_request_file(con, tmp_path):
    steps = write(
        tmp_path / "it.jsonl", {"kind": "run", "run_id": "r", "model": "m", "meta": {"estimated": ["dur_ms"]}}, *STEPS
    )
    reqs = write(tmp_path / "rq.jsonl", {"kind": "run", "run_id": "r"}, request(100))
    ingest.ingest_paths(con, [steps, reqs])
    first = contexts(con)
    assert first[1] > 100 and first[-1] == 0  # prompt plus tokens emitted, while the request runs
    assert run_row(con, "r")["meta"]["estimated"] == ["dur_ms", "context_tokens"]  # the converter's flag kept
    write(reqs, {"kind": "run", "run_id": "r"}, request(1000))
    ingest.ingest_paths(con, [reqs], replace=True)
    assert contexts(con) == [c + 900 if 0 < c else c for c in first]  # estimated again from the new file
    meta = run_row(con, "r")["meta"]
    assert meta["estimated"] == ["dur_ms", "context_tokens"] and meta["context_estimate"]["requests"] == 1
    assert run_row(con, "r")["model"] == "m"
    # the request file now holds another run: r has no requests left, so no estimate either
    write(reqs, {"kind": "run", "run_id": "other"}, request(1000))
    (res,) = ingest.ingest_paths(con, [reqs], replace=True)
    assert res.removed_runs == ["r"] and "no longer loaded by it: r" in res.line()
    assert contexts(con) == [None] * 6
    meta = run_row(con, "r")["meta"]
    assert meta["estimated"] == ["dur_ms"] and "no request records" in meta["context_estimate"]["skipped"]


def test_a_patch_that_removes_a_key_means_the_same_at_ingest_and_after_a_replace(con, tmp_path):
    a = write(tmp_path / "a.jsonl", {"kind": "run", "run_id": "x", "meta": {"a": 1, "b": 1}}, STEP | {"run_id": "x"})
    b = write(tmp_path / "b.jsonl", {"kind": "run", "run_id": "x", "meta": {"a": None}})
    c = write(tmp_path / "c.jsonl", {"kind": "run", "run_id": "x", "gpu": "l40s"})
    ingest.ingest_paths(con, [a, b, c])
    assert run_row(con, "x")["meta"] == {"b": 1}
    write(c, {"kind": "run", "run_id": "x", "gpu": "h100-sxm"})
    ingest.ingest_paths(con, [c], replace=True)
    row = run_row(con, "x")
    assert (row["gpu"], row["meta"]) == ("h100-sxm", {"b": 1})


def test_replace_says_which_runs_of_the_path_it_removed(con, tmp_path):
    p = write(
        tmp_path / "p.jsonl", {"kind": "request", "req_id": "a", "t_arrival": 0, "t_first_token": 0.1, "t_finish": 0.2}
    )
    ingest.ingest_paths(con, [p], run_id="A")
    ingest.ingest_paths(con, [p], run_id="B")
    (res,) = ingest.ingest_paths(con, [p], run_id="C", replace=True)
    assert res.status == "replaced" and res.removed_runs == ["A", "B"]
    assert "no longer loaded by it: A, B" in res.line()
    assert store.known_runs(con) == ["C"]
