"""The duplicate check of a batch runs only where it can find something (load.LINE_COUNTS_SQL):
a key twice among the batch's valid records, or a run that already has records of the kind.
Whatever it skips, every duplicate is still rejected: within a file, across the reader
batches of one file, and against another file of the run."""

from __future__ import annotations

import json

import pytest

from pipeline import store
from pipeline.ingest import canonical, load, reader

from .conftest import load as ingest


def it(i: int, **kw) -> dict:
    return {"kind": "iteration", "iter": i, "t_start": 1.0 + i, "t_end": 1.5 + i} | kw


def req(rid: str, t: float = 0.0) -> dict:
    return {"kind": "request", "req_id": rid, "t_arrival": t, "t_first_token": t + 0.1, "t_finish": t + 0.2}


def write(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def checks(monkeypatch) -> list[str]:
    """The duplicate checks run, by kind (their first statement, the count), and "stored" for
    each time the stored records were asked about."""
    ran: list[str] = []
    real = load._Scope._run

    def spy(self, sql, params, fetch):
        if "first_line" in sql and sql.startswith("select count(*)"):
            ran.append("iteration" if "from iterations" in sql else "request")
        elif sql == load.STORED_SQL:
            ran.append("stored")
        return real(self, sql, params, fetch)

    monkeypatch.setattr(load._Scope, "_run", spy)
    return ran


def _rejects(con) -> list[tuple[int, str]]:
    return con.execute("select line_no, reason from rejects order by all").fetchall()


def test_a_new_runs_file_without_repeats_runs_no_check(tmp_path, checks):
    f = tmp_path / "a.jsonl"
    write(f, [it(0), it(1), req("x"), req("y")])
    con = store.connect(tmp_path / "s.duckdb")
    (res,) = ingest(con, f)
    assert (res.accepted, res.rejected) == (4, 0)
    assert checks == ["stored"]


def test_repeats_within_a_new_runs_file_are_rejected(tmp_path, checks):
    f = tmp_path / "a.jsonl"
    write(f, [it(0), it(1), it(0), req("x"), req("x"), req("y")])
    con = store.connect(tmp_path / "s.duckdb")
    (res,) = ingest(con, f)
    assert (res.accepted, res.rejected) == (4, 2)
    assert _rejects(con) == [
        (3, "duplicate iter 0 in run a (first at line 1)"),
        (5, "duplicate req_id x in run a (first at line 4)"),
    ]
    assert checks == ["iteration", "request"]


def test_a_key_spelled_two_ways_is_still_a_repeat(tmp_path, checks):
    """Keys equal as numbers (0 and -0, 2 and 2.0) are one key for the pre-check, which counts
    keys by their hash: were they two, the repeat would pass unchecked and be stored twice."""
    f = tmp_path / "a.jsonl"
    lines = [json.dumps(it(0)), json.dumps(it(2)), json.dumps(it(0)).replace('"iter": 0', '"iter": -0')]
    lines.append(json.dumps(it(2)).replace('"iter": 2', '"iter": 2.0'))
    f.write_text("\n".join(lines) + "\n")
    con = store.connect(tmp_path / "s.duckdb")
    (res,) = ingest(con, f)
    assert (res.accepted, res.rejected) == (2, 2)
    assert _rejects(con) == [
        (3, "duplicate iter 0 in run a (first at line 1)"),
        (4, "duplicate iter 2 in run a (first at line 2)"),
    ]
    assert checks == ["iteration"]


def test_one_key_in_two_runs_is_no_repeat(tmp_path, checks):
    f = tmp_path / "a.jsonl"
    write(f, [it(0, run_id="r1"), it(0, run_id="r2"), req("x", 0.0) | {"run_id": "r1"}, req("x") | {"run_id": "r2"}])
    con = store.connect(tmp_path / "s.duckdb")
    (res,) = ingest(con, f)
    assert (res.accepted, res.rejected) == (4, 0)
    assert checks == ["stored"]


def test_a_second_file_of_the_run_is_checked_against_the_stored_records(tmp_path, checks):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write(a, [it(0), req("x")])
    write(b, [it(1), it(0), req("y"), req("x")])  # no repeat within b: only the stored ones find them
    con = store.connect(tmp_path / "s.duckdb")
    ingest(con, a, run_id="r")
    assert checks == ["stored"]
    checks.clear()
    (res,) = ingest(con, b, run_id="r")
    assert (res.accepted, res.rejected) == (2, 2)
    assert [line for line, _ in _rejects(con)] == [2, 4]
    assert all("already stored from line" in reason for _, reason in _rejects(con))
    assert checks == ["stored", "iteration", "request"]
    # another run's records are no repeat: its file runs no check
    checks.clear()
    (res,) = ingest(con, b, run_id="other")
    assert (res.accepted, res.rejected) == (4, 0)
    assert checks == ["stored"]


@pytest.mark.parametrize("lines_per_batch", [1, 3])
def test_repeats_across_the_batches_of_one_file(tmp_path, monkeypatch, checks, lines_per_batch):
    # the later batch meets the earlier one's records as stored (the same transaction)
    records = [it(0), req("x"), it(1), req("y"), it(0), req("x"), it(2)]
    line_bytes = max(len(json.dumps(r)) + 1 for r in records)
    monkeypatch.setattr(reader, "BATCH_BYTES", line_bytes * lines_per_batch)
    monkeypatch.setattr(canonical, "STAGED_SLICE_BATCHES", 1)
    f = tmp_path / "a.jsonl"
    write(f, records)
    con = store.connect(tmp_path / "s.duckdb")
    (res,) = ingest(con, f)
    assert (res.accepted, res.rejected) == (5, 2)
    assert _rejects(con) == [
        (5, "duplicate iter 0 in run a (first at line 1)"),
        (6, "duplicate req_id x in run a (first at line 2)"),
    ]
    assert "iteration" in checks and "request" in checks
    # the stored records are asked about once, for the first batch: later batches of the run
    # are checked because an earlier one loaded records of it
    assert checks.count("stored") == 1


def test_a_replaced_file_is_checked_against_another_file_of_its_run(tmp_path):
    # --replace removes the file's earlier records (and its run's row may go with them): the
    # other file's records of the run are still stored, and still found
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write(a, [it(0), req("x")])
    write(b, [it(1), req("y")])
    con = store.connect(tmp_path / "s.duckdb")
    ingest(con, a, run_id="r")
    ingest(con, b, run_id="r")
    write(b, [it(1), it(0), req("y"), req("x")])
    (res,) = ingest(con, b, run_id="r", replace=True)
    assert (res.status, res.accepted, res.rejected) == ("replaced", 2, 2)
    assert [line for line, _ in _rejects(con)] == [2, 4]


@pytest.fixture
def big(monkeypatch):
    """Every batch counts as big (over store.EXECUTE_ROWS_MAX rows): its steps' repeats are
    asked of their numbers' bit string (load._step_repeats), not of hashes."""
    monkeypatch.setattr(store, "EXECUTE_ROWS_MAX", 0)
    bits = []
    real = load._Scope._run

    def spy(self, sql, params, fetch):
        if sql == load._STEP_BITS_SQL:
            bits.append(params)
        return real(self, sql, params, fetch)

    monkeypatch.setattr(load._Scope, "_run", spy)
    return bits


@pytest.mark.parametrize("first", [0, -5, 2**40])
def test_a_big_batch_finds_a_repeated_step_by_its_bit_string(tmp_path, big, first):
    f = tmp_path / "a.jsonl"
    steps = [it(first + k, t_start=1.0 + k, t_end=1.5 + k) for k in (0, 3, 1, 3)]
    write(f, [*steps, req("x")])
    con = store.connect(tmp_path / "s.duckdb")
    (res,) = ingest(con, f)
    assert (res.accepted, res.rejected) == (4, 1)
    assert _rejects(con) == [(4, f"duplicate iter {first + 3} in run a (first at line 2)")]
    assert big == [{"lo": first, "hi": first + 3}]


def test_a_big_batch_without_repeats_runs_no_check(tmp_path, big, checks):
    f = tmp_path / "a.jsonl"
    write(f, [it(2), it(0), it(1), req("x")])
    con = store.connect(tmp_path / "s.duckdb")
    (res,) = ingest(con, f)
    assert (res.accepted, res.rejected) == (4, 0)
    assert big == [{"lo": 0, "hi": 2}]
    assert checks == ["stored"]


def test_a_big_batch_of_two_runs_or_far_apart_steps_counts_hashes(tmp_path, big, checks):
    # two runs that both count from 0: the numbers repeat, the keys do not
    f = tmp_path / "a.jsonl"
    write(f, [it(0, run_id="r1"), it(1, run_id="r1"), it(0, run_id="r2"), it(1, run_id="r2")])
    con = store.connect(tmp_path / "s.duckdb")
    (res,) = ingest(con, f)
    assert (res.accepted, res.rejected, big, checks) == (4, 0, [], ["stored"])
    # numbers further apart than the bit string may span: hashes again, the repeat still found
    g = tmp_path / "b.jsonl"
    write(g, [it(0), it(load.STEP_BITS_MAX), it(0)])
    (res,) = ingest(con, g)
    assert (res.accepted, res.rejected, big) == (2, 1, [])
    assert _rejects(con) == [(3, "duplicate iter 0 in run b (first at line 1)")]
