"""A lake is data from anyone: its commit journals and lock file must not lead a reader out of it.

Every read of a lake finishes a killed writer's commit (pipeline.lake.settle); the journal it
follows is a file in the lake, so a hostile one could name paths outside (``../x``) to move or
delete. These tests plant such lakes and check that nothing outside them changes.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from pipeline.cli import run_captured
from pipeline.lake import part_name

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "fixtures" / "canonical" / "tiny.jsonl"
PART = part_name("tiny")  # the run the file names for itself


@pytest.fixture
def lake(tmp_path) -> Path:
    """A real lake of one run, beside a victim folder and a payload inside the lake."""
    lake = tmp_path / "lake"
    code, out = run_captured("ingest", TINY, "--run-id", "t", "--lake", lake)
    assert code == 0, out
    assert (lake / "runs" / PART).is_dir()
    victim = tmp_path / "outside" / "victimdir"
    victim.mkdir(parents=True)
    (victim / "keep.txt").write_text("secret")
    (lake / "outside").mkdir()
    (lake / "outside" / "planted.sh").write_text("echo pwned")
    return lake


def _journal(lake: Path, body: dict) -> Path:
    hexid = uuid.uuid4().hex
    (lake / f".staging-{hexid}" / "runs").mkdir(parents=True)
    body = {"staging": f".staging-{hexid}", **body}
    j = lake / f".commit-{hexid}.json"
    j.write_text(json.dumps(body))
    return j


def _outside_untouched(lake: Path) -> None:
    out = lake.parent / "outside"
    assert (out / "victimdir" / "keep.txt").read_text() == "secret"
    assert sorted(p.name for p in out.iterdir()) == ["victimdir"]  # nothing planted beside it


@pytest.mark.parametrize("command", [("runs",), ("summary", "tiny")])
@pytest.mark.parametrize(
    "body",
    [
        # the reviewer's journal: move a payload out, then delete a folder outside the lake
        {
            "parts": [["runs", "../../outside/planted.sh"], ["runs", "../../outside/victimdir"]],
            "delete": [["runs", "../../outside/victimdir"]],
        },
        {"parts": [["../outside", PART]], "delete": []},
        {"parts": [["runs", "run_id=t/../../../outside/victimdir"]], "delete": []},
    ],
)
@pytest.mark.long
def test_a_journal_naming_paths_outside_the_lake_is_refused(lake, body, command):
    j = _journal(lake, body)
    code, out = run_captured(*command, "--lake", lake)
    assert code == 2, out
    assert f"commit journal {j.name}" in out and "not written by tracelat" in out
    _outside_untouched(lake)
    assert (lake / "outside" / "planted.sh").exists()
    assert j.exists()  # kept for the user to look at


def test_a_staging_folder_outside_the_lake_is_refused(lake):
    j = _journal(lake, {"parts": [["runs", PART]], "delete": [["runs", PART]]})
    body = json.loads(j.read_text())
    body["staging"] = str(lake.parent / "outside")
    j.write_text(json.dumps(body))
    code, out = run_captured("runs", "--lake", lake)
    assert code == 2 and "staging folder outside the lake" in out, out
    _outside_untouched(lake)
    assert (lake / "runs" / PART).is_dir()


def test_links_planted_in_the_staging_folder_are_not_followed(lake):
    """A well-formed journal, but the staging folder's trash is a link out: the old partition
    would be moved into the victim's folder."""
    j = _journal(lake, {"parts": [["runs", PART]], "delete": [["runs", PART]]})
    staging = lake / json.loads(j.read_text())["staging"]
    (staging / ".old").symlink_to(lake.parent / "outside", target_is_directory=True)
    code, out = run_captured("runs", "--lake", lake)
    assert code == 2 and "leads out of the lake" in out, out
    _outside_untouched(lake)
    assert (lake / "runs" / PART).is_dir()


def test_a_lock_file_that_is_a_link_creates_nothing(lake, tmp_path):
    target = tmp_path / "touched-by-lake"
    (lake / ".lock").unlink()
    (lake / ".lock").symlink_to(target)
    _journal(lake, {"parts": [], "delete": []})  # a commit to finish makes a reader take the lock
    code, out = run_captured("runs", "--lake", lake)
    assert code == 0 and "tiny" in out, out  # read as it is
    assert not target.exists()
    code, out = run_captured("ingest", TINY, "--run-id", "u", "--lake", lake)  # a writer refuses
    assert code == 2 and "not a link" in out, out
    assert not target.exists()


def test_a_writers_own_journal_still_finishes(lake):
    """The checks pass what a killed writer leaves: a partition staged, its journal written."""
    j = _journal(lake, {"parts": [["runs", PART]], "delete": [["runs", PART]]})
    code, out = run_captured("runs", "--lake", lake)
    assert code == 0, out
    assert not j.exists() and not (lake / "runs" / PART).exists()  # the journal's delete was done
    _outside_untouched(lake)
