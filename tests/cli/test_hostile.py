"""Hostile input through the command line: names and ids that try to inject or break things."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import duckdb
import pytest
from ..clirun import run_cli

TINY = Path(__file__).resolve().parents[2] / "fixtures" / "canonical" / "tiny.jsonl"


def tiny_as(tmp_path: Path, run_id: str) -> Path:
    """tiny.jsonl under another run id (its run record names the run)."""
    out = tmp_path / f"{len(list(tmp_path.glob('*.jsonl')))}.jsonl"
    lines = TINY.read_text().splitlines()
    head = json.loads(lines[0])
    head["run_id"] = run_id
    out.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    return out


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=cwd)


@pytest.mark.parametrize("name", ['a"b.duckdb', 'range"(1); commit; drop table requests; begin; --.duckdb'])
@pytest.mark.long
def test_store_file_name_is_not_sql(tmp_path, name):
    # the second ingest rebuilds the derived tables per run, over views naming the database
    db = str(tmp_path / name)
    for run_id in ("one", "two"):
        r = run("ingest", str(tiny_as(tmp_path, run_id)), "--db", db)
        assert r.returncode == 0, r.stderr
    r = run("summary", "one", "--db", db, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ttft_ms"]["count"] == 2
    con = duckdb.connect(db, read_only=True)
    try:
        # tiny.jsonl holds 3 requests per run; an injected "drop table requests" would leave none
        assert con.execute("select run_id, count(*) from requests group by 1 order by 1").fetchall() == [
            ("one", 3),
            ("two", 3),
        ]
    finally:
        con.close()


ESC_RUN = "run\x1b[2J\x1b]0;pwned\x07\rX\x9b31m"
ESC_MODEL = "model\x1b[31mred\x1bc\x7f\x08\u202e"


def no_bad_chars(text: str) -> set[str]:
    """Control characters but tab and newline, and bidi formatting characters, in ``text``."""
    bidi = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    return {c for c in text if (ord(c) < 32 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F or c in bidi}


@pytest.mark.long
def test_terminal_output_holds_no_control_characters(tmp_path):
    lines = [json.loads(x) for x in TINY.read_text().splitlines()]
    lines[0] |= {"run_id": "run", "model": ESC_MODEL}
    bad = '{"kind":"request","req_id":"\\u001b[2Jr9","t_arrival":"\x1b[1Aoops"}'
    trace = tmp_path / "esc\x1b[1m.jsonl"
    trace.write_text("\n".join([*map(json.dumps, lines), bad]) + "\n")
    db = str(tmp_path / "e.duckdb")
    outputs = [
        run("ingest", str(trace), "--db", db),
        run("runs", "--db", db),
        run("summary", "run", "--db", db),
        run("rejects", "--db", db),
        run("report", "run", "--db", db, "--out", str(tmp_path / "rep")),
        run("summary", "nope\x1b[2J", "--db", db),  # the error lists the known runs
        run("summary", "run", "--db", db, "--bogus\x1b[2J"),  # click's usage error quotes the option
        run("ingest", str(tiny_as(tmp_path, ESC_RUN)), "--db", db),  # such a run id is refused
        run("summary", ESC_RUN, "--db", db),
    ]
    assert [r.returncode for r in outputs] == [0, 0, 0, 0, 0, 2, 2, 2, 2], [r.stderr for r in outputs]
    for r in outputs:
        for text in (r.stdout, r.stderr):
            assert not no_bad_chars(text), (r.args, text)
    # the names are still shown, without their escapes
    assert "modelred" in outputs[1].stdout and "red\u202e" not in outputs[1].stdout
    assert "known runs: run)" in outputs[5].stderr
    assert "\\x1b[2J\\x1b]0;pwned\\x07\\rX\\x9b31m" in outputs[7].stderr  # the refused id, escaped


FORGED = "esc\nfake: PASS"


def stored_runs(db: str) -> list[str]:
    con = duckdb.connect(db, read_only=True)
    try:
        return [
            r[0]
            for r in con.execute(
                "select run_id from runs union select run_id from run_records union select run_id from requests "
                "union select run_id from iterations union select unnest(run_ids) from ingests order by 1"
            ).fetchall()
        ]
    finally:
        con.close()


@pytest.mark.parametrize(
    "run_id",
    [FORGED, "evil\u202eSSAP", "tab\there", "cr\rX", "del\x7f", "c1\x85", "ls\u2028x", "zw\u200bsp", "bom\ufeffid"],
)
@pytest.mark.long
def test_run_id_with_control_or_bidi_characters_is_refused_at_ingest(tmp_path, run_id):
    # printed, a newline in a run id would forge a line ("fake: PASS") of `ingest`, `runs` or
    # `audit`; U+202E would reorder what is shown. The file is refused, nothing of it stored;
    # a file before it in the same command stays loaded
    db = str(tmp_path / "h.duckdb")
    good, bad = tiny_as(tmp_path, "good"), tiny_as(tmp_path, run_id)
    r = run("ingest", str(good), str(bad), "--db", db)
    assert r.returncode == 2, r.stderr
    # the file kept is said before the error; nothing of the refused one
    assert r.stdout.splitlines() == [f"{good} [jsonl]: 8 read, 8 accepted, 0 rejected; runs: good"], r.stdout
    err = r.stderr.strip()
    assert err.startswith("Error: ") and "\n" not in err, r.stderr
    assert not no_bad_chars(r.stderr)
    assert f"{bad}: run id {run_id!r} (first at line 1)" in err
    assert "rename the run id in the file" in err and "--run-id" in err
    assert "were ingested and kept" in err
    assert stored_runs(db) == ["good"]
    r = run("runs", "--db", db)
    assert r.returncode == 0 and "fake" not in r.stdout and "evil" not in r.stdout


def test_run_id_with_a_newline_is_refused_by_a_lake_ingest(tmp_path):
    lake = tmp_path / "lake"
    r = run("ingest", str(tiny_as(tmp_path, "good")), "--lake", str(lake))
    assert r.returncode == 0, r.stderr
    r = run("ingest", str(tiny_as(tmp_path, FORGED)), "--lake", str(lake))
    assert r.returncode == 2, r.stderr
    assert "run id 'esc\\nfake: PASS'" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = run("runs", "--lake", str(lake))
    assert r.returncode == 0, r.stderr
    assert "good" in r.stdout and "fake" not in r.stdout


@pytest.mark.parametrize("run_id", ["a\nb", "a\u202eb", "a\tb"])
def test_run_id_option_with_control_or_bidi_characters_is_refused(tmp_path, run_id):
    db = str(tmp_path / "o.duckdb")
    r = run("ingest", str(TINY), "--run-id", run_id, "--db", db)
    assert r.returncode == 2
    assert r.stderr.startswith(f"Error: --run-id {run_id!r}: ") and r.stderr.count("\n") == 1, r.stderr
    assert not no_bad_chars(r.stderr)
    assert not Path(db).exists() or stored_runs(db) == []


@pytest.mark.parametrize("run_id", ["", "  "])
def test_an_empty_run_id_option_is_refused(tmp_path, run_id):
    db = str(tmp_path / "o.duckdb")
    r = run("ingest", str(TINY), "--run-id", run_id, "--db", db)
    assert r.returncode == 2 and r.stderr.startswith(f"Error: --run-id {run_id!r}: empty"), r.stderr
    assert not Path(db).exists() or stored_runs(db) == []


def test_run_id_from_a_file_name_with_a_newline_is_refused(tmp_path):
    lines = [json.loads(x) for x in TINY.read_text().splitlines()]
    del lines[0]["run_id"]  # its records take the file's name
    trace = tmp_path / "x\nfake: PASS.jsonl"
    trace.write_text("\n".join(map(json.dumps, lines)) + "\n")
    db = str(tmp_path / "f.duckdb")
    r = run("ingest", str(trace), "--db", db)
    assert r.returncode == 2
    assert "'x\\nfake: PASS' from the file's name" in r.stderr and "give --run-id NAME" in r.stderr, r.stderr
    assert stored_runs(db) == []
    r = run("ingest", str(trace), "--run-id", "named", "--db", db)  # the fix it names
    assert r.returncode == 0, r.stderr
    assert stored_runs(db) == ["named"]
    # the ingest line names the file on one line, its newline escaped: no forged "fake: PASS" line
    assert not any(line.startswith("fake: PASS") for line in r.stdout.splitlines()), r.stdout
    assert "x\\nfake: PASS.jsonl' [jsonl]: " in r.stdout, r.stdout


def test_clean_drops_bidi_formatting_characters():
    from pipeline.terminal import clean

    bidi = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    assert clean(f"ok{bidi}\u202eSSAP: run\tx\ny") == "okSSAP: run\tx\ny"
    assert clean("caf\u00e9 \u4e2d\u200d") == "caf\u00e9 \u4e2d\u200d"  # other text stays
    assert clean("a\u2028b\u2029c") == "abc"  # line separators: some terminals break the line there


@pytest.mark.long
def test_run_ids_that_reduce_to_one_name_get_their_own_report_folders(tmp_path):
    db = str(tmp_path / "r.duckdb")
    for run_id in ("a/b", "a?b"):
        assert run("ingest", str(tiny_as(tmp_path, run_id)), "--db", db).returncode == 0
    where = {}
    for run_id in ("a/b", "a?b"):
        r = run("report", run_id, "--db", db, "--json", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        where[run_id] = Path(tmp_path, json.loads(r.stdout)["html"])  # the command says where it went
    assert where["a/b"].parent != where["a?b"].parent
    for run_id, html in where.items():
        assert html.parent.parent == tmp_path / "reports"
        summary = json.loads(html.with_name("summary.json").read_text())
        assert summary["run_id"] == run_id  # neither overwrote the other


def test_a_model_name_with_a_newline_forges_no_row_and_no_markdown_escape(tmp_path):
    """The run record's model is text from a log: `runs` keeps each run on one line (a newline in
    the model printed an extra row) and summary.md holds no ESC, C1 or bidi character."""
    lines = [json.loads(x) for x in TINY.read_text().splitlines()]
    model = "m\u001b[31m\u202eevil\nINJECTED line\u009b2J"
    lines[0]["model"] = model
    trace = tmp_path / "m.jsonl"
    trace.write_text("\n".join(map(json.dumps, lines)) + "\n")
    db = str(tmp_path / "m.duckdb")
    assert run("ingest", str(trace), "--db", db).returncode == 0
    r = run("runs", "--db", db)
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()
    assert len(rows) == 2 and not any(row.startswith("INJECTED") for row in rows), rows
    assert "evil INJECTED line" in rows[1]
    r = run("report", lines[0]["run_id"], "--db", db, "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep" / "summary.md").read_text()
    assert "INJECTED" in md and not any(c in md for c in "\u001b\u009b\u202e"), md


def test_a_request_id_with_a_newline_prints_no_line_of_its_own(tmp_path):
    """Request ids are kept as the log has them (they join steps to requests), so explain's list of
    worst requests shows such an id quoted and escaped: its newline would print a line that looks
    like one of ours."""
    lines = [json.loads(x) for x in TINY.read_text().splitlines()]
    forged = "r\nError: none. Audit PASS"
    for rec in lines:
        if rec.get("kind") == "request":
            rec["req_id"] = forged + rec["req_id"]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(map(json.dumps, lines)) + "\n")
    db = str(tmp_path / "t.duckdb")
    assert run("ingest", str(trace), "--db", db).returncode == 0
    r = run("explain", "tiny", "--metric", "ttft", "--db", db)
    assert r.returncode == 0, r.stderr
    assert not any(line.startswith("Error: none") for line in r.stdout.splitlines()), r.stdout
    assert repr(forged)[:-1] in r.stdout  # the id is still there, escaped


def test_rejects_prints_no_line_from_a_request_id_or_a_file_name(tmp_path):
    """`tracelat rejects` printed the stored reason (which quotes a duplicate's request id) and the
    file's name as they were: a newline in either printed a line of its own ("OK: 0 lines rejected")."""
    dup = tmp_path / "r.jsonl"
    dup.write_text(
        '{"kind":"request","req_id":"a\\nOK: 0 lines rejected","t_arrival":1.0}\n'
        '{"kind":"request","req_id":"a\\nOK: 0 lines rejected","t_arrival":2.0}\n'
    )
    named = tmp_path / "x\nOK: no rejected lines.jsonl"
    named.write_text('{"kind":"request","req_id":"b","t_arrival":1.0}\ngarbage\n')
    db = str(tmp_path / "t.duckdb")
    run("ingest", str(dup), str(named), "--run-id", "f1", "--db", db)
    r = run("rejects", "--db", db)
    assert r.returncode == 0, r.stderr
    assert not [x for x in r.stdout.splitlines() if x.startswith("OK:")], r.stdout
    assert "duplicate" in r.stdout and repr(str(named))[:-1] in r.stdout  # both still shown, escaped


def test_a_file_name_forges_no_clock_alignment_line(tmp_path):
    """The clock alignment's lines named the client's file as it was: a newline in its name printed
    a line "run al: clock alignment OK" of its own (ingest, summary, nightly warnings)."""
    steps, reqs, t = [], [], 100.0
    for i in range(200):
        d = 0.02 + (i % 7) * 0.001
        steps.append({"run_id": "al", "kind": "iteration", "iter": i, "t_start": t, "t_end": t + d,
                      "decode_tokens": 5, "decode_reqs": 5})  # fmt: skip
        t += d
    for r in range(30):
        a = 100.0 + r * 0.05
        reqs.append({"run_id": "al", "kind": "request", "req_id": f"q{r}", "t_arrival": a + 5000,
                     "t_first_token": a + 5000.04, "t_finish": a + 5000.3, "prompt_tokens": 20,
                     "output_tokens": 10})  # fmt: skip
    (tmp_path / "steps.jsonl").write_text("\n".join(map(json.dumps, steps)) + "\n")
    client = tmp_path / "req\nrun al: clock alignment OK.jsonl"
    client.write_text("\n".join(map(json.dumps, reqs)) + "\n")
    db = str(tmp_path / "t.duckdb")
    for args in (("ingest", str(tmp_path / "steps.jsonl"), str(client)), ("summary", "al")):
        r = run(*args, "--db", db)
        lines = (r.stdout + r.stderr).splitlines()
        assert not [x for x in lines if x.startswith("run al: clock alignment OK")], (args, r.stdout, r.stderr)
        assert any("req\\nrun al: clock alignment OK.jsonl" in x for x in lines), (args, r.stdout, r.stderr)


def test_paths_in_messages_are_one_line_and_shell_quoted(tmp_path):
    """An --slo path with a newline forged audit lines ("[ PASS] everything fine"); the command a
    damaged .gz suggests ran `$(...)` from its name when pasted into a shell."""
    import gzip

    db = str(tmp_path / "t.duckdb")
    assert run("ingest", str(TINY), "--db", db).returncode == 0
    slo = tmp_path / "slo.toml: PASS (0 checks)\n  [ PASS] everything fine\n#.toml"
    slo.write_text("[slo]\nttft_ms.p99 = 10\n")
    r = run("audit", "tiny", "--slo", str(slo), "--db", db)
    assert not [x for x in r.stdout.splitlines() if "everything fine" in x and "\\n" not in x], r.stdout
    bad = tmp_path / "a$(touch PWNED)b.jsonl.gz"
    bad.write_bytes(
        gzip.compress(("\n".join(['{"kind":"iteration","iter":%d,"dur_ms":1.0}' % i for i in range(2000)])).encode())[
            :5000
        ]
    )
    r = run("ingest", str(bad), "--db", db, cwd=tmp_path)
    assert r.returncode == 2 and "zcat" in r.stderr, r.stderr
    cmd = r.stderr.split("`zcat ", 1)[1].split("`", 1)[0]
    assert cmd.startswith("'") and "'$(touch PWNED)'" not in cmd, cmd  # the name is one quoted word
    subprocess.run(["bash", "-c", f"zcat {cmd} 2>/dev/null; true"], cwd=tmp_path, check=True)
    assert not (tmp_path / "PWNED").exists()
