"""Synthetic and file-based workloads for the simulator."""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pytest

from pipeline.errors import InputError
from pipeline.sim.workload import Workload, add_burst, poisson_workload, workload_from_file


def test_poisson_rate_and_lengths():
    w = poisson_workload(20000, 5.0, 512, 0.8, 128, 0.5, seed=1)
    gaps = np.diff(w.t_arrival)
    assert w.t_arrival[0] == 0.0 and np.all(gaps >= 0)
    assert abs(gaps.mean() - 0.2) < 0.01
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05  # exponential: CV 1
    assert w.prompt_tokens.dtype == np.int64 and w.prompt_tokens.min() >= 1
    assert abs(w.prompt_tokens.mean() / 512 - 1) < 0.03
    assert abs(w.output_tokens.mean() / 128 - 1) < 0.03
    assert abs(np.log(w.output_tokens).std() - 0.5) < 0.03


def test_burstiness_changes_dispersion_not_rate():
    bursty = np.diff(poisson_workload(20000, 5.0, 10, 0, 10, 0, seed=2, burstiness=0.25).t_arrival)
    regular = np.diff(poisson_workload(20000, 5.0, 10, 0, 10, 0, seed=2, burstiness=4.0).t_arrival)
    assert abs(bursty.mean() - 0.2) < 0.02 and abs(regular.mean() - 0.2) < 0.01
    assert bursty.std() / bursty.mean() > 1.7  # CV = 1/sqrt(shape)
    assert regular.std() / regular.mean() < 0.6


def test_same_seed_longer_workload_keeps_its_prefix():
    a = poisson_workload(100, 3.0, 200, 1.0, 50, 1.0, seed=9)
    b = poisson_workload(300, 3.0, 200, 1.0, 50, 1.0, seed=9)
    assert np.array_equal(a.t_arrival, b.t_arrival[:100])
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens[:100])
    assert np.array_equal(a.output_tokens, b.output_tokens[:100])
    assert np.all(poisson_workload(5, np.inf, 10, 0, 10, 0, seed=0).t_arrival == 0)


def test_add_burst():
    w = poisson_workload(50, 10.0, 100, 0.5, 20, 0.5, seed=0)
    b = add_burst(w, 1.0, 5, 4000, 8, spread_s=0.4)
    assert len(b) == 55 and np.all(np.diff(b.t_arrival) >= 0)
    burst = b.prompt_tokens == 4000
    assert burst.sum() == 5
    assert b.t_arrival[burst].tolist() == [1.0, 1.1, 1.2, 1.3, 1.4]
    assert sorted(b.req_id[burst].tolist()) == [50, 51, 52, 53, 54]
    assert len(set(b.req_id.tolist())) == 55


def test_workload_validation():
    with pytest.raises(ValueError):
        Workload(np.array([1.0, 0.5]), np.array([1, 1]), np.array([1, 1]))
    with pytest.raises(ValueError):
        Workload(np.array([0.0]), np.array([0]), np.array([1]))


def test_from_csv_aliases_and_sorting(tmp_path):
    p = tmp_path / "w.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,100,7\n0.0,20,3\n")
    w = workload_from_file(p)
    assert w.t_arrival.tolist() == [0.0, 0.5]
    assert w.prompt_tokens.tolist() == [20, 100] and w.output_tokens.tolist() == [3, 7]
    assert w.req_id.tolist() == [1, 0]


def test_from_jsonl_gz_and_mooncake_ms(tmp_path):
    p = tmp_path / "w.jsonl.gz"
    with gzip.open(p, "wt") as fh:
        fh.write('{"timestamp": 0, "input_length": 10, "output_length": 2}\n')
        fh.write('{"timestamp": 1500, "input_length": 30, "output_length": 4}\n')
    w = workload_from_file(p)
    assert w.t_arrival.tolist() == [0.0, 1.5] and w.prompt_tokens.tolist() == [10, 30]


def test_from_azure_datetimes(tmp_path):
    p = tmp_path / "azure.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109"
    )
    w = workload_from_file(p)
    assert w.t_arrival[0] == 0.0 and abs(w.t_arrival[1] - 4.314579) < 1e-6
    assert w.output_tokens.tolist() == [44, 109]


def test_real_azure_trace(realdata):
    w = workload_from_file(realdata / "azure-llm-inference-2023" / "data" / "AzureLLMInferenceTrace_code.csv")
    assert len(w) == 8819 and w.t_arrival[0] == 0 and 3000 < w.t_arrival[-1] < 4000


@pytest.mark.parametrize(
    "text, suffix, match",
    [
        ("t_arrival,prompt_tokens\n0,1\n", ".csv", "no output-length column"),
        ("t_arrival,prompt_tokens,output_tokens\n0,5,1\n1,abc,2\n", ".csv", r"w\.csv:3: column 'prompt_tokens'"),
        ("t_arrival,prompt_tokens,output_tokens\n0,5,1\n1,0,2\n", ".csv", r"w\.csv:3: .*whole number >= 1"),
        ("t_arrival,prompt_tokens,output_tokens\n0,5,1\n-1,5,2\n", ".csv", r"w\.csv:3: column 't_arrival'"),
        ('{"t_arrival":0,"prompt_tokens":1,"output_tokens":1}\n{oops\n', ".jsonl", r"w\.jsonl:2: cannot be read"),
        ("x,y\n1,2\n", ".csv", "no arrival-time column"),
    ],
)
def test_bad_files_say_where_and_how_to_fix(tmp_path, text, suffix, match):
    p = tmp_path / f"w{suffix}"
    p.write_text(text)
    with pytest.raises(InputError, match=match) as e:
        workload_from_file(p)
    assert str(p) in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        workload_from_file(tmp_path / "nope.csv")


def test_a_request_too_big_for_the_cache_is_named_by_its_line(tmp_path):
    """The error names the file and the line of a request that cannot fit (rows are sorted by
    arrival: here the fifth line holds the second arrival)."""
    from pipeline.sim.engine import check_fits
    from pipeline.sim.config import Policy

    f = tmp_path / "trace.jsonl"
    f.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
        "\n"  # blank lines are no requests, but they are lines
        '{"timestamp": 900, "input_length": 10, "output_length": 5}\n'
        "  \n"
        '{"timestamp": 500, "input_length": 120633, "output_length": 5}\n'
    )
    w = workload_from_file(f)
    assert list(w.source_lines) == [1, 5, 3] and w.head(2).where(1) == f" ({f} line 5)"
    # its id is its row's index (0-based), which said nothing about where to look
    with pytest.raises(InputError, match=re.escape(f"request '2' ({f} line 5) needs 120637 KV tokens")):
        check_fits(w, Policy(max_num_seqs=4, max_num_batched_tokens=256, kv_capacity_tokens=4096))
    assert Workload(w.t_arrival, w.prompt_tokens, w.output_tokens).where(0) == ""  # not from a file


def test_a_bad_value_after_blank_lines_is_named_by_its_line(tmp_path):
    f = tmp_path / "trace.jsonl.gz"
    f.write_bytes(
        gzip.compress(
            b'{"t_arrival": 0, "prompt_tokens": 3, "output_tokens": 2}\n\n\n{"t_arrival": 1, "prompt_tokens": 0, "output_tokens": 2}\n'
        )
    )
    with pytest.raises(InputError, match=re.escape(f"{f}:4:")):
        workload_from_file(f)


def test_a_deeply_nested_line_is_no_workload_and_no_crash(tmp_path):
    """The ingest asks whether an unknown file is a workload trace; a first line nested
    thousands deep (fuzzed, hostile) made json.loads raise RecursionError: an internal error."""
    from pipeline.sim.workload import looks_like_workload

    f = tmp_path / "deep.jsonl"
    f.write_text("[" * 5000 + "]" * 5000 + "\n")
    assert looks_like_workload(f) is False
    g = tmp_path / "deep.json"
    g.write_text('{"a": ' * 5000 + "1" + "}" * 5000 + "\n")
    assert looks_like_workload(g) is False


def test_add_burst_keeps_each_requests_hashes_cached_tokens_and_lines(tmp_path):
    """A burst on a file workload used to drop its block hashes, recorded cached tokens and file lines:
    a prefix-cached replay of a Mooncake trace with --burst-at then simulated no prefix reuse at all."""
    p = tmp_path / "mooncake.jsonl"
    rows = [(0, 600, [1, 2]), (400, 1000, [1, 2]), (900, 100, [7]), (2500, 1100, [1, 3, 4])]
    p.write_text(
        "\n".join(
            json.dumps({"timestamp": t, "input_length": n, "output_length": 3, "hash_ids": h}) for t, n, h in rows
        )
        + "\n"
    )
    w = workload_from_file(p)
    w = Workload(
        w.t_arrival,
        w.prompt_tokens,
        w.output_tokens,
        w.req_id,
        np.array([0, 512, 0, 256]),
        w.hash_offsets,
        w.hash_values,
        w.hash_block_tokens,
        w.source,
        w.source_lines,
    )
    b = add_burst(w, 0.5, 2, 1100, 4, spread_s=1.5)  # arrivals 0.5 and 2.0: between the file's requests

    def per_id(x):
        return {
            rid: (
                x.hash_values[x.hash_offsets[i] : x.hash_offsets[i + 1]].tolist(),
                int(x.cached_tokens[i]),
                int(x.source_lines[i]),
            )
            for i, rid in enumerate(x.ids().tolist())
        }

    before, after = per_id(w), per_id(b)
    assert {k: after[k] for k in before} == before  # every recorded request keeps what it carried
    new = [after[k] for k in after if k not in before]
    assert len(new) == 2 and all(c == 0 and line == 0 for _, c, line in new)
    assert all(len(h) == 3 for h, _, _ in new)  # 1100 tokens: three started 512-token blocks
    fresh = [v for h, _, _ in new for v in h]
    assert len(set(fresh)) == 6 and not set(fresh) & set(w.hash_values.tolist())
    # sorted in by arrival (Mooncake stamps are ms): 0, 0.4, burst 0.5, 0.9, burst 2.0, 2.5 s
    assert [rid in before for rid in b.ids().tolist()] == [True, True, False, True, False, True]
    assert b.where(2) == " (a request of the added burst)"
    assert b.where(0) == f" ({w.source} line 1)" and b.where(len(b) - 1) == f" ({w.source} line 4)"
