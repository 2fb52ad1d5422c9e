"""Several clients of one run: the real `vllm bench` recordings of fixtures/vllm and fixtures/vllm_queue
dealt out into two or three client files (as client processes on one host would have sent them, each
file with its own perf_counter origin), ingested with the server log, give the run that the whole
bench file gives: every request at the same times, the same inferred queueing, the same metrics.
Alone, no client's requests match the server's batch sizes (the joint alignment is what makes this
work), and clients of two different runs are not joined."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline import store
from pipeline.cli import run_captured
from pipeline.ingest import align, align_joint, ingest_paths

FIX = Path(__file__).resolve().parents[2] / "fixtures"
PAIRS = {"vllm": FIX / "vllm", "vllm_queue": FIX / "vllm_queue"}
TIMES = ("t_arrival", "t_scheduled", "t_first_token", "t_finish")


def _deal(rec: Path, tmp: Path, k: int, seed: int) -> tuple[list[Path], list[np.ndarray]]:
    """The bench file's entries dealt at random to ``k`` client files; returns the files and each
    one's original entry numbers (in its own order)."""
    doc = json.loads((rec / "bench.json").read_text())
    n = len(doc["ttfts"])
    owner = np.random.default_rng(seed).integers(0, k, n)
    owner[:k] = np.arange(k)  # no client is empty
    files, picks = [], []
    for j in range(k):
        idx = np.flatnonzero(owner == j)
        part = dict(doc)
        for key, v in doc.items():  # every per-request array (start_times, ttfts, itls, queue_times, ...)
            if isinstance(v, list) and len(v) == n:
                part[key] = [v[i] for i in idx]
        part["num_prompts"] = part["completed"] = len(idx)
        path = tmp / f"client{j}.json"
        path.write_text(json.dumps(part))
        files.append(path)
        picks.append(idx)
    return files, picks


def _ingest(db: Path, paths: list[Path], run: str) -> None:
    con = store.connect(db)
    try:
        ingest_paths(con, paths, run_id=run)
        store.build_derived(con)
    finally:
        con.close()


def _times(con, run: str) -> dict[str, dict[str, float]]:
    rows = con.execute(
        f"select req_id, {', '.join(TIMES)} from requests where run_id = ? order by req_id", [run]
    ).fetchall()
    return {r[0]: dict(zip(TIMES, r[1:])) for r in rows}


@pytest.mark.parametrize("name", list(PAIRS))
@pytest.mark.parametrize("k, seed", [(2, 0), (3, 1)])
@pytest.mark.parametrize("log", ["server.log", "server_epoch.log"])
@pytest.mark.long
def test_clients_of_one_run_align_as_the_whole_bench(tmp_path, name, k, seed, log):
    rec = PAIRS[name]
    files, picks = _deal(rec, tmp_path, k, seed)
    db = tmp_path / "s.duckdb"
    _ingest(db, [rec / log, rec / "bench.json"], "whole")
    _ingest(db, [rec / log, *files], "parts")
    con = store.connect(db)
    meta = json.loads(con.execute("select meta from runs where run_id = 'parts'").fetchone()[0])["clock_alignment"]
    assert meta["status"] == "aligned" and len(meta["sources"]) == k
    assert all(s["status"] == "aligned" and s["method"].startswith("together with") for s in meta["sources"])
    # the ingest line says so: its match figures are those of the clients together
    lines = [text for _, text in align.describe(con, ["parts"])]
    names = [f.name for f in files]
    assert len(lines) == k and all(
        f"{n} aligned with {log}" in t and f", together with {', '.join(m for m in names if m != n)}" in t
        for n, t in zip(names, lines)
    ), lines
    whole, parts = _times(con, "whole"), _times(con, "parts")
    assert len(parts) == len(whole)
    for j, idx in enumerate(picks):  # the first client keeps its entry numbers, the others are named after the file
        for m, orig in enumerate(idx):
            rid = str(m) if j == 0 else f"client{j}.json#{m}"
            for col in TIMES:
                a, b = parts[rid][col], whole[str(orig)][col]
                assert (a is None) == (b is None), (rid, col)
                if a is not None:
                    assert a == pytest.approx(b, abs=1e-6), (rid, col)
    cols = "ttft_ms, tpot_ms, e2e_ms, queue_ms"
    q = f"select {cols} from request_latency where run_id = ? order by ttft_ms, e2e_ms"
    got, want = con.execute(q, ["parts"]).fetchnumpy(), con.execute(q, ["whole"]).fetchnumpy()
    for c in ("ttft_ms", "tpot_ms", "e2e_ms", "queue_ms"):
        np.testing.assert_allclose(np.ma.filled(got[c], np.nan), np.ma.filled(want[c], np.nan), atol=1e-3)
    got_steps = con.execute("select t_end from iterations where run_id = 'parts' order by iter").fetchnumpy()
    want_steps = con.execute("select t_end from iterations where run_id = 'whole' order by iter").fetchnumpy()
    np.testing.assert_allclose(got_steps["t_end"], want_steps["t_end"], atol=1e-6)  # steps re-timed alike


def test_alone_no_client_aligns(tmp_path, monkeypatch):
    """What the joint alignment fixes: each half of the load, matched alone, is refused."""
    rec = PAIRS["vllm"]
    files, _ = _deal(rec, tmp_path, 2, 0)
    monkeypatch.setattr(align_joint, "align_joint", lambda *a, **k: {})
    _ingest(tmp_path / "s.duckdb", [rec / "server.log", *files], "parts")
    con = store.connect(tmp_path / "s.duckdb")
    meta = json.loads(con.execute("select meta from runs where run_id = 'parts'").fetchone()[0])["clock_alignment"]
    assert meta["status"] == "failed"


@pytest.mark.long
def test_clients_ingested_one_by_one(tmp_path):
    """A client file added by a later ingest re-aligns the run with both (the store keeps the transforms)."""
    rec = PAIRS["vllm"]
    files, _ = _deal(rec, tmp_path, 2, 0)
    db = tmp_path / "s.duckdb"
    _ingest(db, [rec / "server.log", rec / "bench.json"], "whole")
    _ingest(db, [rec / "server.log", files[0]], "parts")
    _ingest(db, [files[1]], "parts")
    con = store.connect(db)
    q = "select ttft_ms, e2e_ms, queue_ms from request_latency where run_id = ? order by ttft_ms, e2e_ms"
    got, want = con.execute(q, ["parts"]).fetchnumpy(), con.execute(q, ["whole"]).fetchnumpy()
    for c in ("ttft_ms", "e2e_ms", "queue_ms"):
        np.testing.assert_allclose(np.ma.filled(got[c], np.nan), np.ma.filled(want[c], np.nan), atol=1e-3)


def test_clients_of_two_runs_are_not_joined(tmp_path):
    """The bench files of two recordings (perf_counter spans far apart) are aligned each on its own."""
    other = tmp_path / "other.json"
    other.write_text((PAIRS["vllm_queue"] / "bench.json").read_text())
    _ingest(tmp_path / "s.duckdb", [PAIRS["vllm"] / "server.log", PAIRS["vllm"] / "bench.json", other], "mix")
    con = store.connect(tmp_path / "s.duckdb")
    meta = json.loads(con.execute("select meta from runs where run_id = 'mix'").fetchone()[0])["clock_alignment"]
    assert not any("together" in (s.get("method") or "") for s in meta["sources"])
    by = {Path(s["path"]).name: s for s in meta["sources"]}
    assert by["other.json"]["status"] == "failed"


@pytest.mark.long
def test_second_client_ids_are_named_after_its_file(tmp_path):
    rec = PAIRS["vllm"]
    files, picks = _deal(rec, tmp_path, 2, 0)
    db = tmp_path / "s.duckdb"
    code, out = run_captured("ingest", rec / "server.log", *files, "--run-id", "r", "--db", db)
    assert code == 0, out
    assert f"{min(map(len, picks))} of them are already ids of another file of the run" in out
    assert "client1.json#0" in out and "0 rejected" in out and "rejected;" not in out.replace("0 rejected;", "")
    con = store.connect(db)
    ids = {r[0] for r in con.execute("select req_id from requests where run_id = 'r'").fetchall()}
    assert ids == {str(m) for m in range(len(picks[0]))} | {f"client1.json#{m}" for m in range(len(picks[1]))}
    # one client alone, or a client of another run: ids stay entry numbers
    code, out = run_captured("ingest", files[1], "--run-id", "alone", "--db", db)
    assert code == 0 and "already ids" not in out
    n = con.execute("select count(*) from requests where run_id = 'alone' and req_id not like '%#%'").fetchone()[0]
    assert n == len(picks[1])


@pytest.mark.long
def test_unix_clients_on_the_servers_clock_are_left_alone(tmp_path):
    """Two clients with Unix times that agree with the server's (simulated): aligned together, found
    on the same clock, and not moved: every time equals the single-file run's."""
    from pipeline.sim.split import scenario, write_split
    from pipeline.sim.writer import write_trace

    result, pol, model, noise = scenario("light", 3)
    origin = 1.79e9
    write_trace(result, tmp_path / "single.jsonl", "single", pol, model, noise)
    write_split(
        result,
        tmp_path / "server.jsonl",
        tmp_path / "client.jsonl",
        "split",
        pol,
        model,
        noise,
        server_origin_s=origin,
        client_origin_s=origin,
    )
    lines = (tmp_path / "client.jsonl").read_text().splitlines()
    head = json.dumps({**json.loads(lines[0]), "clock": "unix"})
    files = []
    for j in range(2):
        f = tmp_path / f"client{j}.jsonl"
        f.write_text("\n".join([head, *lines[1 + j :: 2]]) + "\n")
        files.append(f)
    db = tmp_path / "s.duckdb"
    _ingest(db, [tmp_path / "single.jsonl"], "single")
    _ingest(db, [tmp_path / "server.jsonl", *files], "split")
    con = store.connect(db)
    meta = json.loads(con.execute("select meta from runs where run_id = 'split'").fetchone()[0])["clock_alignment"]
    assert meta["status"] == "same clock"
    assert all(s["method"].startswith("together with") and not s["applied"] for s in meta["sources"])
    q = "select req_id, t_arrival, t_first_token, t_finish from requests where run_id = ? order by req_id"
    got, want = con.execute(q, ["split"]).fetchall(), con.execute(q, ["single"]).fetchall()
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert g[0] == w[0]
        for a, b in zip(g[1:], w[1:]):
            assert (a is None and b is None) or a == pytest.approx(b + origin, abs=1e-6)


def test_the_same_result_saved_twice_is_not_a_second_client(tmp_path):
    """A copy of a bench result (same entries, another label) is rejected as duplicates, not counted twice."""
    doc = json.loads((PAIRS["vllm"] / "bench.json").read_text())
    (tmp_path / "copy.json").write_text(json.dumps({**doc, "label": "again"}))
    db = tmp_path / "s.duckdb"
    code, out = run_captured(
        "ingest", PAIRS["vllm"] / "bench.json", tmp_path / "copy.json", "--run-id", "r", "--db", db
    )
    assert code == 2 and "already ids" not in out and "all 64 records rejected" in out
    con = store.connect(db)
    assert con.execute("select count(*) from requests").fetchone()[0] == 64


def test_clients_with_one_file_name_get_distinct_ids(tmp_path):
    """Three clients' bench.json from three folders: the third is not named like the second."""
    doc = json.loads((PAIRS["vllm"] / "bench.json").read_text())
    n = len(doc["ttfts"])
    paths = []
    for j, d in enumerate("abc"):
        part = {
            k: ([x for i, x in enumerate(v) if i % 3 == j] if isinstance(v, list) and len(v) == n else v)
            for k, v in doc.items()
        }
        (tmp_path / d).mkdir()
        (tmp_path / d / "bench.json").write_text(json.dumps(part))
        paths.append(tmp_path / d / "bench.json")
    db = tmp_path / "s.duckdb"
    code, out = run_captured("ingest", *paths, "--run-id", "r", "--db", db)
    assert code == 0, out
    con = store.connect(db)
    assert con.execute("select count(*), count(distinct req_id) from requests").fetchone() == (n, n)
