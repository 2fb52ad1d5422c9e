"""Engine converters: a field that is there but unreadable rejects its record, naming the
field and the value; a step line cut off before its counter is a reject, never skipped.

Each case edits one record of a fixture and checks the counts, the reason and that the
other records' numbers are those of the untouched fixture.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from .conftest import load

FIX = Path(__file__).resolve().parents[2] / "fixtures"


def rejects(con) -> dict[int, str]:
    return dict(con.execute("select line_no, reason from rejects order by line_no").fetchall())


def write_jsonl(path: Path, recs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


# --- vllm-requests --------------------------------------------------------------------

VREQ = [json.loads(line) for line in (FIX / "vllm" / "requests.jsonl").read_text().splitlines() if line.strip()]


def requests_of(con, run: str) -> dict:
    return {
        r[0]: r[1:]
        for r in con.execute(
            "select req_id, t_arrival, t_first_token, t_finish, prompt_tokens, output_tokens, status from requests "
            "where run_id = ? order by req_id",
            [run],
        ).fetchall()
    }


@pytest.mark.parametrize(
    "field, value, reason",
    [
        ("first_token_ts", "x", 'first_token_ts: expected a number, got "x"'),
        ("input_toks", True, "input_toks: expected an integer, got true"),
        ("output_toks", 1e30, "output_toks: 1e30 is implausibly large (over 2^53)"),
        ("output_toks", 10**30, "output_toks: 1000000000000000000000000000000 is implausibly large (over 2^53)"),
        ("output_toks", 2.5, "output_toks: expected an integer, got 2.5"),
        ("arrival_time", [1], "arrival_time: expected a number, got [1]"),
        ("request_id", {"a": 1}, 'request_id: expected a string or integer, got {"a":1}'),
    ],
)
def test_vllm_requests_bad_value_is_a_reject(con, tmp_path, field, value, reason):
    recs = copy.deepcopy(VREQ)
    recs[1][field] = value
    (res,) = load(con, write_jsonl(tmp_path / "bad.jsonl", recs), run_id="bad")
    (ref,) = load(con, FIX / "vllm" / "requests.jsonl", run_id="ref")
    assert (res.accepted, res.rejected, res.skipped) == (len(VREQ) - 1, 1, 0)
    assert rejects(con) == {2: reason}
    good, want = requests_of(con, "bad"), requests_of(con, "ref")
    del want[VREQ[1]["request_id"]]
    assert good == want
    assert all(r[-1] == "ok" for r in good.values())  # no request turned into a failure


def test_vllm_requests_long_value_is_cut(con, tmp_path):
    recs = copy.deepcopy(VREQ)
    recs[1]["first_token_ts"] = "y" * 500
    (res,) = load(con, write_jsonl(tmp_path / "bad.jsonl", recs))
    assert res.rejected == 1
    (reason,) = rejects(con).values()
    assert reason == 'first_token_ts: expected a number, got "' + "y" * 39


@pytest.mark.parametrize("value", [None, "absent"])
def test_vllm_requests_null_or_absent_optional_field_stays_allowed(con, tmp_path, value):
    recs = copy.deepcopy(VREQ)
    if value == "absent":
        del recs[1]["num_cached_tokens"]
    else:
        recs[1]["num_cached_tokens"] = None
    (res,) = load(con, write_jsonl(tmp_path / "ok.jsonl", recs))
    assert (res.accepted, res.rejected) == (len(VREQ), 0)


# --- TensorRT-LLM -----------------------------------------------------------------------

TRT = json.loads((FIX / "trtllm" / "metrics.json").read_text())


def steps_of(con, run: str, cols: str = "iter, dur_ms, prefill_tokens, decode_reqs, running_reqs, kv_usage") -> list:
    return con.execute(f"select {cols} from iterations where run_id = ? order by iter", [run]).fetchall()


@pytest.mark.parametrize(
    "path, value, reason",
    [
        (
            ("numActiveRequests",),
            10**25,
            "numActiveRequests: 10000000000000000000000000 is implausibly large (over 2^53)",
        ),
        (("numActiveRequests",), 1e25, "numActiveRequests: 1e25 is implausibly large (over 2^53)"),
        (("numActiveRequests",), "many", 'numActiveRequests: expected an integer, got "many"'),
        (("kvCacheStats", "usedNumBlocks"), [3], "kvCacheStats.usedNumBlocks: expected a number, got [3]"),
    ],
)
def test_trtllm_bad_value_is_a_reject(con, tmp_path, path, value, reason):
    doc = copy.deepcopy(TRT)
    target = doc[1]
    for k in path[:-1]:
        target = target[k]
    assert path[-1] in target
    target[path[-1]] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    (res,) = load(con, bad, run_id="bad")
    load(con, FIX / "trtllm" / "metrics.json", run_id="ref")
    assert (res.accepted, res.rejected) == (len(TRT) - 1, 1)
    assert rejects(con) == {2: reason}
    want = [s for s in steps_of(con, "ref") if s[0] != TRT[1]["iter"]]
    assert steps_of(con, "bad") == want


# --- AIPerf and FPM: reasons name the value, not "without" -------------------------------------

AIPERF = [json.loads(line) for line in (FIX / "aiperf" / "profile_export.jsonl").read_text().splitlines() if line]


@pytest.mark.parametrize(
    "where, value, reason",
    [
        (
            ("metadata", "request_start_ns"),
            10**40,
            "metadata.request_start_ns: 1" + "0" * 39,  # cut to 40 characters
        ),
        (
            ("metadata", "request_start_ns"),
            1e40,
            "metadata.request_start_ns: 1e40 is no time in nanoseconds (magnitude over 1e20)",
        ),
        (
            ("metrics", "output_sequence_length", "value"),
            "many",
            'metrics.output_sequence_length.value: expected an integer, got "many"',
        ),
    ],
)
def test_aiperf_bad_value_reason(con, tmp_path, where, value, reason):
    recs = copy.deepcopy(AIPERF)
    target = recs[1]
    for k in where[:-1]:
        target = target[k]
    target[where[-1]] = value
    (res,) = load(con, write_jsonl(tmp_path / "bad.jsonl", recs), run_id="bad")
    load(con, FIX / "aiperf" / "profile_export.jsonl", run_id="ref")
    assert (res.accepted, res.rejected) == (len(AIPERF) - 1, 1)
    (got,) = rejects(con).items()
    assert got[0] == 2 and got[1].startswith(reason)
    q = "select req_id, t_arrival, t_first_token, t_finish, output_tokens from requests where run_id = ? order by 1"
    want = [r for r in con.execute(q, ["ref"]).fetchall() if r[0] != str(AIPERF[1]["metadata"]["x_request_id"])]
    assert con.execute(q, ["bad"]).fetchall() == want


FPM = FIX / "fpm" / "fpm-relay-w0.jsonl"


def test_fpm_huge_count_names_the_value(con, tmp_path):
    recs = [json.loads(x) for x in FPM.read_text().splitlines() if x.strip()]
    recs[2]["scheduled_requests"]["num_decode_requests"] = 10**25
    (res,) = load(con, write_jsonl(tmp_path / "bad.jsonl", recs), run_id="bad")
    (ref,) = load(con, FPM, run_id="ref")
    # the step keeps its other rank's line (one rank line fewer is merged into it)
    assert (res.accepted, res.rejected, res.skipped) == (ref.accepted, 1, ref.skipped - 1)
    assert rejects(con) == {
        3: "scheduled_requests.num_decode_requests: 10000000000000000000000000 is implausibly large (over 2^53)"
    }
    cols = "iter, dur_ms, prefill_tokens, decode_reqs, context_tokens"
    bad_iter = recs[2]["counter_id"]
    bad, ref = steps_of(con, "bad", cols), steps_of(con, "ref", cols)
    assert [s for s in bad if s[0] != bad_iter] == [s for s in ref if s[0] != bad_iter]
    assert [s[0] for s in bad] == [s[0] for s in ref]  # step bad_iter: from its other rank only


# --- vLLM log ------------------------------------------------------------------------------

VLOG = FIX / "vllm" / "server_epoch.log"
VLINES = VLOG.read_text().split("\n")
STEP_IDX = [i for i, line in enumerate(VLINES) if "Iteration(" in line]


def vlog_steps(con, run: str) -> list:
    return steps_of(con, run, "iter, t_end, dur_ms, prefill_tokens, decode_tokens, kv_usage")


@pytest.mark.parametrize(
    "pattern, repl, reason",
    [
        (r"elapsed time: [0-9.]+", "elapsed time: -12", "dur_ms: -12 is negative"),
        (r"elapsed time: [0-9.]+", "elapsed time: 1e400", "dur_ms: 1e400 is not a finite number"),
        (r"elapsed time: [0-9.]+", "elapsed time: abc", "dur_ms: expected a number, got abc"),
        (
            r"\d+ context tokens",
            "99999999999999999999999 context tokens",
            "prefill_tokens: 99999999999999999999999 is implausibly large (over 2^53)",
        ),
        (r"KV cache usage: [0-9.]+%", "KV cache usage: x%", "kv_usage: expected a number, got x"),
        (r"Iteration\(\d+\)", "Iteration(zz)", "iter: expected an integer, got zz"),
    ],
)
def test_vllm_log_bad_value_reason(con, tmp_path, pattern, repl, reason):
    lines = VLINES[:]
    k = STEP_IDX[5]
    lines[k] = re.sub(pattern, repl, lines[k])
    assert lines[k] != VLINES[k]
    bad = tmp_path / "bad.log"
    bad.write_text("\n".join(lines))
    (res,) = load(con, bad, run_id="bad")
    (ref,) = load(con, VLOG, run_id="ref")
    assert (res.accepted, res.rejected, res.skipped) == (ref.accepted - 1, 1, ref.skipped)
    assert rejects(con) == {k + 1: reason}
    assert vlog_steps(con, "bad") == [s for s in vlog_steps(con, "ref") if s[0] != 5]


@pytest.mark.parametrize("cut", ["Iteration(", "Iteration(3", "Iteration(3)"])
@pytest.mark.long
def test_vllm_log_line_cut_in_the_counter_is_a_reject(con, tmp_path, cut):
    last = STEP_IDX[-1]
    head = VLINES[last].split("Iteration(")[0]
    lines = VLINES[:last] + [head + cut]  # the log ends mid-line, inside the last step's counter
    bad = tmp_path / "cut.log"
    bad.write_text("\n".join(lines))
    (res,) = load(con, bad, run_id="bad")
    (ref,) = load(con, VLOG, run_id="ref")
    n = len(STEP_IDX) - 1  # the steps before the cut one
    assert (res.accepted, res.rejected, res.skipped) == (n, 1, last - n)  # the others are skipped, as before
    assert rejects(con) == {last + 1: "truncated or garbled Iteration line (no complete 'Iteration(N):' step counter)"}
    assert ref.accepted == n + 1
    assert vlog_steps(con, "bad") == vlog_steps(con, "ref")[:n]


# --- SGLang log ---------------------------------------------------------------------------

SGLOG = FIX / "sglang" / "server.log"


@pytest.mark.parametrize("cut", ["Decode batch", "Decode batch.", "Decode batch [12"])
def test_sglang_batch_line_cut_is_a_reject(con, tmp_path, cut):
    text = SGLOG.read_text()
    line = next(x for x in text.splitlines() if "Decode batch" in x)
    head = line.split("Decode batch")[0]
    bad = tmp_path / "cut.log"
    bad.write_text(text.rstrip("\n") + "\n" + head + cut)
    n_lines = len(text.rstrip("\n").splitlines())
    (res,) = load(con, bad, run_id="bad")
    (ref,) = load(con, SGLOG, run_id="ref")
    assert (res.accepted, res.rejected, res.skipped) == (ref.accepted, 1, ref.skipped)
    assert rejects(con) == {
        n_lines
        + 1: "truncated or garbled SGLang batch line (no 'Prefill batch. ' or 'Decode batch. ' followed by fields)"
    }
    cols = "iter, t_end, dur_ms, decode_reqs, context_tokens, kv_usage"
    assert steps_of(con, "bad", cols) == steps_of(con, "ref", cols)


def test_sglang_other_batch_wording_is_still_skipped(con, tmp_path):
    text = SGLOG.read_text().rstrip("\n") + "\n[2025-09-03 05:49:04] Decode batch size is 8 (info)\n"
    bad = tmp_path / "other.log"
    bad.write_text(text)
    (res,) = load(con, bad, run_id="bad")
    (ref,) = load(con, SGLOG, run_id="ref")
    assert (res.accepted, res.rejected, res.skipped) == (ref.accepted, 0, ref.skipped + 1)


# --- a value that converts but fails canonical validation is named as the user wrote it ---------


@pytest.mark.parametrize(
    "field, value, reason",
    [
        ("input_toks", -5, "input_toks (prompt_tokens): negative count -5"),
        ("num_cached_tokens", -1, "num_cached_tokens (cached_tokens): negative count -1"),
    ],
)
def test_vllm_requests_canonical_reject_names_the_source_field(con, tmp_path, field, value, reason):
    recs = copy.deepcopy(VREQ)
    recs[1][field] = value
    (res,) = load(con, write_jsonl(tmp_path / "neg.jsonl", recs))
    assert (res.accepted, res.rejected) == (len(VREQ) - 1, 1)
    assert rejects(con) == {2: reason}


def test_aiperf_canonical_reject_names_the_source_field(con, tmp_path):
    recs = copy.deepcopy(AIPERF)
    recs[1]["metrics"]["output_sequence_length"]["value"] = -3
    (res,) = load(con, write_jsonl(tmp_path / "neg.jsonl", recs))
    assert (res.accepted, res.rejected) == (len(AIPERF) - 1, 1)
    (got,) = rejects(con).items()
    assert got[0] == 2 and got[1].startswith("metrics.output_sequence_length (output_tokens): negative count -3; ")


def _neg_guidellm(doc):
    doc["benchmarks"][0]["requests"]["successful"][1]["input_metrics"]["total_tokens"] = -4


def _neg_inference_perf(doc):
    doc[1]["info"]["response_metrics"]["output_tokens"] = -2


@pytest.mark.parametrize(
    "fixture, edit, reason",
    [
        ("guidellm/benchmarks.json", _neg_guidellm, "input_metrics.total_tokens (prompt_tokens): negative count -4"),
        (
            "inference_perf/per_request_lifecycle_metrics.json",
            _neg_inference_perf,
            "info.response_metrics.output_tokens (output_tokens): negative count -2; "
            "token_times has 3 entries but output_tokens is only -2",
        ),
    ],
)
def test_harness_canonical_reject_names_the_source_field(con, tmp_path, fixture, edit, reason):
    doc = json.loads((FIX / fixture).read_text())
    edit(doc)
    path = tmp_path / Path(fixture).name
    path.write_text(json.dumps(doc))
    (ref,) = load(con, FIX / fixture, run_id="ref")
    (res,) = load(con, path, run_id="neg")
    assert (res.accepted, res.rejected) == (ref.accepted - 1, ref.rejected + 1)
    reasons = dict(con.execute("select line_no, reason from rejects where path = ?", [str(path)]).fetchall())
    assert reasons[2] == reason


# --- NaN and infinity --------------------------------------------------------------------


@pytest.mark.parametrize(
    "array, value, reason",
    [
        ("latencies", float("inf"), "latencies (t_finish): NaN or infinite value Infinity"),
        ("latencies", float("nan"), "latencies (t_finish): NaN or infinite value NaN"),
        ("start_times", float("-inf"), None),  # no arrival time: its own reason (below)
        # the token times come from the TTFT: its NaN is one reason, not a second one under itls
        ("ttfts", float("nan"), "ttfts (t_first_token): NaN or infinite value NaN"),
        ("ttfts", float("inf"), "ttfts (t_first_token): NaN or infinite value Infinity"),
    ],
)
def test_vllm_bench_non_finite_value_is_a_reject_not_an_absent_one(con, tmp_path, array, value, reason):
    """An Infinity in `latencies` was stored as an ok request without t_finish (one TPOT and E2E
    fewer, nothing said); it is a reject naming the array and the value, and nothing else."""
    doc = json.loads((FIX / "vllm" / "bench.json").read_text())
    n = len(doc["ttfts"])
    doc[array][5] = value
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))  # Python writes NaN and Infinity, as vLLM's json.dump does
    (res,) = load(con, path, run_id="b")
    assert (res.accepted, res.rejected) == (n - 1, 1)
    got = rejects(con)
    assert list(got) == [6]
    if reason:
        assert got[6] == reason
    else:
        assert "start_times" in got[6] and "unknown" in got[6]
    assert con.execute("select count(*) from requests where status = 'ok' and t_finish is null").fetchone()[0] == 0


def test_vllm_bench_non_finite_ttft_without_latencies_is_one_reason(con, tmp_path):
    """Without `latencies` the finish is TTFT + the ITLs: a NaN TTFT is named once, under ttfts."""
    doc = json.loads((FIX / "vllm" / "bench.json").read_text())
    n = len(doc["ttfts"])
    doc.pop("latencies", None)
    doc["ttfts"][3] = float("nan")
    doc["itls"][4] = [*doc["itls"][4][:-1], float("nan")]  # a NaN gap is still its own reason
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    (res,) = load(con, path, run_id="b")
    assert (res.accepted, res.rejected) == (n - 2, 2)
    got = rejects(con)
    assert got[4] == "ttfts (t_first_token): NaN or infinite value NaN"
    assert "itls (token_times)" in got[5] and "ttfts" not in got[5]


def test_canonical_non_finite_time_gives_its_own_reason_only(con, tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(
        '{"kind":"request","req_id":"a","t_arrival":1,"t_first_token":1.5,"t_finish":NaN}\n'
        '{"kind":"request","req_id":"b","t_arrival":1,"t_first_token":Infinity,"t_finish":2}\n'
        '{"kind":"iteration","iter":0,"t_start":1,"t_end":Infinity}\n'
        '{"kind":"request","req_id":"c","t_arrival":5,"t_finish":2}\n'
    )
    load(con, path, run_id="c")
    assert rejects(con) == {
        1: "t_finish: NaN or infinite value NaN",
        2: "t_first_token: NaN or infinite value Infinity",
        3: "t_end: NaN or infinite value Infinity",
        4: "t_finish is before t_arrival",  # a finite record keeps its cross-field reasons
    }
