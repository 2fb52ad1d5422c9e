"""store.unoptimised(): DuckDB's optimiser off inside, then as it was; and the ingests that use it
(the staging of a small file or batch) leave the store's connection as they found it."""

from __future__ import annotations

import gzip
from pathlib import Path

import duckdb
import pytest

from pipeline import ingest, store
from pipeline.errors import InputError
from pipeline.ingest import load

FIX = Path(__file__).resolve().parents[2] / "fixtures"

# DuckDB 1.5 (the dependency floor) has the pragmas but shows no setting to read
pytestmark = pytest.mark.skipif(
    store.optimiser_on(duckdb.connect()) is None, reason="this DuckDB does not show whether its optimiser is on"
)


def _on(con) -> bool:
    return store.optimiser_on(con)


def test_off_inside_and_back_on_after_even_on_an_error():
    con = duckdb.connect()
    with store.unoptimised(con):
        assert not _on(con)
    assert _on(con)
    with pytest.raises(duckdb.Error), store.unoptimised(con):
        con.execute("select * from no_such_table")
    assert _on(con)
    with store.unoptimised(con, when=False):
        assert _on(con)
    assert _on(con)


def test_left_off_when_it_was_off_and_other_cursors_keep_theirs():
    con = duckdb.connect()
    other = con.cursor()
    con.execute("pragma disable_optimizer")
    with store.unoptimised(con):
        assert not _on(con) and _on(other)
    assert not _on(con) and _on(other)


def _gzipped_copy(src: Path, tmp_path: Path) -> Path:
    path = tmp_path / (src.name + ".gz")
    path.write_bytes(gzip.compress(src.read_bytes()))
    return path


@pytest.mark.parametrize("optimiser", [True, False])
def test_small_ingests_leave_the_setting_as_they_found_it(tmp_path, optimiser):
    # the file-wide staging (a plain canonical file), the batch path (gzipped) and a converter's
    # batch with its run record (SGLang log): each stages without the optimiser
    con = store.connect(tmp_path / "s.duckdb")
    if not optimiser:
        con.execute("pragma disable_optimizer")
    tiny = FIX / "canonical" / "tiny.jsonl"
    for i, path in enumerate([tiny, _gzipped_copy(tiny, tmp_path), FIX / "sglang" / "server.log"]):
        (res,) = ingest.ingest_paths(con, [path], run_id=f"r{i}", tz="UTC")
        assert res.accepted > 0
        assert _on(con) is optimiser, path.name
    con.close()


def test_a_failure_inside_a_transaction_keeps_its_own_error_and_rollback_restores_the_optimiser():
    # DuckDB takes nothing but ROLLBACK in a transaction a failed statement aborted: the pragma
    # that turns the optimiser back on must not replace the real error, and the rollback owes it
    con = duckdb.connect()
    with pytest.raises(duckdb.Error, match="the real cause"), store.transaction(con), store.unoptimised(con):
        con.execute("select error('the real cause')")
    assert _on(con)


def test_a_staging_statement_that_fails_in_the_file_transaction(tmp_path, monkeypatch):
    # a converter's batch is staged inside the file's transaction (an out-of-memory error under
    # a memory limit, say): the user sees that error, and the next file is staged as before
    real = load._Scope._run

    def failing(self, sql, params, fetch):
        if "typed_in" in sql:
            self.con.execute("select error('boom: the real cause')")
        return real(self, sql, params, fetch)

    con = store.connect(tmp_path / "s.duckdb")
    monkeypatch.setattr(load._Scope, "_run", failing)
    with pytest.raises(InputError, match="boom: the real cause"):
        ingest.ingest_paths(con, [FIX / "vllm" / "requests.jsonl"], run_id="a")
    assert _on(con)
    monkeypatch.setattr(load._Scope, "_run", real)
    (res,) = ingest.ingest_paths(con, [FIX / "vllm" / "requests.jsonl"], run_id="b")
    assert res.accepted > 0 and _on(con)
    con.close()
