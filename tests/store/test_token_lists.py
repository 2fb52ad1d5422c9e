"""Token times are stored once, one list per request (token_lists); the tokens view gives one
row per token with idx, t and itl_ms.  Checked against the files' own lists, computed here in
Python, and against a store of the older layout (one stored row per token), which opening
migrates."""

from __future__ import annotations

import json
import random

import duckdb

from pipeline import ingest, store


def _requests(rng: random.Random, n: int) -> list[dict]:
    out = []
    for k in range(n):
        t0 = 1000.0 + k * rng.uniform(0.01, 0.5)
        times, t = [], t0 + rng.uniform(0.01, 0.2)
        for _ in range(rng.choice([0, 1, 2, 7, 40])):
            times.append(round(t, 6))
            t += rng.choice([0.0, rng.expovariate(50)])  # equal times (one chunk) happen too
        out.append(
            {
                "kind": "request",
                "req_id": f"r{k}",
                "t_arrival": t0,
                "token_times": times,
                "output_tokens": len(times),
                "t_first_token": times[0] if times else None,
                "t_finish": times[-1] if times else None,
            }
        )
    return out


def test_tokens_view_matches_each_files_lists(tmp_path):
    rng = random.Random(7)
    reqs = _requests(rng, 60)
    bad = {"kind": "request", "req_id": "bad", "t_arrival": 1.0, "token_times": [3.0, 2.0]}  # rejected: out of order
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"kind": "run", "run_id": "a"}, *reqs, bad]))
    con = store.connect(tmp_path / "s.duckdb")
    ingest.ingest_paths(con, [path])
    expect = []
    for r in reqs:
        ts = r["token_times"]
        for i, t in enumerate(ts):
            expect.append(("a", r["req_id"], i, t, None if i == 0 else (t - ts[i - 1]) * 1000))
    got = con.execute("select run_id, req_id, idx, t, itl_ms from tokens order by req_id, idx").fetchall()
    expect.sort(key=lambda x: (x[1], x[2]))
    assert [g[:4] for g in got] == [e[:4] for e in expect]
    for g, e in zip(got, expect):
        assert (g[4] is None) == (e[4] is None) and (e[4] is None or abs(g[4] - e[4]) <= 1e-9 * max(1, abs(e[4])))
    # once per request with tokens: no list for the rejected request, none for those without times
    n_lists = con.execute("select count(*), sum(len(t_s)) from token_lists").fetchall()[0]
    assert n_lists == (sum(1 for r in reqs if r["token_times"]), len(expect))
    assert con.execute(
        "select data_type from duckdb_columns() where table_name = 'tokens' and column_name = 'idx'"
    ).fetchall() == [("INTEGER",)]


def test_replace_removes_the_old_lists(tmp_path):
    reqs = _requests(random.Random(3), 20)
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    con = store.connect(tmp_path / "s.duckdb")
    ingest.ingest_paths(con, [path])
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs[:5]))
    ingest.ingest_paths(con, [path], replace=True)
    assert con.execute("select count(*) from tokens").fetchall()[0][0] == sum(len(r["token_times"]) for r in reqs[:5])


def test_a_store_with_one_row_per_token_is_migrated(tmp_path):
    db = tmp_path / "old.duckdb"
    rows = [("a", "r1", i, 10.0 + 0.5 * i, None if i == 0 else 500.0, 1) for i in range(5)]
    rows += [("b", "r1", i, 20.0 + i, None if i == 0 else 1000.0, 2) for i in range(3)]
    shuffled = rows[:]
    random.Random(1).shuffle(shuffled)  # stored order is not idx order
    old = duckdb.connect(str(db))
    old.execute(
        "create table tokens (run_id varchar, req_id varchar, idx integer, t double, itl_ms double, ingest_id bigint)"
    )
    old.executemany("insert into tokens values (?, ?, ?, ?, ?, ?)", shuffled)
    old.close()
    con = store.connect(db)
    assert con.execute("select table_type from information_schema.tables where table_name = 'tokens'").fetchall() == [
        ("VIEW",)
    ]
    assert sorted(con.execute("select run_id, req_id, t_s, ingest_id from token_lists").fetchall()) == [
        ("a", "r1", [10.0, 10.5, 11.0, 11.5, 12.0], 1),
        ("b", "r1", [20.0, 21.0, 22.0], 2),
    ]
    assert con.execute("select * from tokens order by run_id, idx").fetchall() == rows
    con.close()
    assert store.connect(db).execute("select count(*) from tokens").fetchall()[0][0] == len(rows)  # opens again
