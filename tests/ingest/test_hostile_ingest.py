"""Damaged input found by fuzzing: one bad record is a reject, an unreadable document one
clear error (exit 2) within seconds; never an internal error (3) or ``Aborted.`` (130)."""

from __future__ import annotations

import gzip
import importlib.util
import io
import json
import sys
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "fixtures"

_spec = importlib.util.spec_from_file_location("tracelat_fuzz", REPO / "scripts" / "fuzz.py")
fuzz = sys.modules.setdefault("tracelat_fuzz", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(fuzz)


def cli(*args: str) -> tuple[int, str]:
    return fuzz.run_cli([str(a) for a in args])


def rejects(db: Path) -> list[tuple[int, str]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("select line_no, reason from rejects order by line_no").fetchall()
    finally:
        con.close()


def counts(db: Path, table: str) -> int:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(f"select count(*) from {table}").fetchone()[0]
    finally:
        con.close()


def test_genai_perf_deep_nesting_is_refused_fast(tmp_path):
    doc = json.loads((FIX / "genai_perf" / "profile_export.json").read_text())
    text = json.dumps(doc)
    deep = "[" * 970 + "1" + "]" * 970
    f = tmp_path / "profile_export.json"
    f.write_text(text.replace('"timestamp": ', '"timestamp": ' + deep + ', "x": ', 1))
    t0 = time.perf_counter()
    code, out = cli("ingest", f, "--db", tmp_path / "t.duckdb")
    assert time.perf_counter() - t0 < 5
    assert code == 2, out
    assert "nested 975 levels deep" in out and len(out) < 1500
    assert out.count("\n") == 1  # one Error: line


def test_vllm_bench_truncated_gzip_is_an_error_not_aborted(tmp_path):
    z = gzip.compress((FIX / "vllm" / "bench.json").read_bytes())
    f = tmp_path / "bench.json.gz"
    f.write_bytes(z[: len(z) // 2])
    code, out = cli("ingest", f, "--db", tmp_path / "t.duckdb", "--format", "vllm-bench")
    assert code == 2, out
    assert "Aborted" not in out and "truncated" in out


def test_vllm_bench_wrong_types_reject_their_entries(tmp_path):
    doc = json.loads((FIX / "vllm" / "bench.json").read_text())
    n = len(doc["ttfts"])
    doc["ttfts"][2] = "fast"
    doc["itls"][4] = [0.01, "x"]
    doc["input_lens"][6] = {"a": 1}
    doc["itls"][8] = [[1, 2]]  # mixed nesting: Polars cannot even turn these arrays into text
    doc["ttfts"][9] = ["0.1"]
    doc["mean_ttft_ms"] = float("inf")  # run metadata: kept as text, not a crash
    f = tmp_path / "bench.json"
    f.write_text(json.dumps(doc))
    db = tmp_path / "t.duckdb"
    code, out = cli("ingest", f, "--db", db)
    assert code == 0, out
    assert f"{n} read, {n - 5} accepted, 5 rejected" in out
    got = rejects(db)
    assert [r[0] for r in got] == [3, 5, 7, 9, 10]
    assert "ttfts" in got[0][1] and "itls" in got[1][1] and "input_lens" in got[2][1]


def test_trtllm_dict_repr_hazards_reject_one_line(tmp_path):
    lines = (FIX / "trtllm" / "iteration_log.txt").read_text().splitlines()
    bad = {
        2: "{(1, 2): 3, " + lines[1][1:],  # tuple key: json.dumps fails
        3: "{[1]: 2, " + lines[2][1:],  # unhashable key: literal_eval fails
        4: "{{1}: 2, " + lines[3][1:],  # set key
        # a tuple sends the line to literal_eval; its 5000-digit int is too long for json.dumps
        5: "{'t': (1,), 'big': " + "9" * 5000 + ", " + lines[4][1:],
    }
    for no, text in bad.items():
        lines[no - 1] = text
    f = tmp_path / "iteration_log.txt"
    f.write_text("\n".join(lines) + "\n")
    db = tmp_path / "t.duckdb"
    code, out = cli("ingest", f, "--db", db, "--format", "trtllm-iterlog")
    assert code == 0, out
    assert sorted(r[0] for r in rejects(db)) == [2, 3, 4, 5]
    assert counts(db, "iterations") == len(lines) - 4


def test_trtllm_json_array_deep_nesting(tmp_path):
    f = tmp_path / "metrics.json"
    f.write_text("[" * 5000 + "]" * 5000)
    code, out = cli("ingest", f, "--db", tmp_path / "t.duckdb", "--format", "trtllm-iterlog")
    assert code == 2, out
    assert "nested 5000 levels deep" in out


def test_parquet_corrupt_page_is_one_error(tmp_path):
    table = pa.table(
        {"kind": ["request"] * 50, "req_id": [f"r{i}" for i in range(50)], "t_arrival": [float(i) for i in range(50)]}
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="snappy")
    data = bytearray(buf.getvalue())
    for at in range(40, 120, 7):  # inside the first column chunk's pages, not the footer
        data[at] ^= 0xFF
    f = tmp_path / "t.parquet"
    f.write_bytes(bytes(data))
    code, out = cli("ingest", f, "--db", tmp_path / "t.duckdb")
    assert code == 2, out
    assert "Parquet" in out and "internal error" not in out
    assert out.count("\n") == 1


def test_vllm_log_unhashable_non_default_args(tmp_path):
    text = (FIX / "vllm" / "server.log").read_text().splitlines()
    i = next(k for k, line in enumerate(text) if "non-default args:" in line)
    text[i] = text[i].split("non-default args:")[0] + "non-default args: {[1]: 2}"
    f = tmp_path / "server.log"
    f.write_text("\n".join(text) + "\n")
    db = tmp_path / "t.duckdb"
    code, out = cli("ingest", f, "--db", db)
    assert code == 0, out
    assert counts(db, "iterations") > 0


def test_one_line_error_is_clipped():
    from pipeline.cli import MAX_MESSAGE, one_line

    msg = one_line(ValueError("a\nb  " + "x" * 20_000))
    assert "\n" not in msg and msg.startswith("a b  x") and len(msg) < MAX_MESSAGE + 40


def test_parquet_column_name_not_utf8(tmp_path):
    table = pa.table(
        {"kind": ["request"] * 3, "req_id": ["a", "b", "c"], "t_arrival": [1.0, 2.0, 3.0], "zzqq": [1, 2, 3]}
    )
    buf = io.BytesIO()
    pq.write_table(table, buf)
    f = tmp_path / "t.parquet"
    f.write_bytes(buf.getvalue().replace(b"zzqq", b"z\xff\xfeq"))  # same length: the footer stays valid
    code, out = cli("ingest", f, "--db", tmp_path / "t.duckdb")
    assert code == 2 and "not a readable Parquet file" in out, out


def test_genai_perf_wrong_types_reject_their_requests(tmp_path):
    doc = json.loads((FIX / "genai_perf" / "profile_export.json").read_text())
    good = doc["experiments"][0]["requests"]
    r0 = good[0]
    reqs = [
        *good,
        {**r0, "timestamp": "soon"},  # 3: not an integer
        5,  # 4: not an object
        {**r0, "response_timestamps": [1, "a"]},  # 5: not a list of integers
        {**r0, "response_timestamps": r0["response_timestamps"][:2]},  # 6: shorter than the outputs: loads
        {k: v for k, v in r0.items() if k != "timestamp"},
    ]  # 7: no timestamp
    doc["experiments"][0]["requests"] = reqs
    doc["experiments"][0]["experiment"] = 7  # not an object: no metadata, no crash
    f = tmp_path / "profile_export.json"
    f.write_text(json.dumps(doc))
    db = tmp_path / "t.duckdb"
    code, out = cli("ingest", f, "--db", db)
    assert code == 0, out
    got = dict(rejects(db))
    assert sorted(got) == [3, 4, 5, 7]
    assert "not an integer" in got[3] and "not a JSON object" in got[4] and "not a list of integers" in got[5]
    assert "without timestamp" in got[7]
    assert counts(db, "requests") == 3


def test_huge_integer_in_a_json_document(tmp_path):
    doc = (
        (FIX / "vllm" / "bench.json").read_text().replace('"completed": ', '"completed": ' + "9" * 5000 + ', "x": ', 1)
    )
    for fmt, name in (("vllm-bench", "bench.json"), ("genai-perf", "profile_export.json")):
        f = tmp_path / name
        f.write_text(
            doc
            if fmt == "vllm-bench"
            else (FIX / "genai_perf" / "profile_export.json").read_text().replace("{", '{"n": ' + "9" * 5000 + ", ", 1)
        )
        code, out = cli("ingest", f, "--db", tmp_path / "t.duckdb", "--format", fmt)
        assert code == 2 and "damaged" in out and "internal error" not in out, out


def test_damaged_sidecar_meta_json_is_ignored(tmp_path):
    (tmp_path / "meta.json").write_text("[1, 2]")
    f = tmp_path / "requests.jsonl"
    f.write_text((FIX / "vllm" / "requests.jsonl").read_text())
    code, out = cli("ingest", f, "--db", tmp_path / "t.duckdb")
    assert code == 0, out
    (tmp_path / "meta.json").write_text('{"engine_kwargs": 5, "hardware": [1]}')
    code, out = cli("ingest", f, "--db", tmp_path / "t.duckdb", "--replace")
    assert code == 0, out
