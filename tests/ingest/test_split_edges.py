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
