"""Every file an ingest opens is closed by it, plain or compressed: a leaked handle is closed
only by the garbage collector (a ResourceWarning), and a nightly run over many files could run
out of descriptors meanwhile."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from pipeline.ingest import reader

FIX = Path(__file__).resolve().parents[2] / "fixtures"

SCRIPT = """
import gc, sys
from pathlib import Path
from pipeline import store
from pipeline.ingest import ingest_paths
for i, name in enumerate(sys.argv[2:]):
    con = store.connect(Path(sys.argv[1]) / f"s{i}.duckdb")
    (res,) = ingest_paths(con, [Path(name)])
    assert res.accepted > 0, name
    con.close()
    gc.collect()
"""


@pytest.mark.long
def test_plain_gzip_and_zstd_files_are_closed_by_the_ingest(tmp_path):
    files = []
    for src in (FIX / "trtllm" / "metrics.json", FIX / "canonical" / "tiny.jsonl"):
        plain = tmp_path / src.name
        shutil.copy(src, plain)
        gz = tmp_path / (src.name + ".gz")
        gz.write_bytes(gzip.compress(src.read_bytes()))
        zst = tmp_path / (src.name + ".zst")
        zst.write_bytes(zstandard.ZstdCompressor().compress(src.read_bytes()))
        files += [plain, gz, zst]
    out = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error::ResourceWarning", "-c", SCRIPT, str(tmp_path), *map(str, files)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "unclosed" not in out.stderr, out.stderr[-2000:]
    assert "ResourceWarning" not in out.stderr, out.stderr[-2000:]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="no /proc/self/fd here")
@pytest.mark.parametrize("kind", ["plain", "gzip", "zstd"])
def test_closing_the_stream_closes_the_file_while_the_stream_is_still_held(tmp_path, kind):
    data = (FIX / "canonical" / "tiny.jsonl").read_bytes()
    path = tmp_path / {"plain": "t.jsonl", "gzip": "t.jsonl.gz", "zstd": "t.jsonl.zst"}[kind]
    path.write_bytes(
        {"plain": lambda b: b, "gzip": gzip.compress, "zstd": zstandard.ZstdCompressor().compress}[kind](data)
    )
    before = _open_fds()
    f = reader.open_binary(path)
    assert f.read() == data
    assert _open_fds() == before + 1
    f.close()
    assert _open_fds() == before  # f is still referenced here: no collector has run for it
    del f
