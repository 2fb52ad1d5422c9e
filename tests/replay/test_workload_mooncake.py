"""A real Mooncake trace sample as `replay --workload` input, and its broken variants."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import InputError
from pipeline.sim.workload import workload_from_file

SAMPLE = Path(__file__).resolve().parents[2] / "fixtures" / "mooncake" / "conversation_trace_head.jsonl"


def test_real_sample_reads_as_its_lines_say():
    raw = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    w = workload_from_file(SAMPLE)
    assert len(w) == len(raw) == 200
    # the file is in arrival order, so the stable sort keeps it: row i is line i + 1
    # milliseconds to seconds (x * 1e-3 and x / 1000 may differ in the last bit)
    np.testing.assert_allclose(w.t_arrival, np.array([r["timestamp"] for r in raw]) / 1000.0, rtol=1e-15, atol=0)
    assert np.array_equal(w.prompt_tokens, [r["input_length"] for r in raw])
    assert np.array_equal(w.output_tokens, [r["output_length"] for r in raw])
    assert w.describe()["duration_s"] == raw[-1]["timestamp"] / 1000.0 == 72.0


GOOD = '{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1]}'


@pytest.mark.parametrize(
    "line, message",
    [
        (
            '{"timestamp": 5, "input_length": 10, "hash_ids": [1]}',
            ":2: column 'output_length' has None, not a non-negative number. Fix or remove that row.",
        ),
        (
            '{"timestamp": "soon", "input_length": 10, "output_length": 3, "hash_ids": [1]}',
            ":2: column 'timestamp' has 'soon', not a non-negative number. Fix or remove that row.",
        ),
        (
            '{"timestamp": -5, "input_length": 10, "output_length": 3, "hash_ids": [1]}',
            ":2: column 'timestamp' has -5, not a non-negative number. Fix or remove that row.",
        ),
        ('{"timestamp": 72000, "input_length": 1997', ":2: cannot be read as JSON Lines"),
        (
            '{"timestamp": 5, "input_length": 10, "output_length": 0, "hash_ids": [1]}',
            "output-length must be a whole number >= 1. Fix or remove that row.",
        ),
    ],
)
def test_broken_lines_name_the_line_and_the_fix(tmp_path, line, message):
    p = tmp_path / "trace.jsonl"
    p.write_text(GOOD + "\n" + line + "\n")
    with pytest.raises(InputError) as e:
        workload_from_file(p)
    text = str(e.value)
    assert text.startswith(str(p)) and message in text
