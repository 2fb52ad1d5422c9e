"""Files with broken or no records, in every format: rejects or a clear message, never a crash."""

from __future__ import annotations

import pytest

from pipeline import ingest

CASES = {
    "vllm-log": "INFO 05-19 10:13:11 [loggers.py:199] Engine 000: Iteration(0): 1 context requests, 3 context tokens\n",
    "sglang-log": "[2026-05-01 10:00:01] Decode batch. #running-req: 3\n",
    "vllm-requests": '{"request_id": "a", "input_toks": 3}\n',
    "trtllm-iterlog": '{"iter": 1, "timestamp": "bad"}\n',
    "aiperf": '{"metadata": {"x_request_id": "a"}}\n',
    "sglang-metrics": '{"id": "a", "prompt_tokens": 3, "completion_tokens": 2, "request_parameters": {}}\n',
    "jsonl": '{"kind": "iteration"}\n',
}


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_every_line_rejected(con, tmp_path, fmt):
    path = tmp_path / "broken.txt"
    path.write_text(CASES[fmt])
    (res,) = ingest.ingest_paths(con, [path], fmt=fmt)
    assert res.rejected == 1
    assert res.lines_read == res.accepted + res.rejected + res.skipped
    assert con.execute("select count(*) from iterations").fetchall()[0][0] == 0
    assert con.execute("select count(*) from requests").fetchall()[0][0] == 0
    (line_no, reason), = con.execute("select line_no, reason from rejects").fetchall()
    assert line_no == 1 and reason


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_empty_file_loads_nothing_and_says_so(con, tmp_path, fmt):
    path = tmp_path / "empty.txt"
    path.write_text("")
    (res,) = ingest.ingest_paths(con, [path], fmt=fmt)
    assert (res.lines_read, res.accepted, res.rejected, res.run_ids) == (0, 0, 0, [])
    assert res.line().endswith("; the file is empty")
    assert con.execute("select count(*) from runs").fetchall() == [(0,)]


@pytest.mark.parametrize("fmt", ["genai-perf", "parquet", "vllm-bench"])
def test_whole_document_formats_name_the_problem(con, tmp_path, fmt):
    from pipeline.errors import InputError

    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    with pytest.raises(InputError, match=r"notes\.txt.*(JSON|Parquet|bench)"):
        ingest.ingest_paths(con, [path], fmt=fmt)
