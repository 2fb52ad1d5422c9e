"""A client file of another run of the same workload (a re-run of an incident's repro): its
shared burst lets an offset be estimated, but the batch sizes of the log's steps do not follow
its requests in flight. The join was reported as "aligned ± 0.1 ms" with no doubt, and explain
priced steps of one run for the requests of another; now the ingest says to check the files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import store
from pipeline.cli import run_captured
from pipeline.ingest import align, ingest_paths

UNIX, PERF = 1796000000.0, -1234.5  # the server's clock and the client's perf_counter, from the run's


def _split(trace: Path, out: Path) -> tuple[Path, Path]:
    """The server's steps on a unix clock and the client's records (no scheduling) on its own."""
    server, client = [], []
    for line in trace.read_text().splitlines():
        r = json.loads(line)
        r.pop("run_id", None)
        if r["kind"] == "run":
            server.append({**r, "clock": "unix"})
            client.append({**r, "clock": "monotonic"})
        elif r["kind"] == "iteration":
            r.pop("req_ids", None)
            server.append({**r, "t_start": r["t_start"] + UNIX, "t_end": r["t_end"] + UNIX})
        else:
            q = {k: r[k] for k in ("kind", "req_id", "prompt_tokens", "output_tokens", "status") if k in r}
            q.update({k: r[k] + PERF for k in ("t_arrival", "t_first_token", "t_finish")})
            if r.get("token_times"):
                q["token_times"] = [t + PERF for t in r["token_times"]]
            client.append(q)
    paths = out.with_suffix(".server.jsonl"), out.with_suffix(".client.jsonl")
    for path, rows in zip(paths, (server, client)):
        path.write_text("".join(json.dumps(x) + "\n" for x in rows))
    return paths


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, tuple[Path, Path]]:
    d = tmp_path_factory.mktemp("reruns")
    out = {}
    for seed in (1, 2):
        trace = d / f"s{seed}.jsonl"
        code, text = run_captured(
            "simulate", "--out", trace, "--requests", "200", "--rate", "8", "--prompt-mean", "512",
            "--output-mean", "64", "--seed", str(seed), "--burst-at", "10", "--burst-count", "15",
            "--burst-prompt-tokens", "4096",
        )  # fmt: skip
        assert code == 0, text
        out[seed] = _split(trace, d / f"s{seed}")
    return out


def _lines(tmp_path, server: Path, client: Path) -> list[tuple[bool, str]]:
    con = store.connect(tmp_path / "s.duckdb")
    try:
        ingest_paths(con, [server, client], run_id="r")
        return align.describe(con, ["r"])
    finally:
        con.close()


def test_a_client_of_another_run_is_called_into_doubt(runs, tmp_path):
    (bad, text), *_ = [x for x in _lines(tmp_path, runs[1][0], runs[2][1]) if "client" in x[1]]
    assert bad and "of the steps in its span match its count of requests in flight" in text, text
    assert "check that they are of one run" in text


def test_the_client_of_the_same_run_is_not(runs, tmp_path):
    lines = [x for x in _lines(tmp_path, *runs[1]) if "client" in x[1]]
    assert lines and not any("check that they are of one run" in text for _, text in lines), lines


def test_explain_repeats_the_doubt(runs, tmp_path):
    """explain's shares rest on the join: the ingest's doubt about it is said again there."""
    from pipeline.fit import get_or_fit
    from pipeline.fit.attribution import explain

    con = store.connect(tmp_path / "s.duckdb")
    try:
        ingest_paths(con, [runs[1][0], runs[2][1]], run_id="r")
        store.build_derived(con)
        get_or_fit(con, "r")
        warnings = explain(con, "r", "ttft")["warnings"]
    finally:
        con.close()
    assert any("check that they are of one run" in w for w in warnings), warnings


@pytest.mark.long
def test_explain_repeats_a_given_offset_the_steps_do_not_bear_out(tmp_path):
    rec = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
    db = tmp_path / "ep.duckdb"
    # 36 ms off the offset the token times give: the ingest names the better one
    code, out = run_captured(
        "ingest", rec / "server_epoch.log", rec / "bench.json", "--run-id", "ep",
        "--clock-offset", "bench.json=1796014047.980", "--db", db,
    )  # fmt: skip
    assert code == 0 and "check the offset" in out, out
    code, out = run_captured("explain", "ep", "--db", db, "--json")
    (warning,) = json.loads(out)["warnings"]
    assert "--clock-offset +1796014047.980000 s" in warning and "check the offset" in warning
    # the replay's workload rests on the same join: its notes say it too
    code, out = run_captured("replay", "ep", "--db", db, "--seeds", "1", "--json")
    assert code == 0 and f"ingest warned: {warning}" in json.loads(out)["notes"], out


def test_an_offset_measured_on_the_raw_perf_counter_gets_the_one_to_give(tmp_path):
    """A bench file's times count from its first request: an offset measured as unix minus
    perf_counter matched 0% of steps, and the warning did not say why. It names the offset that
    would have joined them, which does."""
    import re

    rec = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
    db = tmp_path / "co.duckdb"
    raw = "1796012953.272106"  # unix - perf_counter, as a user would measure it
    args = ("--run-id", "co", "--db")
    code, out = run_captured(
        "ingest", rec / "server.log", rec / "bench.json", *args, db, "--clock-offset", f"bench.json={raw}"
    )
    assert code == 0 and "matched 0% of steps" in out, out
    (fix,) = re.findall(r"--clock-offset (bench\.json=[0-9.]+) if that is how it was measured", out)
    code, out = run_captured(
        "ingest", rec / "server.log", rec / "bench.json", *args, tmp_path / "b.duckdb", "--clock-offset", fix
    )
    assert code == 0 and "matched 100% of steps" in out and "check the offset" not in out, out
