"""Shared fixtures: a fresh store per test, and the shared real-data folder."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REALDATA = Path(os.environ.get("TRACELAT_REALDATA", REPO.parent / "shared" / "realdata"))


# Cases of the default run that took 3 s or more each on a 2-core machine (pytest --durations=0,
# 2026-12-06): end-to-end nights, fleets and lakes, second variants of a case the default run
# keeps one variant of, statistical checks. They run with the slow tests (`-m slow`, in CI), so
# the default run stays near 5 minutes. Property and fuzz cases keep their few-example budget here.
SLOW_CASES = frozenset(
    {
        "tests/ingest/test_trtllm.py::test_order_checks_do_not_depend_on_batch_size_random",
        "tests/nightly/test_nightly_cli.py::test_a_night_that_fails_writing_its_outputs_leaves_none",
        "tests/nightly/test_nightly_cli.py::test_a_folder_file_that_loads_nothing_fails_the_night[empty]",
        "tests/nightly/test_nightly_rerun.py::test_rerun_with_other_options_reports_the_recorded_night",
        "tests/nightly/test_nightly_several_runs.py::test_a_server_log_and_its_client_records_are_one_night",
        "tests/ingest/test_dst_fold.py::test_vllm_default_log_through_the_fall_back_keeps_its_timeline[300]",
        "tests/ingest/test_dst_fold.py::test_trtllm_stats_through_the_fall_back_keep_their_instants[1500-iteration_log]",
        "tests/ingest/test_split_sources.py::test_engine_formats_vllm_log_and_aiperf[light]",
        "tests/ingest/test_engine_detect.py::test_cli_mixed_directory_reports_each_file",
        "tests/ingest/test_canonical_ingest.py::test_report_after_an_extreme_value",
        "tests/ingest/test_aiperf.py::test_warmup_count_reaches_the_meta_across_batches",
        "tests/ingest/test_fast_path.py::test_same_store_in_many_small_batches",
        "tests/store/test_reproducible.py::test_summary_json_is_identical_across_fresh_ingests[2048]",
        "tests/store/test_read_only.py::test_summary_and_runs_read_while_another_process_reads",
        "tests/fleet/test_fleet.py::test_fleet_cli_json_and_glob",
        "tests/fleet/test_lake.py::test_compare_report_and_perfetto_from_lake",
        "tests/fleet/test_lake.py::test_hostile_run_ids_round_trip",
        "tests/fit/test_stall_fdr.py::test_fdr_and_recall_30k_steps",
        "tests/fit/test_stall_fdr.py::test_false_stalls_do_not_grow_with_the_run",
        "tests/replay/test_validate.py::test_cli_writes_ingests_and_reports_replays",
    }
)


# More of the same kind (2026-12-06, measured again: the default run was back at 8 min): the
# TensorRT-LLM order checks with small reader batches (a batch of one record: 25-40 batches a file;
# the whole-file variant stays), second and later variants of one case, and the damage and fuzz cases of the
# engine formats (those of canonical JSONL and Parquet and of the vLLM formats stay); 2026-12-07: the
# rotated log's pieces given newest first (oldest first stays).
# Regular expressions, matched at the start of a node id.
SLOW_PATTERNS = re.compile(
    "|".join(
        [
            r"tests/ingest/test_trtllm\.py::.*(1500|3000)\]$",
            r"tests/ingest/test_split_messy\.py::test_the_pieces_of_a_rotated_log_are_re_timed_as_one_log\[newer",
            r"tests/ingest/test_dst_fold\.py::test_trtllm_.*[\[-]1500[\]-]",
            r"tests/ingest/test_props_formats\.py::test_any_damage_is_a_reject_or_one_clear_error\[(?!{keep})",
            r"tests/ingest/test_fuzz\.py::test_fuzz_few\[(?!{keep})",
            r"tests/ingest/test_fuzz_readers\.py::test_duckdb_and_python_line_readers_agree_on_damaged_files\[(?!{keep})",
            r"tests/nightly/test_nightly_rerun\.py::test_a_rerun_refuses_a_bad_option_as_a_new_night_does\[option[1-9]",
            r"tests/ingest/test_split_sources\.py::test_split_run_equals_single_file_run\[(kv|light)\]",
            r"tests/fit/test_fit_sim\.py::test_stall_recall_and_false_positives_on_chat_load\[[23]\]",
            r"tests/fit/test_attribution\.py::test_parts_sum_to_each_latency\[kv_run_no_tokens\]",
            r"tests/report/test_browser\.py::test_hostile_(sweep|fleet)_",
            r"tests/nightly/test_nightly_cli\.py::test_nights_history_json_rerun_and_failures$",
            r"tests/nightly/test_nightly_several_runs\.py::test_two_aiperf_exports_are_two_runs_not_one_night$",
            r"tests/fleet/test_fleet\.py::test_fleet_numbers$",
            r"tests/replay/test_replay_blocks\.py::test_block_policy_comes_from_the_run$",
        ]
    ).replace("{keep}", r"(jsonl|parquet|vllm-log|vllm-requests)[-\]]")
)


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.nodeid in SLOW_CASES or SLOW_PATTERNS.match(item.nodeid):
            item.add_marker(pytest.mark.slow)


def pytest_xdist_auto_num_workers(config) -> int:
    """Workers for ``-n auto``: one per core, at most 4 (a slow test's store and trace take
    a GiB or two each); PYTEST_XDIST_AUTO_NUM_WORKERS overrides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, except that each case of a parametrized test named ``*_many`` is a
    unit of its own: those are the long fuzz loops (a minute per case), and a file's worth of
    them on one worker made the slow run as long as all of them in a row."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            test = nodeid.split("::")[-1]
            if "[" in test and test.split("[", 1)[0].endswith("_many"):
                return nodeid
            return super()._split_scope(nodeid)

    return Scheduling(config, log)


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory) -> None:
    """tracelat's cache (the vega-embed bundle) in the worker's own folder, not the user's; the
    CLI processes a test starts inherit it."""
    if not os.environ.get("TRACELAT_CACHE_DIR"):
        os.environ["TRACELAT_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "t.duckdb"


@pytest.fixture
def con(db_path: Path):
    from pipeline import store

    c = store.connect(db_path)
    yield c
    c.close()


@pytest.fixture
def realdata() -> Path:
    if not REALDATA.is_dir():
        pytest.skip(f"real data folder {REALDATA} is absent")
    return REALDATA


@pytest.fixture(scope="session")
def chromium(tmp_path_factory):
    """Headless Chromium after a preflight on a trivial page (tests/headless.py): skipped
    only when the browser itself cannot run; failures on our pages are test failures."""
    from .headless import browser_or_skip

    return browser_or_skip(tmp_path_factory.mktemp("chromium"))


@pytest.fixture
def string_channels(monkeypatch) -> list:
    """Chart channels built from a shorthand string while the test runs (assert the list is empty).

    Altair builds a channel given as a string ("t_s:Q") by hashing every schema class it has,
    about 5 ms a channel; tracelat's charts pass channel objects (alt.X(...)) instead."""
    from altair.utils import schemapi

    seen: list = []
    real_init = schemapi._FromDict.__init__
    monkeypatch.setattr(schemapi._FromDict, "__init__", lambda self, *a: seen.append(1) or real_init(self, *a))
    return seen
