"""write_report: files, page structure, offline-ness, missing sections, hostile strings."""

from __future__ import annotations

import html
import json
import re

import pytest

from pipeline import summary as run_summary
from pipeline.report import default_out_dir, write_report

SPECS_RE = re.compile(r'<script type="application/json" id="tracelat-specs">(.*?)</script>', re.S)


def parts(page: str) -> tuple[str, dict]:
    """The page without the inlined vega bundle, and the embedded specs."""
    specs = json.loads(SPECS_RE.search(page).group(1))
    head, rest = page.split("<script>", 1)
    bundle_end = rest.index("</script>")
    return head + rest[bundle_end:], specs


def test_outputs_and_structure(synth_run, tmp_path):
    con, rid = synth_run
    index = write_report(con, rid, tmp_path / "rep")
    assert index == tmp_path / "rep" / "index.html"
    page = index.read_text()
    own, specs = parts(page)
    assert page.startswith("<!DOCTYPE html>") and "Content-Security-Policy" in own
    assert not re.search(r"(?:src|href)\s*=", own), "the page must load nothing"
    assert not re.search(r"https?://", own)  # the specs carry no $schema URL either
    # one div per spec, every spec drawn by the embed script
    divs = re.findall(r'<div class="chart" id="chart-([a-z_]+)"></div>', own)
    assert (
        sorted(divs)
        == sorted(specs)
        == sorted(["timeline", "context", "cdf_ttft_ms", "cdf_tpot_ms", "cdf_itl_ms", "tail", "queue"])
    )
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    want = json.loads(json.dumps(run_summary.summary(con, rid), default=str))
    assert summary == want
    assert summary["ttft_ms"]["count"] == 120 and summary["fit"]["t0_ms"] > 0
    md = (tmp_path / "rep" / "summary.md").read_text()
    assert f"| ttft_ms | 120 | {summary['ttft_ms']['p50']:,.2f} |" in md
    assert "Iteration-time model**: t0" in md
    lim = summary["spikes"]["stall_detection_limit_ms"]
    assert f"**Stall detection limit**: {lim['median_step']:,.3f} ms on a median step, {lim['p90_step']:,.3f} ms" in md
    assert f"stalls under {lim['median_step']:.3g} ms hide" in json.dumps(specs["timeline"])
    # the headline numbers on the page are the summary's
    assert f"{summary['ttft_ms']['p50']:,.2f} / {summary['ttft_ms']['p99']:,.2f}" in own
    # the fit's numbers to four significant digits, its intervals on the same per-1k scale
    fit = summary["fit"]
    a, (lo, hi) = fit["ms_per_1k_context_tokens"], fit["ci"]["a_ms_per_ctx"]
    assert f'<th class="l">ms_per_1k_context_tokens</th><td class="l">{a:.4g}</td>' in own
    assert f'<th class="l">r2_without_stalls</th><td class="l">{fit["r2_without_stalls"]:.4g}</td>' in own
    # summary.json's mape is a percentage; its row says so
    assert f'<th class="l">mape (%)</th><td class="l">{fit["mape"]:.4g}</td>' in own
    assert (
        f'<th class="l">95% CI of ms_per_1k_context_tokens</th><td class="l">{lo * 1000:.4g} .. {hi * 1000:.4g}' in own
    )
    assert lo * 1000 <= a <= hi * 1000
    assert f"({fit['r2_without_stalls']:,.3f} without stalls), MAPE {fit['mape']:,.2f}%" in md


def test_missing_fit_is_stated_not_fatal(synth_run, tmp_path, monkeypatch):
    con, rid = synth_run
    monkeypatch.setattr(run_summary, "SECTION_PROVIDERS", [])  # as before `tracelat fit` existed
    con.execute("drop table if exists iteration_fit")
    own, specs = parts(write_report(con, rid, tmp_path / "nofit").read_text())
    assert own.count("not available (run `tracelat fit`)") >= 3  # model fit, fitted line, spikes, tail
    assert "tail" not in specs and "timeline" in specs and "context" in specs


def test_requests_only_run(tmp_path, db_path):
    from pipeline import ingest, store

    lines = [
        {"kind": "run", "run_id": "client", "clock": "unix"},
        {"kind": "request", "req_id": "a", "t_arrival": 1.0, "t_first_token": 1.1, "t_finish": 1.5, "output_tokens": 5},
        {"kind": "request", "req_id": "b", "t_arrival": 1.2, "t_first_token": 1.4, "t_finish": 1.9, "output_tokens": 3},
    ]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    con = store.connect(db_path)
    ingest.ingest_paths(con, [tmp_path / "c.jsonl"])
    store.build_derived(con)
    own, specs = parts(write_report(con, "client", tmp_path / "r").read_text())
    assert sorted(specs) == ["cdf_tpot_ms", "cdf_ttft_ms"]
    assert "not available: the run has no iteration records" in own
    assert "ITL (ms): not available (no token times in this run)" in own
    # `tracelat fit` finds nothing to fit on such a run: the page says why instead of sending them there
    assert "model fit: not available: the run has no steps (iteration records)" in own
    assert "tracelat fit" not in own
    md = (tmp_path / "r" / "summary.md").read_text()
    assert "not available (the run has no steps (iteration records))" in md and "tracelat fit" not in md


def test_hostile_strings_are_escaped(hostile_run, tmp_path):
    con, rid, bad = hostile_run
    page = write_report(con, rid, tmp_path / "h").read_text()
    own, specs = parts(page)
    # exactly our three script elements: the bundle, the specs (JSON), the embed code
    assert len(re.findall(r"<script", page)) == 3 and len(re.findall(r"</script", page)) == 3
    assert "<img" not in own and "<b onmouseover" not in own and "<!--" not in own
    assert html.escape(bad["run"][:200], quote=True) in own  # shown, escaped (long id cut with an ellipsis)
    assert html.escape(bad["model"], quote=True) in own
    assert html.escape(bad["req"], quote=True) in own  # request ids in the top-offender tables
    assert "&lt;script&gt;alert(3)&lt;/script&gt;" in own  # metadata
    # the specs block holds no markup, yet decodes to the original strings
    block = SPECS_RE.search(page).group(1)
    assert "<" not in block and ">" not in block
    assert json.loads(block) == specs
    md = (tmp_path / "h" / "summary.md").read_text()
    assert "<script>" not in md and "</script>" not in md and "\\<script\\>" in md
    assert json.loads((tmp_path / "h" / "summary.json").read_text())["run_id"] == bad["run"]


def test_default_out_dir_is_safe():
    import hashlib

    h = lambda s: hashlib.sha256(s.encode()).hexdigest()[:8]  # noqa: E731
    assert default_out_dir("run-1.a").as_posix() == "reports/run-1.a"  # kept as is: no digest
    assert default_out_dir("../../etc/passwd").as_posix() == f"reports/_.._etc_passwd~{h('../../etc/passwd')}"
    assert default_out_dir("<script>/x").as_posix() == f"reports/_script_x~{h('<script>/x')}"
    assert default_out_dir("x" * 500).name == "x" * 91 + "~" + h("x" * 500)


def test_default_out_dirs_are_unique():
    from pipeline.report.compare_page import default_out_dir as compare_dir

    ids = ["a/b", "a?b", "a_b", "a b", "", "run", "x" * 100 + "1", "x" * 100 + "2", "A/B"]
    assert len({default_out_dir(r) for r in ids}) == len(ids)
    pairs = [("a_vs_b", "c"), ("a", "b_vs_c"), ("a/vs/b", "c"), ("a", "b/vs/c")]
    assert len({compare_dir(b, c) for b, c in pairs}) == len(pairs)


@pytest.mark.long
def test_source_date_epoch_pins_the_generated_minute(synth_run, tmp_path, monkeypatch):
    con, rid = synth_run
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")  # 2026-01-01 00:00 UTC
    first = write_report(con, rid, tmp_path / "a").read_bytes()
    assert b"generated 2026-01-01 00:00 UTC." in first
    assert write_report(con, rid, tmp_path / "b").read_bytes() == first  # the page is reproducible
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "soon")  # not seconds: the clock, not an error
    page = write_report(con, rid, tmp_path / "c").read_text()
    assert "generated 2026-01-01" not in page and re.search(r"generated \d{4}-\d\d-\d\d \d\d:\d\d UTC\.", page)
