"""The metric registry against the docs, the SQL, and the code that lists metrics."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from pipeline import ingest, metricdoc, metrics, store

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "fixtures" / "canonical" / "tiny.jsonl"
DOC = REPO / "docs" / "metrics.md"


def _doc_rows() -> dict[str, tuple[str, str, str, str]]:
    """The metric table of docs/metrics.md read back: name -> (unit, formula, per, source)."""
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = re.fullmatch(r"\| `(\w+)` \| ([^|]+) \| `([^`]+)` \| ([^|]+) \| (.+) \|", line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} documented twice"
            rows[m.group(1)] = (m.group(2).strip(), m.group(3), m.group(4).strip(), m.group(5).strip())
    return rows


def test_every_metric_documented_with_its_unit_and_formula_and_nothing_else():
    rows = _doc_rows()
    assert set(rows) == {m.name for m in metrics.REGISTRY}, "docs/metrics.md and the registry list other metrics"
    for m in metrics.REGISTRY:
        unit, formula, per, source = rows[m.name]
        assert (unit, formula, per) == (m.unit, m.formula, m.per), m.name
        assert f"`{m.table}`" in source, m.name


def test_other_tools_names_documented_for_registered_metrics_only():
    text = DOC.read_text(encoding="utf-8")
    named = re.findall(r"^\| [^|`]+ \| `[^`]+` \| `(\w+)` \|$", text, flags=re.M)
    assert named, "no rows of other tools' names found"
    assert set(named) <= set(metrics.BY_NAME)
    for m in metrics.REGISTRY:
        for tool, theirs in m.aliases:
            assert f"| {tool} | `{theirs}` | `{m.name}` |" in text


@pytest.mark.parametrize("tool", ["AIPerf", "GenAI-Perf"])
def test_inter_token_latency_of_nvidia_clients_is_tpot_not_itl(tool):
    """AIPerf's and GenAI-Perf's "inter_token_latency" is one value per request,
    (request_latency - ttft) / (output tokens - 1): our tpot_ms, not the token gaps of itl_ms
    (AIPerf's gaps are its "inter_chunk_latency")."""
    assert (tool, "inter_token_latency") in metrics.BY_NAME["tpot_ms"].aliases
    assert (tool, "inter_token_latency") not in metrics.BY_NAME["itl_ms"].aliases
    holders = [m.name for m in metrics.REGISTRY if (tool, "inter_token_latency") in m.aliases]
    assert holders == ["tpot_ms"]
    text = DOC.read_text(encoding="utf-8")
    assert f"| {tool} | `inter_token_latency` | `tpot_ms` |" in text
    assert f"| {tool} | `inter_token_latency` | `itl_ms` |" not in text
    assert ("AIPerf", "inter_chunk_latency") in metrics.BY_NAME["itl_ms"].aliases


def test_no_tool_name_stands_for_two_metrics():
    seen: dict[tuple[str, str], str] = {}
    for m in metrics.REGISTRY:
        for alias in m.aliases:
            assert alias not in seen, f"{alias} is both {seen[alias]} and {m.name}"
            seen[alias] = m.name


def test_generated_block_is_current():
    text = DOC.read_text(encoding="utf-8")
    assert metricdoc.render(text) == text, "docs/metrics.md is stale: run python -m pipeline.metricdoc"


def test_units_are_in_the_names():
    suffix = {"ms": "_ms", "tokens/s": "_per_s", "requests/s": "_per_s"}
    for m in metrics.REGISTRY:
        assert m.name.endswith(suffix[m.unit]), m.name


@pytest.fixture
def tiny(con):
    ingest.ingest_paths(con, [TINY])
    store.build_derived(con)
    return con


def test_metric_stats_sql_has_exactly_the_registered_distributions(tiny):
    got = {r[0] for r in tiny.execute("select distinct metric from metric_stats where run_id = 'tiny'").fetchall()}
    assert got == set(metrics.METRICS)
    # metric_stats.sql takes every *_ms column of request_latency: those must be the registered request metrics
    cols = [r[0] for r in tiny.execute("describe request_latency").fetchall() if r[0].endswith("_ms")]
    assert sorted(cols) == sorted(metrics.REQUEST_METRICS)


def test_registry_sources_give_the_values_metric_stats_summarises(tiny):
    """Each distribution's (table, where) in the registry, read with numpy, gives metric_stats' numbers."""
    sql = metrics.metric_stats(tiny, "tiny")
    for m in metrics.METRICS:
        table, where = metrics.SOURCES[m]
        xs = np.array(
            [
                r[0]
                for r in tiny.execute(
                    f"select {m} from {table} where run_id = 'tiny' and {where} and {m} is not null"
                ).fetchall()
            ],
            float,
        )
        assert len(xs) > 0 and sql[m]["count"] == len(xs), m
        assert sql[m]["mean"] == pytest.approx(xs.mean(), rel=1e-12), m
        assert sql[m]["p99"] == pytest.approx(np.percentile(xs, 99), rel=1e-12), m
        assert sql[m]["max"] == xs.max(), m


@pytest.mark.parametrize("name, p", [("p50", 50.0), ("p01", 1.0), ("p999", 99.9), ("p001", 0.1), ("p9999", 99.99)])
def test_percentile_name_inverts_percentile_of(name, p):
    assert metrics.percentile_of(name) == p
    assert metrics.percentile_name(p) == name


def _literal_metric_lists(path: Path) -> list[tuple[int, list[str]]]:
    """Tuple/list/set/dict literals in a module naming three or more registered metrics."""
    names = set(metrics.BY_NAME)
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        elts = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if not isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) or elts is None:
            continue
        hits = [e.value for e in elts if isinstance(e, ast.Constant) and e.value in names]
        if len(hits) >= 3:
            found.append((node.lineno, hits))
    return found


# Literals that name metrics for another purpose than listing them (so not derived), with why.
NOT_METRIC_LISTS = {
    "pipeline/engine_metrics.py": "the engines' own Prometheus histograms that correspond to ours",
    "pipeline/sim/engine.py": "column names of the simulator's arrays",
}
CHOSEN = {  # (module, metrics named): why that choice is the module's own
    (
        "pipeline/report/render.py",
        frozenset({"ttft_ms", "tpot_ms", "itl_ms"}),
    ): "the report draws the CDFs of these three, each with its own reason when missing",
}


def test_no_hand_written_list_of_metrics_outside_the_registry():
    """Every list of metrics is derived from the registry: a literal naming three or more is a copy."""
    offenders = []
    for path in sorted((REPO / "pipeline").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "pipeline/metrics.py" or rel in NOT_METRIC_LISTS:
            continue
        offenders += [
            f"{rel}:{line}: {hits}"
            for line, hits in _literal_metric_lists(path)
            if (rel, frozenset(hits)) not in CHOSEN
        ]
    assert not offenders, "derive these from pipeline.metrics:\n" + "\n".join(offenders)


def _internal_imports(path: Path) -> set[str]:
    """Modules of the package a file imports, at the top or inside functions, as dotted names."""
    pkg = path.relative_to(REPO).with_suffix("").parts[:-1]  # ("pipeline", "replay") for pipeline/replay/x.py
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = list(pkg[: len(pkg) - node.level + 1]) if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            names = [mod] if node.module else [f"{mod}.{a.name}" for a in node.names]
            out |= {n for n in names if n.startswith("pipeline")}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("pipeline")}
    return out


@pytest.mark.parametrize(
    "module, allowed",
    [
        ("pipeline/metrics.py", set()),
        ("pipeline/slo.py", {"pipeline.errors", "pipeline.metrics"}),
    ],
)
def test_metric_layer_imports_nothing_above_it(module, allowed):
    assert _internal_imports(REPO / module) <= allowed


# (the fleet runs `audit` itself on each run for --slo: the audit's verdict per run is its contract)
@pytest.mark.parametrize(
    "module",
    [
        "pipeline/compare.py",
        *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "pipeline" / "replay").glob("*.py")),
    ],
)
def test_replay_and_compare_do_not_reach_into_the_audit(module):
    assert not {m for m in _internal_imports(REPO / module) if m.startswith("pipeline.audit")}
