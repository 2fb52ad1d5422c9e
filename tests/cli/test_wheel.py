"""The built wheel works on its own: queries, demo trace and example SLO travel inside it.

The top-level ``queries/``, ``fixtures/demo/`` and ``examples/`` are outside the
package; pyproject.toml copies them in (``force-include``) and
``pipeline/resources.py`` finds them either way.  Here the wheel is built, installed
into a fresh venv outside the checkout and run from a folder outside it, so that
nothing can be found in the checkout by accident.

Offline-safe: the wheel is built without build isolation when hatchling is installed
(the ``test`` extra has it), and the fresh venv borrows this environment's
dependencies through a ``.pth`` file instead of downloading them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from pipeline import resources, store

REPO = Path(__file__).resolve().parents[2]
# builds and installs a wheel (8 s); under -m slow, which CI runs, beside .ci/run's own wheel check
pytestmark = pytest.mark.slow


def run(args, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{args}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    # without hatchling here pip fetches it into an isolated build environment (network)
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("hatchling") else []
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", dist, REPO])
    (whl,) = dist.glob("tracelat-*.whl")
    return whl


def test_wheel_carries_queries_demo_trace_slo_and_catalogue(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    sql = {p.relative_to(REPO / "queries").as_posix() for p in (REPO / "queries").rglob("*.sql")}
    assert {"fit/iteration_fit.sql", "run_summary.sql"} <= sql  # the checkout still has the documented layout
    assert {f"pipeline/_queries/{s}" for s in sql} <= names
    assert "pipeline/_fixtures/demo/incident.jsonl.gz" in names
    assert "pipeline/_examples/slo.toml" in names
    assert {"pipeline/data/gpus.toml", "pipeline/data/models.toml"} <= names
    assert not any("__pycache__" in n or n.startswith(("tests/", "queries/")) for n in names)


def test_installed_wheel_runs_demo_and_summary_outside_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    py = venv / "bin" / "python"
    site = Path(run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # this environment's packages (pip, duckdb, polars, ...) after the venv's own; an
    # editable tracelat there is a .pth of its own, which is not followed from here
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "_tracelat_test_deps.pth").write_text("".join(f"{p}\n" for p in ours))
    run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel])

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRACELAT_DB")}
    where = run([py, "-c", "import pipeline; print(pipeline.__file__)"], cwd=work, env=env).stdout.strip()
    assert Path(where).is_relative_to(site), where

    tracelat = venv / "bin" / "tracelat"
    demo = run([tracelat, "demo", "--db", "demo.duckdb"], cwd=work, env=env)
    assert "report: reports/demo-incident/index.html" in demo.stdout
    summary = run([tracelat, "summary", "demo-incident", "--db", "demo.duckdb"], cwd=work, env=env).stdout
    truth = json.loads((REPO / "fixtures" / "demo" / "incident.truth.json").read_text())["result"]
    assert f"run demo-incident: {truth['requests']} requests (0 failed), {truth['iterations']} iterations" in summary
    assert "ttft_ms" in summary
    # the report was checked against the example SLO file shipped in the wheel
    report = json.loads((work / "reports" / "demo-incident" / "summary.json").read_text())
    assert Path(report["slo"]["slo_file"]) == site / "pipeline" / "_examples" / "slo.toml"


def test_checkout_paths_are_used_when_nothing_is_packaged(monkeypatch, tmp_path):
    assert resources.QUERIES_DIR == REPO / "queries"  # this test suite runs on a checkout
    assert resources.DEMO_TRACE.is_file() and resources.EXAMPLE_SLO.is_file()
    monkeypatch.setattr(resources, "PACKAGE", tmp_path / "pipeline")
    monkeypatch.setattr(resources, "CHECKOUT", tmp_path)
    assert resources._locate("_queries", "queries") == tmp_path / "queries"
    (tmp_path / "pipeline" / "_queries").mkdir(parents=True)
    assert resources._locate("_queries", "queries") == tmp_path / "pipeline" / "_queries"


def test_missing_queries_say_the_installation_is_incomplete(tmp_path):
    with pytest.raises(store.StoreError, match="installation is incomplete"):
        store.query_files(tmp_path)
