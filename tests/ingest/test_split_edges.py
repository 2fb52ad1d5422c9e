"""Split evidence at the edges: thin clients, no token times, two request sources, bad overrides."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from pipeline import store
from pipeline.errors import InputError
from pipeline.ingest import ingest_paths
from pipeline.sim.split import scenario, write_split


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    d = tmp_path_factory.mktemp("edge")
    result, pol, model, noise = scenario("light", 9)
    truth = write_split(result, d / "server.jsonl", d / "client.jsonl", "s", pol, model, noise, client_origin_s=777.0)
    med = float(np.median(result.iterations["t_end"] - result.iterations["t_start"]))
    return d, truth, med


def _client_variant(d, name: str, fn) -> str:
    lines = (d / "client.jsonl").read_text().splitlines()
    run, reqs = lines[0], pl.read_ndjson("\n".join(lines[1:]).encode())
    out = d / name
    with out.open("w") as fh:
        fh.write(run + "\n")
        fn(reqs).write_ndjson(fh)
    return str(out)


def _align(tmp_path, files, **kw) -> dict:
    con = store.connect(tmp_path / "x.duckdb")
    ingest_paths(con, files, run_id="s", **kw)
    info = con.execute("select json_extract(meta, '$.clock_alignment') from runs where run_id = 's'").fetchone()[0]
    return json.loads(info) if info else {}


def test_client_without_token_times_aligns_on_first_and_last_tokens(split, tmp_path):
    d, truth, med = split
    client = _client_variant(d, "no_tokens.jsonl", lambda r: r.drop("token_times"))
    src = _align(tmp_path, [d / "server.jsonl", client])["sources"][0]
    assert src["status"] == "aligned" and abs(src["offset_s"] - truth) <= med
    assert "preemptions" not in src["inferred"]["fields"]  # nothing to infer them from


def test_client_with_three_requests_is_refused_not_guessed(split, tmp_path):
    d, _, _ = split
    client = _client_variant(d, "tiny.jsonl", lambda r: r.head(2))
    info = _align(tmp_path, [d / "server.jsonl", client])
    assert info["status"] == "failed" and "too few to align" in info["problem"]


def test_client_whose_requests_all_failed(split, tmp_path):
    d, _, _ = split
    client = _client_variant(
        d,
        "failed.jsonl",
        lambda r: r.with_columns(
            status=pl.lit("error"),
            t_first_token=pl.lit(None, pl.Float64),
            t_finish=pl.lit(None, pl.Float64),
            token_times=pl.lit(None, pl.List(pl.Float64)),
        ),
    )
    info = _align(tmp_path, [d / "server.jsonl", client])
    assert info["status"] == "failed"


@pytest.mark.long
def test_two_request_sources_are_aligned_each(split, tmp_path):
    """A bench file and a gateway's copy of the same requests on another clock: each gets its offset."""
    d, truth, med = split
    other = _client_variant(
        d,
        "gateway.jsonl",
        lambda r: r.with_columns(
            pl.col("t_arrival", "t_first_token", "t_finish") + 1000.0,
            pl.col("token_times").list.eval(pl.element() + 1000.0),
            req_id=pl.lit("g") + pl.col("req_id"),
        ),
    )
    info = _align(tmp_path, [d / "server.jsonl", d / "client.jsonl", other])
    offs = sorted(s["offset_s"] for s in info["sources"])
    assert info["status"] == "aligned" and len(offs) == 2
    assert abs(offs[0] - (truth - 1000.0)) <= med and abs(offs[1] - truth) <= med


def test_clock_offset_must_name_one_file(split, tmp_path):
    d, _, _ = split
    with pytest.raises(InputError, match="matches 0 of the files"):
        _align(tmp_path, [d / "server.jsonl", d / "client.jsonl"], clock_offsets=("nope.jsonl=3",))
    with pytest.raises(InputError, match="not a number"):
        _align(tmp_path, [d / "server.jsonl", d / "client.jsonl"], clock_offsets=("client.jsonl=soon",))
    with pytest.raises(InputError, match="SOURCE=SECONDS"):
        _align(tmp_path, [d / "server.jsonl", d / "client.jsonl"], clock_offsets=("client.jsonl",))
    with pytest.raises(InputError, match="at most 1e"):
        _align(tmp_path, [d / "server.jsonl", d / "client.jsonl"], clock_offsets=("client.jsonl=1e30",))


def test_clock_offset_names_its_file_by_any_path(split, tmp_path, monkeypatch):
    """./client.jsonl, an absolute path or one through '..' name the file ingested as client.jsonl
    (they matched 0 files: only the spelling given to ingest or the bare name matched)."""
    from pipeline.ingest import align

    d, _, _ = split
    monkeypatch.chdir(d)
    paths = ["server.jsonl", "client.jsonl"]
    for spelling in ("./client.jsonl", str(d / "client.jsonl"), f"../{d.name}/client.jsonl"):
        assert align.parse_offsets((f"{spelling}=3.5",), paths) == {"client.jsonl": 3.5}
    with pytest.raises(InputError, match="matches 0 of the files"):
        align.parse_offsets(("./nope.jsonl=3",), paths)


def _source(con, run: str) -> dict:
    info = con.execute("select json_extract(meta, '$.clock_alignment') from runs where run_id = ?", [run]).fetchone()
    return json.loads(info[0])["sources"][0]


def _unnamed(d, tmp_path) -> list:
    """Copies of the split's files whose run records name no run: --run-id names it."""
    out = []
    for name in ("server.jsonl", "client.jsonl"):
        first, rest = (d / name).read_text().split("\n", 1)
        record = json.loads(first)
        del record["run_id"]
        (tmp_path / name).write_text(json.dumps(record) + "\n" + rest)
        out.append(tmp_path / name)
    return out


@pytest.mark.long
def test_a_clock_offset_holds_for_the_runs_it_was_given_for(split, tmp_path):
    """Given for a file already ingested, it re-aligns that file's run; another run loading the
    same path estimates its own; re-loading the file without the option forgets it."""
    files = _unnamed(split[0], tmp_path)
    d = tmp_path
    con = store.connect(tmp_path / "o.duckdb")
    ingest_paths(con, files, run_id="a")
    estimated = _source(con, "a")["offset_s"]
    assert _source(con, "a")["status"] != "override"
    given = estimated + 0.25
    results = ingest_paths(con, files, run_id="a", clock_offsets=(f"client.jsonl={given!r}",))
    assert [r.status for r in results] == ["unchanged", "unchanged"]
    assert results[1].run_ids == ["a"]  # its run was aligned again: the ingest output says how
    src = _source(con, "a")
    assert src["status"] == "override" and src["offset_s"] == pytest.approx(given)
    ingest_paths(con, files, run_id="b")  # the same files as another run: its offset is its own
    assert _source(con, "b")["status"] != "override"
    assert _source(con, "b")["offset_s"] == pytest.approx(estimated, abs=1e-6)
    assert _source(con, "a")["offset_s"] == pytest.approx(given)
    ingest_paths(con, [d / "client.jsonl"], run_id="a", replace=True)
    assert _source(con, "a")["status"] != "override"
    assert _source(con, "a")["offset_s"] == pytest.approx(estimated, abs=1e-6)
    assert con.execute("select count(*) from clock_overrides").fetchone()[0] == 0


@pytest.mark.long
def test_a_clock_offset_given_for_a_new_run_leaves_the_other_runs_of_the_file_alone(split, tmp_path):
    """The same files loaded as run b with --clock-offset: run a, which holds the same paths, kept
    its estimated alignment no more; it was re-aligned on b's offset without a word."""
    files = _unnamed(split[0], tmp_path)
    con = store.connect(tmp_path / "n.duckdb")
    ingest_paths(con, files, run_id="a")
    before = _source(con, "a")
    given = before["offset_s"] + 0.25
    results = ingest_paths(con, files, run_id="b", clock_offsets=(f"client.jsonl={given!r}",))
    assert [r.run_ids for r in results] == [["b"], ["b"]]
    assert _source(con, "b")["status"] == "override" and _source(con, "b")["offset_s"] == pytest.approx(given)
    after = _source(con, "a")
    assert after["status"] == before["status"] != "override"
    assert after["offset_s"] == pytest.approx(before["offset_s"], abs=1e-9)
    assert con.execute("select run_id from clock_overrides").fetchall() == [("b",)]
    # given again for b's unchanged files: still b's alone
    ingest_paths(con, files, run_id="b", clock_offsets=(f"client.jsonl={given + 0.1!r}",))
    assert con.execute("select run_id, offset_s from clock_overrides").fetchall() == [("b", pytest.approx(given + 0.1))]
    assert _source(con, "a")["offset_s"] == pytest.approx(before["offset_s"], abs=1e-9)


def test_a_store_from_before_per_run_offsets_keeps_each_offset_for_its_files_runs(split, tmp_path):
    import duckdb

    files = _unnamed(split[0], tmp_path)
    d = tmp_path
    con = store.connect(tmp_path / "old.duckdb")
    ingest_paths(con, files, run_id="a")
    con.execute("drop table clock_overrides")
    con.execute("create table clock_overrides (path varchar, offset_s double)")  # the old schema
    con.execute("insert into clock_overrides values (?, 5.0)", [str(d / "client.jsonl")])
    con.close()
    con = store.connect(tmp_path / "old.duckdb")
    assert con.execute("select path, offset_s, run_id from clock_overrides").fetchall() == [
        (str(d / "client.jsonl"), 5.0, "a")
    ]
    con.close()
    assert (
        duckdb.connect(str(tmp_path / "old.duckdb")).execute("select count(*) from clock_overrides").fetchone()[0] == 1
    )
