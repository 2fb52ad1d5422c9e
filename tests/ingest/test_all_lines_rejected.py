"""Files with broken or no records, in every format: rejects or a clear message, never a crash."""

from __future__ import annotations

import json

import pytest

from pipeline import ingest, store

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
@pytest.mark.long
def test_every_line_rejected(con, tmp_path, fmt):
    path = tmp_path / "broken.txt"
    path.write_text(CASES[fmt] + "\n")  # and a blank line: skipped, not rejected
    (res,) = ingest.ingest_paths(con, [path], fmt=fmt)
    assert (res.lines_read, res.accepted, res.rejected, res.skipped) == (2, 0, 1, 1)
    assert res.run_ids == [] and store.known_runs(con) == []  # nothing loaded: no run either
    assert con.execute("select count(*) from iterations").fetchall()[0][0] == 0
    assert con.execute("select count(*) from requests").fetchall()[0][0] == 0
    ((line_no, reason),) = con.execute("select line_no, reason from rejects").fetchall()
    assert line_no == 1 and reason


@pytest.mark.parametrize("fmt", sorted(CASES))
@pytest.mark.long
def test_only_blank_lines(con, tmp_path, fmt):
    path = tmp_path / "blank.txt"
    path.write_text("\n  \n\n")
    (res,) = ingest.ingest_paths(con, [path], fmt=fmt)
    assert (res.lines_read, res.accepted, res.rejected, res.skipped) == (3, 0, 0, 3)
    assert res.run_ids == [] and store.known_runs(con) == []
    assert f"no {fmt} records in it" in res.line()


@pytest.mark.parametrize("fmt", sorted(CASES))
@pytest.mark.long
def test_lines_of_json_whitespace_are_blank(con, tmp_path, fmt):
    """Tab and carriage return are JSON whitespace too: such a line is skipped, as a line of spaces is."""
    path = tmp_path / "blank.txt"
    path.write_bytes(b"\t\n \t \r\n\n")
    (res,) = ingest.ingest_paths(con, [path], fmt=fmt)
    assert (res.lines_read, res.accepted, res.rejected, res.skipped) == (3, 0, 0, 3)


def test_object_after_json_whitespace_is_read(con, tmp_path):
    good = [
        {"kind": "run", "run_id": "ws", "engine": "hand", "clock": "monotonic"},
        {"kind": "iteration", "iter": 0, "t_start": 1.0, "t_end": 1.5, "decode_tokens": 1, "decode_reqs": 1},
        {"kind": "iteration", "iter": 1, "t_start": 1.5, "t_end": 2.25, "decode_tokens": 1, "decode_reqs": 1},
    ]
    lines = [json.dumps(good[0]), "\t" + json.dumps(good[1]), " \t ", " \t" + json.dumps(good[2])]
    path = tmp_path / "ws.jsonl"
    path.write_text("\n".join(lines) + "\n")
    (res,) = ingest.ingest_paths(con, [path], fmt="jsonl")
    assert (res.lines_read, res.accepted, res.rejected, res.skipped) == (4, 3, 0, 1)
    rows = con.execute("select iter, t_end - t_start from iterations order by iter").fetchall()
    assert rows == [(0, 0.5), (1, 0.75)]


def test_rejected_run_record_of_a_converter_keeps_the_sums(con, tmp_path):
    path = tmp_path / "b.json"  # the run record of this bench file is fine; its model id is a number
    path.write_text(
        json.dumps(
            {
                "model_id": 123,
                "ttfts": [0.1, 0.2],
                "itls": [[0.01], [0.02]],
                "input_lens": [3, 4],
                "output_lens": [2, 2],
                "start_times": [1, 2],
                "latencies": [0.2, 0.3],
            }
        )
    )
    (res,) = ingest.ingest_paths(con, [path], fmt="vllm-bench")
    assert (res.lines_read, res.accepted, res.rejected) == (2, 2, 0)
    assert con.execute("select model from runs").fetchall() == [("123",)]


@pytest.mark.parametrize(
    "fmt, doc",
    [
        ("vllm-bench", {"model_id": "m", "ttfts": [], "itls": []}),
        ("genai-perf", {"experiments": []}),
    ],
)
def test_empty_documents_create_no_run(con, tmp_path, fmt, doc):
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc))
    (res,) = ingest.ingest_paths(con, [path], fmt=fmt)
    assert (res.lines_read, res.accepted, res.rejected, res.run_ids) == (0, 0, 0, [])
    assert store.known_runs(con) == [] and res.line().endswith("; no records in it")


@pytest.mark.parametrize("fmt", sorted(CASES))
def test_empty_file_loads_nothing_and_says_so(con, tmp_path, fmt):
    path = tmp_path / "empty.txt"
    path.write_text("")
    (res,) = ingest.ingest_paths(con, [path], fmt=fmt)
    assert (res.lines_read, res.accepted, res.rejected, res.run_ids) == (0, 0, 0, [])
    assert res.line().endswith("; no records in it")
    assert con.execute("select count(*) from runs").fetchall() == [(0,)]


@pytest.mark.parametrize("fmt", ["genai-perf", "parquet", "vllm-bench"])
def test_whole_document_formats_name_the_problem(con, tmp_path, fmt):
    from pipeline.errors import InputError

    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    with pytest.raises(InputError, match=r"notes\.txt.*(JSON|Parquet|bench)"):
        ingest.ingest_paths(con, [path], fmt=fmt)
