"""summary.md: the tail shares it prints are every part of the summary's tail section."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline import store
from pipeline.ingest import ingest_paths
from pipeline.report.markdown import summary_markdown
from pipeline.summary import summary

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"


def test_tail_lines_show_every_part_and_add_up_to_the_whole(tmp_path):
    con = store.connect(tmp_path / "t.duckdb")
    ingest_paths(con, [FIX / "server.log", FIX / "bench.json"], run_id="inc")
    store.build_derived(con)
    s = summary(con, "inc")
    lines = {
        m.group(1): m.group(2) for m in re.finditer(r"\*\*Tail of (\w+)\*\*: (.*?)\s*$", summary_markdown(s), re.M)
    }
    assert set(lines) == set(s["tail"]) and lines
    negative = 0
    for metric, text in lines.items():
        shown = {k.replace("\\_", "_"): int(v) for k, v in re.findall(r"([\w\\]+) (-?\d+)%", text)}
        want = {k: round(100 * v) for k, v in s["tail"][metric].items() if round(100 * v)}
        assert shown == want, (metric, text)
        assert abs(sum(shown.values()) - 100) <= len(shown)  # rounding only
        negative += any(v < 0 for v in shown.values())
    assert negative  # the case under test: a part smaller in the tail than in the median group
