"""The Parquet lake keeps the store's rules: a run ingested into a lake (even file by file, in separate
ingests, with clock alignment between them) reads back with the same numbers as the same files
ingested into a store, every read command gives the same answer from --lake as from --db, ingest is
idempotent by content, --replace replaces, rejects keep their line numbers, and a killed writer leaves
no half-written run visible."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import store
from pipeline.cli import run_captured
from pipeline.lake import lake_runs, open_runs, part_name

REPO = Path(__file__).resolve().parents[2]
VLLM = REPO / "fixtures" / "vllm"
QUEUE = REPO / "fixtures" / "vllm_queue"


def _ok(*args) -> str:
    code, out = run_captured(*args)
    assert code == 0, out
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two multi-file vLLM runs: in a store (one ingest each), and in a lake one file per ingest."""
    d = tmp_path_factory.mktemp("lake")
    db, lake = d / "s.duckdb", d / "lake"
    for run, src in (("v", VLLM), ("q", QUEUE)):
        _ok("ingest", src / "server.log", src / "bench.json", "--run-id", run, "--db", db)
        _ok("ingest", src / "server.log", "--run-id", run, "--lake", lake)
        out = _ok("ingest", src / "bench.json", "--run-id", run, "--lake", lake)
        assert "aligned with server.log" in out  # aligned across the two ingests
    return db, lake, d


@pytest.mark.parametrize(
    "args",
    [
        ("summary", "v", "--json"),
        ("summary", "q"),
        ("runs", "--json"),
        ("fit", "v", "--json"),
        ("explain", "q", "--json"),
        ("rejects", "--json"),
        ("audit", "v", "--slo", REPO / "examples" / "slo.toml", "--json"),
    ],
)
@pytest.mark.long
def test_read_commands_same_from_lake_and_store(pair, args):
    db, lake, _ = pair
    code_db, out_db = run_captured(*args, "--db", db)
    code_lake, out_lake = run_captured(*args, "--lake", lake)
    assert code_db in (0, 1), out_db
    if "--json" in args:  # parsed: key order inside the tail section follows row order (not a number)
        out_db, out_lake = json.loads(out_db), json.loads(out_lake)
    assert (code_lake, out_lake) == (code_db, out_db)


def test_check_from_lake_checks_a_fitted_run(pair):
    db, lake, _ = pair
    _ok("fit", "q", "--db", db)  # a lake fits in memory; the store's stored fit makes the two alike
    out = json.loads(_ok("check", "q", "--json", "--lake", lake))
    assert out == json.loads(_ok("check", "q", "--json", "--db", db))
    assert not any(r["skipped"] for r in out if r["name"] == "attribution_sums")


def _close(a, b, rel: float = 1e-12) -> bool:
    """Equal JSON values, floats within ``rel`` of each other."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= rel * max(abs(a), abs(b))
    return a == b


def test_compare_report_and_perfetto_from_lake(pair):
    db, lake, d = pair
    code1, o1 = run_captured("compare", "v", "q", "--db", db, "--out", d / "c1", "--json", "--resamples", "200")
    code2, o2 = run_captured("compare", "v", "q", "--lake", lake, "--out", d / "c2", "--json", "--resamples", "200")
    # stdout's JSON; a failed comparison adds its `Error:` line on stderr after it
    j1, j2 = (json.JSONDecoder().raw_decode(o)[0] for o in (o1, o2))
    j1.pop("html"), j2.pop("html")
    # equal, floats to 1e-12: on the floor DuckDB (1.5.6) a bootstrap bound differed in its last bit
    assert code1 == code2 and _close(j1, j2), (j1, j2)
    _ok("report", "q", "--db", db, "--out", d / "r1")
    _ok("report", "q", "--lake", lake, "--out", d / "r2")
    assert json.loads((d / "r1" / "summary.json").read_text()) == json.loads((d / "r2" / "summary.json").read_text())
    _ok("export", "v", "--db", db, "--perfetto", d / "p1.json")
    _ok("export", "v", "--lake", lake, "--perfetto", d / "p2.json")
    assert json.loads((d / "p1.json").read_text()) == json.loads((d / "p2.json").read_text())


def test_db_and_lake_together_is_a_usage_error(pair):
    db, lake, _ = pair
    code, out = run_captured("summary", "v", "--db", db, "--lake", lake)
    assert code == 2 and "--db and --lake" in out


def _counts(lake: Path) -> dict[str, int]:
    con = open_runs(lake)
    return {t: store.scalar(con, f"select count(*) from {t}") for t in ("ingests", "iterations", "requests", "tokens")}


@pytest.mark.long
def test_idempotent_and_replace(tmp_path):
    lake = tmp_path / "lake"
    src = tmp_path / "tiny.jsonl"
    shutil.copy(REPO / "fixtures" / "canonical" / "tiny.jsonl", src)
    _ok("ingest", src, "--lake", lake)
    first = _counts(lake)
    out = _ok("ingest", src, "--lake", lake)
    assert "unchanged" in out and _counts(lake) == first
    con = open_runs(lake)
    old_id = store.scalar(con, "select ingest_id from ingests")
    out = _ok("ingest", src, "--lake", lake, "--replace")
    assert "replaced" in out
    con = open_runs(lake)
    assert _counts(lake) == first and store.scalar(con, "select ingest_id from ingests") != old_id
    # same path, new content: the old rows go (a --replace by path), the new ones count
    lines = src.read_text().splitlines(keepends=True)
    reqs = [ln for ln in lines if '"req_id"' in ln and '"t_arrival"' in ln]
    src.write_text("".join(ln for ln in lines if ln not in reqs[:1]))
    _ok("ingest", src, "--lake", lake, "--replace")
    assert _counts(lake)["requests"] == first["requests"] - 1
    assert _counts(lake)["ingests"] == 1


def test_rejects_keep_line_numbers(tmp_path):
    src = tmp_path / "bad.jsonl"
    lines = (REPO / "fixtures" / "canonical" / "tiny.jsonl").read_text().splitlines()
    lines[3] = '{"type": "iteration", "iter": "not a number"'  # broken JSON on line 4
    src.write_text("\n".join(lines) + "\n")
    _ok("ingest", src, "--db", tmp_path / "s.duckdb")
    _ok("ingest", src, "--lake", tmp_path / "lake")
    a = json.loads(_ok("rejects", "--json", "--db", tmp_path / "s.duckdb"))
    b = json.loads(_ok("rejects", "--json", "--lake", tmp_path / "lake"))
    assert a == b and a["total"] == 1 and a["rejects"][0]["line_no"] == 4


def test_hostile_run_ids_round_trip(tmp_path):
    first, rest = (REPO / "fixtures" / "canonical" / "tiny.jsonl").read_text().split("\n", 1)
    names = ["a/b", "..", 'it\'s "q" %2F', "ü x=1", "123"]
    for i, name in enumerate(names):
        (tmp_path / f"f{i}.jsonl").write_text(json.dumps({**json.loads(first), "run_id": name}) + "\n" + rest)
        _ok("ingest", tmp_path / f"f{i}.jsonl", "--db", tmp_path / "s.duckdb")
    con = store.connect(tmp_path / "s.duckdb")
    store.build_derived(con)
    runs = store.known_runs(con)
    assert sorted(runs) == sorted(names)
    from pipeline.lake import export_runs

    export_runs(con, runs, tmp_path / "lake")
    assert lake_runs(tmp_path / "lake") == sorted(names)
    assert sorted(p.name for p in (tmp_path / "lake" / "iterations").iterdir()) == sorted(map(part_name, names))
    assert not any(p.name.startswith(".") for p in (tmp_path / "lake").iterdir() if p.name != ".lock")
    for name in names:  # parsed: the order of a summary's tail parts follows row order, which may differ
        assert json.loads(_ok("summary", name, "--json", "--lake", tmp_path / "lake")) == json.loads(
            _ok("summary", name, "--json", "--db", tmp_path / "s.duckdb")
        )


# A child that ingests bench.json into the lake and kills itself at a chosen point of the write.
KILLER = r"""
import os, signal, sys
from pathlib import Path
import pipeline.lake as lk
where = sys.argv[1]
if where == "staged":      # the new partitions written, no commit journal yet
    real = os.fsync
    os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
else:                      # the journal written, some partitions already swapped in
    real_rename, n = Path.rename, [0]
    def rename(self, target):
        if ".staging-" in str(self) and "/.old" not in str(target):
            n[0] += 1
            if n[0] == 3:
                os.kill(os.getpid(), signal.SIGKILL)
        return real_rename(self, target)
    Path.rename = rename
from pipeline.cli import main
main(["ingest", sys.argv[2], "--run-id", "v", "--lake", sys.argv[3]])
"""


@pytest.mark.slow  # a killed subprocess per case; CI runs it with -m slow (the default run stays near 5 minutes)
@pytest.mark.parametrize("where", ["staged", "swapping"])
def test_killed_ingest_leaves_no_partial_run(pair, tmp_path, where):
    db, _, _ = pair
    lake = tmp_path / "lake"
    _ok("ingest", VLLM / "server.log", "--run-id", "v", "--lake", lake)
    before = {p.relative_to(lake): p.read_bytes() for p in lake.rglob("*.parquet")}
    child = subprocess.run(
        [sys.executable, "-c", KILLER, where, str(VLLM / "bench.json"), str(lake)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert child.returncode == -9, child.stderr
    visible = {
        p.relative_to(lake): p.read_bytes()
        for p in lake.rglob("*.parquet")
        if not any(s.startswith(".") for s in p.relative_to(lake).parts)
    }
    if where == "staged":
        # nothing of the killed ingest is visible: the lake holds exactly what it held
        assert visible == before
        assert lake_runs(lake) == ["v"] and not (lake / "requests").exists()
        _ok("ingest", VLLM / "bench.json", "--run-id", "v", "--lake", lake)  # the next writer: clean, complete
        assert not list(lake.glob(".staging-*"))
    else:
        assert list(lake.glob(".commit-*.json"))  # killed mid-swap: the journal says what to finish
    # either way the run now reads whole: the same as both files ingested into a store
    assert json.loads(_ok("summary", "v", "--json", "--lake", lake)) == json.loads(
        _ok("summary", "v", "--json", "--db", db)
    )
    assert not list(lake.glob(".commit-*.json"))


def test_runs_from_two_stores_keep_both_ingest_records(tmp_path):
    """Two stores number their ingests from 1 alike: both files' records (and rejects) stay in the lake."""
    first, rest = (REPO / "fixtures" / "canonical" / "tiny.jsonl").read_text().split("\n", 1)
    for name in ("x", "y"):
        lines = (json.dumps({**json.loads(first), "run_id": name}) + "\n" + rest).splitlines()
        lines[2] = "{broken " + name
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        _ok("ingest", tmp_path / f"{name}.jsonl", "--db", tmp_path / f"{name}.duckdb")
        _ok("export", name, "--db", tmp_path / f"{name}.duckdb", "--lake", tmp_path / "lake")
    con = open_runs(tmp_path / "lake")
    got = con.execute("select ingest_id, path from ingests order by path").fetchall()
    assert [p for _, p in got] == [str(tmp_path / "x.jsonl"), str(tmp_path / "y.jsonl")]
    assert got[0][0] == 1 and got[1][0] > 1  # the second store's id 1 names another file in the lake
    # every row of y came with its ingest's new id
    for table in ("iterations", "requests", "token_lists", "rejects", "runs"):
        ids = con.execute(f"select distinct ingest_id from {table} where ingest_id is not null order by 1").fetchall()
        assert ids == [(got[0][0],), (got[1][0],)], table
    got = json.loads(_ok("rejects", "--json", "--lake", tmp_path / "lake"))
    assert got["total"] == 2 and {r["line_no"] for r in got["rejects"]} == {3}
    # exporting y again keeps one record per file and the same counts
    before = _counts(tmp_path / "lake")
    _ok("export", "y", "--db", tmp_path / "y.duckdb", "--lake", tmp_path / "lake")
    assert _counts(tmp_path / "lake") == before


@pytest.mark.long
def test_replace_after_export_from_two_stores_keeps_one_copy(tmp_path):
    """A --replace in a lake whose runs came from two stores replaces the file's rows, not doubles them."""
    lake = tmp_path / "lake"
    for name, seed in (("a", 1), ("b", 2)):
        _ok("simulate", "--out", tmp_path / f"{name}.jsonl", "--requests", "50", "--seed", str(seed), "--run-id", name)
        _ok("ingest", tmp_path / f"{name}.jsonl", "--db", tmp_path / f"{name}.duckdb")
        _ok("export", name, "--db", tmp_path / f"{name}.duckdb", "--lake", lake)
    want = {r: store.scalar(open_runs(lake, [r]), "select count(*) from requests") for r in ("a", "b")}
    assert want == {"a": 50, "b": 50}
    out = _ok("ingest", tmp_path / "b.jsonl", "--lake", lake, "--replace")
    assert "replaced" in out
    con = open_runs(lake)
    got = dict(con.execute("select run_id, count(*) from requests group by 1").fetchall())
    assert got == want
    assert store.scalar(con, "select count(*) from ingests") == 2
    # a second --replace finds the same single copy
    _ok("ingest", tmp_path / "b.jsonl", "--lake", lake, "--replace")
    con = open_runs(lake)
    assert dict(con.execute("select run_id, count(*) from requests group by 1").fetchall()) == want


@pytest.mark.long
def test_replace_in_a_lake_written_with_clashing_ids(tmp_path, monkeypatch):
    """A lake written before export made ids unique (two files, one id): --replace still keeps one copy."""
    import pipeline.lake as lk

    def old_writer(con, run_ids, lake):  # no new ids: what an earlier tracelat wrote
        con.execute("create or replace temp table _lake_ids (old_id bigint, new_id bigint)")

    lake = tmp_path / "lake"
    with monkeypatch.context() as m:
        m.setattr(lk, "_map_ingest_ids", old_writer)
        for name, seed in (("a", 1), ("b", 2)):
            _ok("simulate", "--out", tmp_path / f"{name}.jsonl", "--requests", "30", "--seed", str(seed))
            _ok("ingest", tmp_path / f"{name}.jsonl", "--db", tmp_path / f"{name}.duckdb")
            _ok("export", name, "--db", tmp_path / f"{name}.duckdb", "--lake", lake)
        assert [r[0] for r in open_runs(lake).execute("select ingest_id from ingests").fetchall()] == [1, 1]
    _ok("ingest", tmp_path / "b.jsonl", "--lake", lake, "--replace")
    con = open_runs(lake)
    assert dict(con.execute("select run_id, count(*) from requests group by 1").fetchall()) == {"a": 30, "b": 30}
    assert sorted(r[0] for r in con.execute("select path from ingests").fetchall()) == [
        str(tmp_path / "a.jsonl"),
        str(tmp_path / "b.jsonl"),
    ]


@pytest.mark.parametrize(
    "args",
    [
        ("summary", "nosuch"),
        ("audit", "nosuch", "--slo", REPO / "examples" / "slo.toml"),
        ("compare", "nosuch", "v"),
        ("compare", "v", "nosuch"),
        ("report", "nosuch"),
    ],
)
def test_unknown_run_names_the_lakes_runs(pair, args):
    _, lake, _ = pair
    code, out = run_captured(*args, "--lake", lake)
    assert code == 2, out
    assert f"run 'nosuch' is not in lake {lake} (known runs: q, v)" in out
    assert f"tracelat runs --lake {lake}" in out


def test_second_client_in_a_later_lake_ingest_is_refused_then_loads_together(tmp_path):
    """Lake ingest checks new files against each other only: a repeated request id across ingests is
    refused (the lake unchanged), and ingesting the run's files together names the ids apart."""
    doc = json.loads((VLLM / "bench.json").read_text())
    n = len(doc["ttfts"])
    for j in range(2):
        part = {
            k: ([x for i, x in enumerate(v) if i % 2 == j] if isinstance(v, list) and len(v) == n else v)
            for k, v in doc.items()
        }
        (tmp_path / f"client{j}.json").write_text(json.dumps(part))
    lake = tmp_path / "lake"
    _ok("ingest", tmp_path / "client0.json", "--run-id", "r", "--lake", lake)
    code, out = run_captured("ingest", tmp_path / "client1.json", "--run-id", "r", "--lake", lake)
    assert code == 2 and "both hold request id" in out and "--replace" in out
    assert store.scalar(open_runs(lake), "select count(*) from requests") == n // 2
    _ok("ingest", tmp_path / "client0.json", tmp_path / "client1.json", "--run-id", "r", "--lake", lake, "--replace")
    con = open_runs(lake)
    assert con.execute("select count(*), count(distinct req_id) from requests").fetchone() == (n, n)


def test_a_file_split_over_runs_keeps_one_id_when_exported_run_by_run(tmp_path):
    """A file of two runs exported one run at a time, into a lake where its store id names another file."""
    src = (REPO / "fixtures" / "canonical" / "tiny.jsonl").read_text().splitlines()

    def as_run(name):
        return [json.dumps({**json.loads(src[0]), "run_id": name}), *src[1:]]

    (tmp_path / "other.jsonl").write_text("\n".join(as_run("o")) + "\n")
    (tmp_path / "two.jsonl").write_text("\n".join([*as_run("c"), *as_run("e"), "{broken"]) + "\n")
    lake = tmp_path / "lake"
    _ok("ingest", tmp_path / "other.jsonl", "--db", tmp_path / "o.duckdb")
    _ok("export", "o", "--db", tmp_path / "o.duckdb", "--lake", lake)
    _ok("ingest", tmp_path / "two.jsonl", "--db", tmp_path / "t.duckdb")
    _ok("export", "c", "--db", tmp_path / "t.duckdb", "--lake", lake)
    _ok("export", "e", "--db", tmp_path / "t.duckdb", "--lake", lake)
    con = open_runs(lake)
    ids = con.execute("select path, list(distinct ingest_id) from ingests group by path").fetchall()
    assert sorted(len(v) for _, v in ids) == [1, 1] and ids[0][1] != ids[1][1]
    assert json.loads(_ok("rejects", "--json", "--lake", lake))["total"] == 1


def test_the_export_line_counts_the_runs_once(tmp_path):
    tiny = REPO / "fixtures" / "canonical" / "tiny.jsonl"
    db = tmp_path / "s.duckdb"
    _ok("ingest", tiny, "--db", db)
    out = _ok("export", "tiny", "tiny", "--db", db, "--lake", tmp_path / "lake")
    iterations = store.scalar(open_runs(tmp_path / "lake"), "select count(*) from iterations")
    assert out.strip() == f"{tmp_path / 'lake'}: 1 run: 1 run_records, {iterations} iterations, 3 requests, " + (
        "2 token_lists, 1 ingests"
    )
    # exported again, the run replaces what the lake held of it: said on stderr
    code, out = run_captured("export", "tiny", "--db", db, "--lake", tmp_path / "lake")
    assert code == 0 and f"replaced in {tmp_path / 'lake'}: 'tiny'" in out, out


def _two_run_lake(tmp_path, ids=("a", "b")) -> Path:
    lake = tmp_path / "lake"
    first, rest = (REPO / "fixtures" / "canonical" / "tiny.jsonl").read_text().split("\n", 1)
    for i, rid in enumerate(ids):
        head = json.loads(first)
        head["run_id"] = rid
        (tmp_path / f"{i}.jsonl").write_text(json.dumps(head) + "\n" + rest)
        _ok("ingest", tmp_path / f"{i}.jsonl", "--lake", lake)
    return lake


@pytest.mark.long
def test_fleet_table_tells_long_run_ids_apart(tmp_path):
    """Ids were cut to 31 characters: hourly runs named as docs/scale.md suggests all read
    "llama8b-prod-us-east-1/replica-"."""
    ids = [f"llama8b-prod-us-east-1/replica-017/2026-12-01T{h}" for h in (13, 14)]
    lake = _two_run_lake(tmp_path, ids)
    out = _ok("fleet", lake)
    rows = [line.split()[0] for line in out.splitlines() if line.startswith("llama8b")]
    assert sorted(rows) == ids, out
    from pipeline.commands.fleet import _short

    assert _short("x" * 70 + "T13", 64) != _short("x" * 70 + "T14", 64) and len(_short("x" * 70 + "T13", 64)) == 64


@pytest.mark.long
def test_files_a_writer_did_not_write_are_not_read(tmp_path):
    """Every file under a table was read: a copy of a run's file beside it ("data_0 (1).parquet")
    doubled the run (170 TTFT values for 85), a macOS "._" file or a file in a stray folder without a
    run_id column stopped the fleet (an internal error) or listed a run "None"."""
    lake = _two_run_lake(tmp_path)
    before = json.loads(_ok("summary", "a", "--lake", lake, "--json"))
    for table in ("iterations", "requests", "token_lists", "runs"):
        d = lake / table / part_name("a")
        if (d / "data_0.parquet").exists():
            shutil.copy(d / "data_0.parquet", d / "data_0 (1).parquet")
            (d / "._data_0.parquet").write_bytes(os.urandom(4096))
    (lake / "runs" / "misc").mkdir()
    con = store.scratch()
    con.execute(
        f"copy (select 1 as a) to {store.quote_literal(str(lake / 'runs' / 'misc' / 'x.parquet'))} (format parquet)"
    )
    con.close()
    assert lake_runs(lake) == ["a", "b"]
    after = json.loads(_ok("summary", "a", "--lake", lake, "--json"))
    assert after["ttft_ms"]["count"] == before["ttft_ms"]["count"] and after["iterations"] == before["iterations"]
    code, out = run_captured("fleet", lake, "--json")
    assert code == 0, out
    assert sorted(r["run_id"] for r in json.loads(out)["runs"]) == ["a", "b"]


@pytest.mark.long
def test_a_run_without_its_runs_folder_is_still_listed(tmp_path):
    lake = _two_run_lake(tmp_path)
    shutil.rmtree(lake / "runs" / part_name("b"))
    assert lake_runs(lake) == ["a", "b"]  # its requests and steps are in the lake: not dropped unseen
    code, out = run_captured("fleet", lake)  # and the fleet says what is wrong with it
    assert code == 2 and "run 'b' has requests or steps but no run record (runs/run_id=b/data_0.parquet" in out, out
    assert "--replace" in out
    _ok("ingest", tmp_path / "1.jsonl", "--lake", lake, "--replace")  # what it says to do works
    assert run_captured("fleet", lake)[0] == 0


def test_an_unreadable_file_is_a_lake_error_with_the_way_out(tmp_path):
    lake = _two_run_lake(tmp_path)
    f = lake / "iterations" / part_name("b") / "data_0.parquet"
    f.write_bytes(f.read_bytes()[:200])
    code, out = run_captured("fleet", lake)
    assert code == 2, out
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"Error: lake {lake}: a file cannot be read (") and "--replace" in last, out
    assert "internal error" not in out and "LINE 1" not in out


@pytest.mark.long
def test_a_newer_file_of_a_run_says_how_to_replace_the_run(tmp_path):
    """A newer recording of run a at another path was refused with advice (ingest the files together
    with --replace) that kept the old rows and added the new file's few non-duplicate ones; the same
    path with new content was called two files. Each now gets advice that does what it says."""
    lake = _two_run_lake(tmp_path)
    lines = (tmp_path / "0.jsonl").read_text().splitlines(keepends=True)
    newer = tmp_path / "v2" / "a.jsonl"
    newer.parent.mkdir()
    newer.write_text("".join(x for x in lines if '"req_id"' not in x or '"t_arrival"' not in x) + lines[-1])
    code, out = run_captured("ingest", newer, "--lake", lake)
    assert code == 2 and "If one is a newer recording that replaces the run" in out, out
    cmd = out.split("`tracelat ingest NEWFILE --db new.duckdb && ", 1)[1].split("`", 1)[0]
    assert cmd == "tracelat export a --db new.duckdb --lake DIR", cmd
    db = tmp_path / "new.duckdb"
    _ok("ingest", newer, "--db", db)
    _ok("export", "a", "--db", db, "--lake", lake)
    want = json.loads(_ok("summary", "a", "--db", db, "--json"))
    got = json.loads(_ok("summary", "a", "--lake", lake, "--json"))
    assert got["requests"] == want["requests"] < json.loads(_ok("summary", "b", "--lake", lake, "--json"))["requests"]
    # the same path with other content: it changed, --replace re-loads it
    changed = tmp_path / "1.jsonl"  # run b's file
    changed.write_text("".join(changed.read_text().splitlines(keepends=True)[:-1]))
    code, out = run_captured("ingest", changed, "--lake", lake)
    assert code == 2 and f"{changed} changed since it was written into the lake" in out and "--replace" in out, out


@pytest.mark.long
def test_fleet_says_which_runs_had_lines_rejected(tmp_path):
    """A run with 200 of 201 lines rejected showed in the fleet as a row of "-" and nothing else."""
    lake = _two_run_lake(tmp_path)
    bad = tmp_path / "c.jsonl"
    first, rest = (REPO / "fixtures" / "canonical" / "tiny.jsonl").read_text().split("\n", 1)
    head = json.loads(first)
    head["run_id"] = "c"
    bad.write_text(json.dumps(head) + "\n" + rest + 'garbage\n{"kind": "request"}\n')
    _ok("ingest", bad, "--lake", lake)
    code, out = run_captured("fleet", lake, "--json")
    runs = {r["run_id"]: r for r in json.loads(out)["runs"]}
    assert runs["c"]["warnings"] == [f"{bad}: 2 of 10 lines rejected"] and runs["a"]["warnings"] == [], runs["c"]
    text = _ok("fleet", lake)
    assert f"  c: {bad}: 2 of 10 lines rejected" in text.splitlines(), text
