"""store.unoptimised(): DuckDB's optimiser off inside, then as it was; and the ingests that use it
(the staging of a small file or batch) leave the store's connection as they found it."""

from __future__ import annotations

import gzip
from pathlib import Path

import duckdb
import pytest

from pipeline import ingest, store

FIX = Path(__file__).resolve().parents[2] / "fixtures"
SETTING = "select current_setting('enable_optimizer')"


def _on(con) -> bool:
    return con.execute(SETTING).fetchall()[0][0]


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
