"""Every file an ingest opens is closed by it, plain or compressed: a leaked handle is closed
only by the garbage collector (a ResourceWarning), and a nightly run over many files could run
out of descriptors meanwhile."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import zstandard

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
