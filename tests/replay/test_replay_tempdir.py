"""A killed ``replay --ingest`` leaves its scratch folder; the next replay removes it (issue 15 item 15)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from pipeline.commands import replay


def test_stale_folders_of_dead_replays_are_removed(tmp_path, monkeypatch):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # a process that has exited
    stale = tmp_path / f"tracelat-replay-{dead_pid}-abc"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "replay.jsonl").write_text("x" * 1000)
    live = tmp_path / f"tracelat-replay-{os.getpid()}-def"
    live.mkdir()
    other = tmp_path / "tracelat-replay-notapid-x"
    other.mkdir()
    assert replay.remove_stale_temp_dirs(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and other.exists()

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stale.mkdir()
    tmp = replay.replay_temp_dir()  # what replay --ingest calls: cleans first, then names itself
    try:
        assert not stale.exists()
        assert os.path.basename(tmp.name).startswith(f"tracelat-replay-{os.getpid()}-")
    finally:
        tmp.cleanup()
