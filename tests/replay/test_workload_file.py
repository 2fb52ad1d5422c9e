"""replay --workload: another workload through a recorded run's engine (model, noise, policy)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline import store
from pipeline.cli import cli
from pipeline.ingest import ingest_paths

VLLM = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    d = tmp_path_factory.mktemp("w")
    con = store.connect(d / "w.duckdb")
    ingest_paths(con, [VLLM / "server_epoch.log", VLLM / "requests.jsonl"], run_id="cpu")
    store.build_derived(con)
    rows = con.execute(
        "select t_arrival + coalesce(try_cast(extra->>'t_queued' as double) - t_arrival, 0), "
        "prompt_tokens, output_tokens from requests where run_id = 'cpu' order by 1"
    ).fetchall()
    con.close()
    return d / "w.duckdb", np.array(rows, dtype=float)


def _mooncake(path: Path, arrivals_s, prompts, outputs) -> Path:
    t0 = arrivals_s.min()
    nxt = 0
    with open(path, "w") as fh:
        for t, p, o in zip(arrivals_s, prompts, outputs):  # a test fixture writer
            n = -(-int(p) // 512)  # Mooncake: one id per 512 prompt tokens; new ids, so no shared prefix
            fh.write(
                json.dumps(
                    {
                        "timestamp": int(round((t - t0) * 1000)),
                        "input_length": int(p),
                        "output_length": int(o),
                        "hash_ids": list(range(nxt, nxt + n)),
                    }
                )
                + "\n"
            )
            nxt += n
    return path


def _replay(db, *args):
    res = CliRunner().invoke(cli, ["replay", "cpu", "--db", str(db), "--json", "--seeds", "2", *args])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    return out, {(r["metric"], r["stat"]): r["replay"] for r in out["rows"]}


@pytest.mark.long
def test_own_workload_as_a_file_reproduces_the_validation(db, tmp_path):
    path, rows = db
    base, stats = _replay(path)
    f = _mooncake(tmp_path / "own.jsonl", rows[:, 0], rows[:, 1], rows[:, 2])
    w, wstats = _replay(path, "--workload", str(f))
    assert base["mode"] == "validation" and w["mode"] == "what-if" and w["workload"] == "own.jsonl"
    # the same requests on the engine's clock (ms-rounded arrivals): the same engine behaviour
    for key in (("tpot_ms", "p50"), ("throughput", "output_tokens_per_s")):
        assert wstats[key] == pytest.approx(stats[key], rel=0.05), key


def test_twice_the_rate_queues_longer(db, tmp_path):
    path, rows = db
    _, own = _replay(path, "--workload", str(_mooncake(tmp_path / "a.jsonl", rows[:, 0], rows[:, 1], rows[:, 2])))
    fast = _mooncake(tmp_path / "b.jsonl", rows[0, 0] + (rows[:, 0] - rows[0, 0]) / 2, rows[:, 1], rows[:, 2])
    _, twice = _replay(path, "--workload", str(fast))
    assert twice[("ttft_ms", "p90")] > 1.5 * own[("ttft_ms", "p90")]


def test_text_table_keeps_columns_apart_far_from_the_run(db, tmp_path):
    # 50x the rate: errors of thousands of percent must not run into the what-if column
    path, rows = db
    fast = _mooncake(tmp_path / "c.jsonl", rows[0, 0] + (rows[:, 0] - rows[0, 0]) / 50, rows[:, 1] * 4, rows[:, 2])
    res = CliRunner().invoke(cli, ["replay", "cpu", "--db", str(path), "--seeds", "1", "--workload", str(fast)])
    assert res.exit_code == 0, res.output
    _, stats = _replay(path, "--workload", str(fast))
    # a what-if is no model error: its column says "change" (against the replay as recorded)
    assert "observed as recorded    what-if   change" in res.output and "   error" not in res.output, res.output
    table = res.output.split("seed range\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(table) == len(stats)
    errors = []
    for line in table:  # metric [stat], observed, as recorded, what-if, change: each its own field
        fields = line.split()
        assert len(fields) == (5 if fields[0].endswith("_per_s") else 6), line
        assert float(fields[-2]) > 0 and (fields[-1] == "-" or fields[-1].endswith("%")), line
        errors.append(fields[-1])
    assert max(map(len, errors)) > 8  # some error is wider than its column


def test_ok_only_with_a_workload_file_is_refused(db, tmp_path):
    """--ok-only filters the recording's requests, which --workload replaces: it did nothing, silently."""
    from pipeline.cli import run_captured

    path, rows = db
    f = _mooncake(tmp_path / "w.jsonl", rows[:, 0], rows[:, 1], rows[:, 2])
    code, out = run_captured("replay", "cpu", "--db", path, "--workload", f, "--ok-only")
    assert code == 2, out
    assert out.strip() == (
        "Error: --ok-only drops the failed and aborted requests of RUN's recording, which --workload replaces: "
        "every request of the workload file is replayed (a file has no recorded status); leave --ok-only "
        "out, or take the requests you do not want out of the file"
    )
    help_text = " ".join(run_captured("replay", "--help")[1].split())
    assert "Not with --workload: a workload file's requests have no recorded status." in help_text


@pytest.mark.long
def test_replays_of_other_requests_get_their_own_run_ids(db, tmp_path):
    """--ok-only and --workload replay other requests: under the recorded replay's id, --ingest of one
    replaced the other in the store (each was RUN~replay~recorded-nonoise-seed0)."""
    import shutil

    path = shutil.copy(db[0], tmp_path / "own.duckdb")
    rows = db[1]
    small = _mooncake(tmp_path / "small.jsonl", rows[:10, 0], rows[:10, 1], rows[:10, 2])
    other = _mooncake(tmp_path / "other.jsonl", rows[:12, 0], rows[:12, 1], rows[:12, 2])
    base = ["replay", "cpu", "--db", str(path), "--noise", "none", "--ingest"]
    for extra in ([], ["--ok-only"], ["--workload", str(small)], ["--workload", str(other)]):
        res = CliRunner().invoke(cli, [*base, *extra])
        assert res.exit_code == 0, res.output
    con = store.connect(path)
    got = dict(
        con.execute("select run_id, count(*) from requests where run_id like 'cpu~replay~%' group by run_id").fetchall()
    )
    recorded = con.execute("select count(*), count(*) filter (status = 'ok') from requests where run_id = 'cpu'")
    n_all, n_ok = recorded.fetchone()
    con.close()
    assert len(got) == 4
    assert got["cpu~replay~recorded-nonoise-seed0"] == n_all
    assert got["cpu~replay~recorded-okonly-nonoise-seed0"] == n_ok
    workloads = sorted(v for k, v in got.items() if "-workload" in k)
    assert workloads == [10, 12]
