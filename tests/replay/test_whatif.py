"""Hardware what-ifs (pipeline/replay/whatif.py): --kv-dtype and --compute-speedup on a simulated run.

The expected step times are computed here from the fit's own coefficients (``details["fit"]``,
the mean-scale and host-gap corrections), not from the model the replay simulates with.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline import store
from pipeline.cli import cli
from pipeline.errors import InputError
from pipeline.replay import calibrate, parse_sweep, replay_once, replay_run_id, run_sweep
from pipeline.replay.whatif import recorded_kv_dtype, with_kv_dtype
from pipeline.sim import Policy, WorkloadSpec

from .conftest import simulated_store

CAPACITY = 12_000  # tokens: about 24 requests of the workload below, so KV bounds the batch


@pytest.fixture(scope="module")
def kv_bound(tmp_path_factory):
    """400 requests at 20/s with KV for about 24 of them; run id ``kvb``, KV dtype not recorded."""
    spec = WorkloadSpec(requests=400, rate_rps=20.0, prompt_mean=400, output_mean=100)
    policy = Policy(max_num_seqs=64, max_num_batched_tokens=1024, kv_capacity_tokens=CAPACITY)
    db = simulated_store(tmp_path_factory.mktemp("kvb"), "kvb", spec, policy=policy)
    con = store.connect(db)  # writable: the fit is stored once and reused by every calibration
    base = calibrate(con, "kvb", noise="none")
    yield db, con, base
    con.close()


def _expected_ms(cal, it, a_factor=1.0, compute_factor=1.0):
    """Step times from the fitted coefficients, the corrections and the what-if factors."""
    f, scale = cal.details["fit"], cal.details["mean_scale"]
    t0 = f["t0_ms"] * scale + cal.details["host_gap_ms"]
    return (
        t0
        + a_factor * f["a_ms_per_ctx"] * scale * it["context_tokens"]
        + compute_factor * f["b_ms_per_prefill"] * scale * it["prefill_tokens"]
        + compute_factor * f["c_ms_per_decode"] * scale * it["decode_tokens"]
    )


def test_fp8_halves_the_kv_read_of_each_step_and_doubles_the_capacity(kv_bound):
    _, con, base = kv_bound
    assert base.details["iteration_model"] == "memory-bound" and base.details["kv_dtype"]["source"] == "assumed"
    fp8 = calibrate(con, "kvb", noise="none", whatif={"kv_dtype": "fp8"})
    assert fp8.policy.kv_capacity_tokens == 2 * CAPACITY
    assert fp8.whatif["kv_dtype"]["ratio"] == 0.5 and fp8.is_what_if and not base.is_what_if
    result, _ = replay_once(fp8, 0)
    it = result.iterations
    decode_only = (it["prefill_tokens"] == 0) & (it["decode_tokens"] > 0)
    assert decode_only.sum() > 100
    measured_ms = (it["t_end"] - it["t_start"]) * 1000
    want = _expected_ms(base, it, a_factor=0.5)
    np.testing.assert_allclose(measured_ms[decode_only], want[decode_only], rtol=1e-6)
    # the KV term is large enough that an unscaled a would miss by far more than the tolerance
    unscaled = _expected_ms(base, it)
    assert np.median(unscaled[decode_only] / measured_ms[decode_only]) > 1.1
    # the replay used the larger cache: some step held more KV tokens than the recorded cache has
    assert (it["kv_usage"] * fp8.policy.kv_capacity_tokens).max() > CAPACITY * 1.2
    assert replay_run_id(fp8, 0) == "kvb~replay~kvdtfp8-kv24000-nonoise-seed0"


def test_a_given_capacity_wins_and_the_sweep_applies_the_same_what_if(kv_bound):
    _, con, base = kv_bound
    # --kv-capacity-tokens equal to the recorded value: not scaled, still a what-if (a halved)
    kept = calibrate(con, "kvb", {"kv_capacity_tokens": CAPACITY}, noise="none", whatif={"kv_dtype": "fp8"})
    assert kept.policy.kv_capacity_tokens == CAPACITY and not kept.policy_changes() and kept.is_what_if
    assert kept.model.a_ms_per_ctx == pytest.approx(base.model.a_ms_per_ctx / 2, rel=1e-12)
    assert kept.whatif["kv_dtype"]["kv_capacity_source"] == "option"
    param, values = parse_sweep("kv_dtype=bf16,fp8")
    sw = run_sweep(base, param, values, [0])
    bf16_row, fp8_row = sw.rows
    assert sw.is_recorded("bf16") and not sw.is_recorded("fp8") and bf16_row.whatif == {}
    assert fp8_row.whatif["kv_dtype"]["kv_capacity_tokens"] == 2 * CAPACITY
    single = replay_once(calibrate(con, "kvb", noise="none", whatif={"kv_dtype": "fp8"}), 0)[1]
    assert fp8_row.mean("ttft_ms", "p99") == pytest.approx(single["ttft_ms"]["p99"], rel=1e-12)
    # a larger cache and a cheaper KV read: fewer requests wait for KV
    assert fp8_row.mean("ttft_ms", "p99") < 0.5 * bf16_row.mean("ttft_ms", "p99")
    # with the capacity given, the sweep keeps it for every dtype
    given = calibrate(con, "kvb", {"kv_capacity_tokens": CAPACITY}, noise="none")
    assert run_sweep(given, "kv_dtype", ["fp8"], [0]).rows[0].whatif["kv_dtype"]["kv_capacity_tokens"] == CAPACITY


def test_recorded_kv_dtype_comes_from_the_run_or_the_option(kv_bound):
    _, con, _ = kv_bound
    assert recorded_kv_dtype("fp8", "bf16", None) == ("fp8", "runs.kv_dtype")
    assert recorded_kv_dtype("auto", "float16", None) == ("float16", "runs.dtype (kv_dtype auto)")
    assert recorded_kv_dtype(None, None, None) == ("bf16", "assumed")
    assert recorded_kv_dtype("fp8", "bf16", "fp32") == ("fp32", "--recorded-kv-dtype")
    # recorded fp32, what-if fp8: r = 1/4
    cal = calibrate(con, "kvb", noise="none", whatif={"kv_dtype": "fp8"}, recorded_kv_dtype="fp32")
    assert cal.whatif["kv_dtype"]["ratio"] == 0.25 and cal.policy.kv_capacity_tokens == 4 * CAPACITY
    assert not any("assumed" in n for n in cal.notes)


def test_compute_speedup_divides_the_flop_terms_only(kv_bound):
    _, con, base = kv_bound
    fast = calibrate(con, "kvb", noise="none", whatif={"compute_speedup": 2.0})
    assert fast.policy == base.policy
    it = replay_once(fast, 0)[0].iterations
    measured_ms = (it["t_end"] - it["t_start"]) * 1000
    np.testing.assert_allclose(measured_ms, _expected_ms(base, it, compute_factor=0.5), rtol=1e-6)


def test_unknown_dtypes_are_refused_with_the_known_ones(kv_bound):
    db, _, base = kv_bound
    for args in (
        ["--kv-dtype", "fp9"],
        ["--sweep", "kv_dtype=fp8,q4"],
        ["--kv-dtype", "fp8", "--recorded-kv-dtype", "x"],
    ):
        res = CliRunner().invoke(cli, ["replay", "kvb", "--db", str(db), *args])
        msg = str(res.exception)  # an InputError: the entry point prints it as the message
        assert isinstance(res.exception, InputError) and "not a known dtype" in msg and "fp8_e4m3" in msg, args
    odd = replace(base, details={**base.details, "kv_dtype": {"recorded": "q4_k", "source": "runs.dtype"}})
    with pytest.raises(InputError, match="records KV dtype 'q4_k'.*--recorded-kv-dtype"):
        with_kv_dtype(odd, "fp8")
    res = CliRunner().invoke(cli, ["replay", "kvb", "--db", str(db), "--kv-dtype", "fp8", "--sweep", "kv_dtype=fp8"])
    assert isinstance(res.exception, InputError) and "both set kv_dtype" in str(res.exception)


def test_cli_shows_the_what_if(kv_bound):
    db, _, _ = kv_bound
    args = ["replay", "kvb", "--db", str(db), "--kv-dtype", "fp8", "--noise", "none"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert (
        "what-if: kv_dtype=fp8 (recorded bf16, assumed): a x0.5, kv capacity x2 (12000 -> 24000 tokens)" in res.output
    )
    assert "takes the recorded KV cache to be bf16 (pass --recorded-kv-dtype otherwise)" in res.output
    d = json.loads(CliRunner().invoke(cli, [*args, "--json"]).output)
    assert d["mode"] == "what-if" and d["what_if"]["kv_dtype"]["ratio"] == 0.5
    assert d["policy"]["kv_capacity_tokens"] == 2 * CAPACITY


def test_a_written_replay_records_the_kv_dtype_it_ran_with(kv_bound, tmp_path):
    """A replay of an fp8 replay starts from fp8: a second --kv-dtype fp8 changes nothing."""
    from pipeline import ingest
    from pipeline.replay.trace import replay_dtypes, write_replay

    _, con, base = kv_bound
    fp8 = calibrate(con, "kvb", noise="none", whatif={"kv_dtype": "fp8"})
    result, _ = replay_once(fp8, 0)
    rid = replay_run_id(fp8, 0)
    path = write_replay(result, tmp_path / "r.jsonl", rid, fp8, 0, con=con, with_token_times=False)
    other = store.connect(tmp_path / "r.duckdb")
    ingest.ingest_paths(other, [path])
    store.build_derived(other)
    assert other.execute("select dtype, kv_dtype from runs").fetchall() == [(None, "fp8")]
    again = calibrate(other, rid, noise="none", whatif={"kv_dtype": "fp8"})
    assert again.details["kv_dtype"] == {"recorded": "fp8", "source": "runs.kv_dtype"} and not again.whatif
    assert any("same size; nothing changes" in n for n in again.notes)
    assert again.policy.kv_capacity_tokens == fp8.policy.kv_capacity_tokens  # not doubled twice
    other.close()
    # without a KV what-if the source run's dtypes are copied; --recorded-kv-dtype names the KV dtype
    src = {"dtype": "bfloat16", "kv_dtype": "auto"}
    assert replay_dtypes(base, src) == src
    named = calibrate(con, "kvb", noise="none", whatif={"compute_speedup": 2.0}, recorded_kv_dtype="fp16")
    assert replay_dtypes(named, src) == {"dtype": "bfloat16", "kv_dtype": "fp16"}


def test_no_kv_read_cost_keeps_a_and_says_so(kv_bound):
    """A fit with a <= 0 finds no KV read to scale: a is kept, only the capacity moves, with a warning."""
    _, _, base = kv_bound
    assert base.details["fit"]["a_ci_ms_per_ctx"][0] > 0  # the recorded run's a is clear of 0
    fp8 = with_kv_dtype(base, "fp8")
    assert fp8.whatif["kv_dtype"]["kv_read_cost"] == "fitted" and not any("KV-read" in n for n in fp8.notes)
    negative = replace(base, model=replace(base.model, a_ms_per_ctx=-2e-4))
    out = with_kv_dtype(negative, "fp8")
    info = out.whatif["kv_dtype"]
    assert out.model.a_ms_per_ctx == -2e-4  # halving it would make the fp8 steps slower
    assert out.policy.kv_capacity_tokens == 2 * CAPACITY
    assert info["kv_read_cost"] == "none" and info["scaled_terms"] == []
    assert "a kept (the fit finds no KV-read cost)" in info["summary"]
    assert any("finds no KV-read cost (a = -0.2 ms per 1k context tokens" in n for n in out.notes)
    # a > 0 whose interval includes 0: scaled, with a warning that the step-time part is within the noise
    loose = replace(base, details={**base.details, "fit": {**base.details["fit"], "a_ci_ms_per_ctx": [-1e-5, 1e-3]}})
    out = with_kv_dtype(loose, "fp8")
    assert out.model.a_ms_per_ctx == pytest.approx(base.model.a_ms_per_ctx / 2, rel=1e-12)
    assert out.whatif["kv_dtype"]["kv_read_cost"] == "uncertain"
    assert "a x0.5 (a's 95% interval includes 0)" in out.whatif["kv_dtype"]["summary"]
    assert any("95% interval" in n and "includes 0" in n for n in out.notes)


def test_a_capacity_sweep_row_describes_the_capacity_it_ran(kv_bound):
    """With --kv-dtype fp8, each kv_capacity_tokens row's what_if carries its swept value, not the scaled one."""
    _, con, _ = kv_bound
    fp8 = calibrate(con, "kvb", noise="none", whatif={"kv_dtype": "fp8"})
    assert fp8.whatif["kv_dtype"]["kv_capacity_tokens"] == 2 * CAPACITY
    sw = run_sweep(fp8, "kv_capacity_tokens", [CAPACITY, 3 * CAPACITY], [0])
    for row, cap in zip(sw.rows, (CAPACITY, 3 * CAPACITY)):
        info = row.whatif["kv_dtype"]
        assert (info["kv_capacity_tokens"], info["kv_capacity_source"]) == (cap, "sweep")
        assert info["summary"].endswith(f"a x0.5, kv capacity {cap} tokens as swept (not rescaled)")
        assert info["ratio"] == 0.5 and info["kv_capacity_tokens_before"] == CAPACITY
    assert sw.to_dict()["rows"][0]["what_if"]["kv_dtype"]["kv_capacity_tokens"] == CAPACITY
    assert fp8.whatif["kv_dtype"]["kv_capacity_tokens"] == 2 * CAPACITY  # the base calibration is unchanged


def test_a_capacity_sweep_takes_a_block_size_above_the_recorded_capacity(kv_bound, tmp_path):
    """--kv-block-size is checked against each swept capacity, not the recorded one the sweep replaces."""
    db, _, _ = kv_bound
    args = ["replay", "kvb", "--db", str(db), "--noise", "none", "--kv-block-size", str(2 * CAPACITY), "--json"]
    chart = ["--chart", str(tmp_path / "sweep.html")]  # not reports/ under the working directory
    res = CliRunner().invoke(cli, [*args, *chart, "--sweep", f"kv_capacity_tokens={3 * CAPACITY},{4 * CAPACITY}"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [r["value"] for r in out["rows"]] == [3 * CAPACITY, 4 * CAPACITY]
    assert out["recorded_value"] == CAPACITY and not any(r["recorded"] for r in out["rows"])
    # each row ran its capacity in blocks of 2C: 3C holds one block, 4C two, so 4C admits more at once
    assert out["rows"][0]["ttft_ms_p99"] > out["rows"][1]["ttft_ms_p99"]
    assert any("each row runs its swept capacity" in n for n in out["notes"])
    # the 3C row is the replay of --kv-capacity-tokens 3C --kv-block-size 2C on its own
    one = ["--kv-capacity-tokens", str(3 * CAPACITY)]
    single = json.loads(CliRunner().invoke(cli, [*args[:-1], *one, "--json"]).stdout)
    p99 = next(r["replay"] for r in single["rows"] if (r["metric"], r["stat"]) == ("ttft_ms", "p99"))
    assert out["rows"][0]["ttft_ms_p99"] == pytest.approx(p99, rel=1e-12)
    # a swept capacity below the block size is refused by name, before any replay
    res = CliRunner().invoke(cli, [*args, *chart, "--sweep", f"kv_capacity_tokens={CAPACITY},{4 * CAPACITY}"])
    msg = str(res.exception)
    assert isinstance(res.exception, InputError)
    assert f"--sweep kv_capacity_tokens={CAPACITY}:" in msg and f"leave {CAPACITY} out of the sweep" in msg
    # without the sweep the block size is checked against the recorded capacity
    res = CliRunner().invoke(cli, args[:-1])
    assert isinstance(res.exception, InputError) and f"kv_capacity_tokens ({CAPACITY}), got {2 * CAPACITY}" in str(
        res.exception
    )


@pytest.fixture(scope="module")
def c_and_d(tmp_path_factory):
    """A run whose steps pay a decode matmul cost per token (c) and per-request work (d), and the
    same workload and seed with compute twice as fast (b, c, e halved): the what-if's ground truth."""
    from pipeline import ingest
    from pipeline.sim import IterationModel, NoiseModel, run_simulation

    tmp = tmp_path_factory.mktemp("cd")
    spec = WorkloadSpec(requests=800, rate_rps=14.0)
    policy = Policy(max_num_seqs=64, max_num_batched_tokens=2048, kv_capacity_tokens=300_000)
    noise = NoiseModel(sigma=0.03, stall_rate=0.001, stall_ms_mean=40.0)
    db = tmp / "store.duckdb"
    con = store.connect(db)
    for run, f in (("cd", 1.0), ("cd2x", 0.5)):
        model = IterationModel(
            t0_ms=5.0,
            a_ms_per_ctx=0.0002,
            b_ms_per_prefill=0.04 * f,
            c_ms_per_decode=0.05 * f,
            d_ms_per_req=0.005,
            e_ms_per_prefill_attn=2e-5 * f,
        )
        trace = tmp / f"{run}.jsonl"
        run_simulation(trace, truth=False, run_id=run, spec=spec, policy=policy, model=model, noise=noise, seed=11)
        ingest.ingest_paths(con, [trace])
    store.build_derived(con)
    truth = con.execute(
        "select quantile_cont(tpot_ms, 0.5) from request_latency where run_id = 'cd2x' and tpot_ms is not null"
    ).fetchone()[0]
    yield db, con, truth
    con.close()


@pytest.mark.long
def test_compute_speedup_says_when_d_took_the_decode_cost(c_and_d):
    """The extended model swaps c for d here (one decode token per request and step: the data cannot
    split them), so --compute-speedup leaves the decode matmul cost unscaled; the replay says so,
    and --iteration-model memory-bound, whose c holds it, lands near the ground truth."""
    db, con, truth = c_and_d
    auto = calibrate(con, "cd", noise="none", whatif={"compute_speedup": 2.0})
    assert auto.details["iteration_model"] == "extended"
    assert {"d_ms_per_req"} <= set(auto.details["extended"]["terms"])
    assert "c_ms_per_decode" not in auto.details["extended"]["terms"]
    assert auto.whatif["compute_speedup"]["summary"] == "compute x2: b, e x0.5; d (in place of c) unchanged"
    assert any("--iteration-model memory-bound" in n for n in auto.notes)
    mb = calibrate(con, "cd", noise="none", whatif={"compute_speedup": 2.0}, iteration_model="memory-bound")
    assert mb.details["iteration_model"] == "memory-bound" and mb.model.d_ms_per_req == 0
    assert not any("--iteration-model memory-bound" in n for n in mb.notes)
    tpot = {k: replay_once(c, 0)[1]["tpot_ms"]["p50"] for k, c in (("auto", auto), ("mb", mb))}
    # the decode cost left in d keeps TPOT far above the truth; priced per token it is scaled
    assert tpot["auto"] > 1.06 * truth, tpot
    assert tpot["mb"] == pytest.approx(truth, rel=0.05), tpot
    assert replay_run_id(mb, 0).endswith("compute2x-memory-bound-nonoise-seed0")
    # the option reaches the CLI, and a forced extended model on a run without one is refused
    res = CliRunner().invoke(
        cli, ["replay", "cd", "--db", str(db), "--noise", "none", "--iteration-model", "memory-bound", "--json"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["calibration"]["iteration_model"] == "memory-bound"


def test_a_max_num_seqs_what_if_that_never_binds_says_so(kv_bound):
    """KV for about 24 requests, 64 allowed: 128 changes nothing and the replay says why; 8 binds."""
    from pipeline.replay import compare

    _, con, _ = kv_bound
    wide = calibrate(con, "kvb", {"max_num_seqs": 128}, noise="none")
    cmp = compare(con, wide, [0])
    note = next(n for n in wide.notes if n.startswith("max_num_seqs never bound"))
    most = int(note.split("at most ")[1].split()[0])
    assert most < 64 and "recorded 64 and the what-if 128" in note
    # requests waited for KV: the note names what held the batch, and how often
    waited = float(note.split("requests waited in ")[1].split("%")[0])
    assert "the KV cache or the token budget held the batch" in note and waited > 0
    recorded = compare(con, calibrate(con, "kvb", noise="none"), [0])
    assert cmp.replays[0]["ttft_ms"]["p99"] == recorded.replays[0]["ttft_ms"]["p99"]  # nothing changed
    narrow = calibrate(con, "kvb", {"max_num_seqs": 8}, noise="none")
    compare(con, narrow, [0])
    assert not any(n.startswith("max_num_seqs never bound") for n in narrow.notes)


@pytest.mark.long
def test_a_max_num_seqs_what_if_on_a_light_load_names_the_load(tmp_path):
    """3 requests a second never fill 64 places, and none waits: the note blamed the KV cache or
    the token budget, which held nothing."""
    from pipeline.replay import compare

    db = simulated_store(tmp_path, "light", WorkloadSpec(requests=60, rate_rps=3.0, prompt_mean=200, output_mean=40))
    con = store.connect(db)
    try:
        cal = calibrate(con, "light", {"max_num_seqs": 32}, noise="none")
        compare(con, cal, [0])
    finally:
        con.close()
    note = next(n for n in cal.notes if n.startswith("max_num_seqs never bound"))
    assert "no request ever waited for a place, so the load itself (its arrivals) held the batch" in note
    assert "KV cache" not in note
