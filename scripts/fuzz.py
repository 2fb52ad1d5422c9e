"""Mutation fuzzing of ``tracelat ingest``: damaged copies of every fixture format.

Each case takes one fixture, applies one or two seeded mutations (byte flips,
truncation, wrong types, extreme numbers, NaN, unicode, long lines, deep nesting,
BOM/CRLF/NUL, gzip damage, lines of other formats, a damaged first line) and
ingests it in-process through ``pipeline.cli.main`` into one store per format,
which already holds a baseline run.  Every case must

- end with exit code 0 or 2 (never 3 "internal error", never 130 "Aborted."),
- take under ``--max-seconds`` (10 s),
- leave every ingest with ``lines_read = accepted + rejected + skipped``,
- store no non-finite value, and
- leave the baseline run exactly as it was.

Run ``python scripts/fuzz.py --cases 2000`` for N cases per format; it prints the
outcome counts per format and every violation (exit 1 if any).  ``--readers``: the
server logs read by DuckDB's line reader must give the same store (or the same error)
as with the Python line reader, case by case.  The test suite
(tests/ingest/test_fuzz.py) runs a few cases per format through the same code.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import io
import random
import re
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "fixtures"

# format -> (fixture, suffix of the written case); parquet is made from the canonical fixture
FORMATS: dict[str, tuple[Path | None, str]] = {
    "jsonl": (FIX / "canonical" / "tiny.jsonl", ".jsonl"),
    "parquet": (None, ".parquet"),
    "vllm-log": (FIX / "vllm" / "server.log", ".log"),
    "vllm-bench": (FIX / "vllm" / "bench.json", ".json"),
    "vllm-requests": (FIX / "vllm" / "requests.jsonl", ".jsonl"),
    "trtllm-iterlog": (FIX / "trtllm" / "iteration_log.txt", ".txt"),
    "trtllm-json": (FIX / "trtllm" / "metrics.json", ".json"),
    "sglang-log": (FIX / "sglang" / "server.log", ".log"),
    "sglang-metrics": (FIX / "sglang" / "sglang-request-metrics-20260301_10.log", ".log"),
    "genai-perf": (FIX / "genai_perf" / "profile_export.json", ".json"),
    "aiperf": (None, ".jsonl"),
    "llmservingsim-meta": (FIX / "llmservingsim" / "meta.json", ".json"),
    "llmservingsim-timeseries": (FIX / "llmservingsim" / "timeseries.csv", ".csv"),
}
# files a format reads beside the damaged one (kept intact): the timeseries' t counts from meta.json
COMPANIONS: dict[str, tuple[Path, ...]] = {"llmservingsim-timeseries": (FIX / "llmservingsim" / "meta.json",)}

AIPERF_LINES = [
    '{"metadata": {"x_request_id": "r%d", "request_start_ns": %d, "request_end_ns": %d, "worker_id": "w0"}, '
    '"metrics": {"time_to_first_token": {"value": 12.5, "unit": "ms"}, "request_latency": {"value": 80.0, "unit": "ms"}, '
    '"inter_chunk_latency": {"value": [5.0, 6.0, 7.0], "unit": "ms"}, "input_sequence_length": {"value": 100}, '
    '"output_sequence_length": {"value": 4}}, "error": null}'
    % (i, 1_772_359_200_000_000_000 + i * 10**8, 1_772_359_200_080_000_000 + i * 10**8)
    for i in range(12)
]

EXTREMES = [
    "1e308",
    "1e309",
    "-1e309",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "NaN",
    "Infinity",
    "-Infinity",
    "-0",
    "1e-320",
    "0",
    "-1",
    "4e18",
    "10000000000000000000000000000000000000000",
]
WRONG = ['"x"', '""', "[]", "{}", "null", "true", '[1, "a"]', '{"a": 1}', '"1e309"', "[[1]]"]
UNICODE = ["\u202e", "\x1b[2J", "\ud83d\ude00", "\u0000", "\ufeff", "é", "\u2028", "\x7f", "\x85"]
NUMBER = re.compile(rb"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])")


def fixture_bytes(fmt: str, tmp: Path) -> bytes:
    path, _ = FORMATS[fmt]
    if fmt == "aiperf":
        return ("\n".join(AIPERF_LINES) + "\n").encode()
    if fmt == "parquet":
        import duckdb

        out = tmp / "_fixture.parquet"
        con = duckdb.connect()
        # canonical columns as a writer of Parquet traces would lay them out
        con.execute(
            f"copy (select * from read_json('{FIX / 'canonical' / 'tiny.jsonl'}', format='newline_delimited', "
            f"union_by_name=true)) to '{out}' (format parquet)"
        )
        con.close()
        return out.read_bytes()
    assert path is not None
    return path.read_bytes()


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def _pick_number(rng: random.Random, data: bytes) -> re.Match | None:
    found = list(NUMBER.finditer(data[:200_000]))
    return rng.choice(found) if found else None


def _replace_number(rng: random.Random, data: bytes, choices: list[str]) -> bytes:
    m = _pick_number(rng, data)
    if m is None:
        return data
    return data[: m.start()] + rng.choice(choices).encode() + data[m.end() :]


def m_byte_flip(rng, data, others):
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if b:
            b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b)


def m_truncate(rng, data, others):
    return data[: rng.randrange(len(data) + 1)] if data else data


def m_wrong_type(rng, data, others):
    return _replace_number(rng, data, WRONG)


def m_extreme(rng, data, others):
    out = data
    for _ in range(rng.randint(1, 4)):
        out = _replace_number(rng, out, EXTREMES)
    return out


def m_unicode(rng, data, others):
    at = rng.randrange(len(data) + 1)
    junk = "".join(rng.choice(UNICODE) for _ in range(rng.randint(1, 5)))
    return data[:at] + junk.encode("utf-8", errors="surrogatepass") + data[at:]


def m_bad_utf8(rng, data, others):
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.choice([b"\xff\xfe", b"\xed\xa0\x80", b"\xc3", b"\x80\x80"]) + data[at:]


def m_long_line(rng, data, others):
    lines = _lines(data)
    i = rng.randrange(len(lines))
    lines[i] = lines[i] + b" " + b"x" * rng.choice([10_000, 200_000, 1_100_000])
    return b"\n".join(lines)


def m_deep_nesting(rng, data, others):
    depth = rng.choice([200, 970, 5000, 50_000])
    kind = rng.choice(["list", "dict", "pydict"])
    if kind == "list":
        nest = b"[" * depth + b"1" + b"]" * depth
    elif kind == "dict":
        nest = b'{"a":' * depth + b"1" + b"}" * depth
    else:
        nest = b"{'a': " * depth + b"1" + b"}" * depth
    m = _pick_number(rng, data)
    if m is None or rng.random() < 0.3:
        return nest + b"\n" + data
    return data[: m.start()] + nest + data[m.end() :]


def m_bom_crlf_nul(rng, data, others):
    what = rng.choice(["bom", "crlf", "nul", "cr"])
    if what == "bom":
        return b"\xef\xbb\xbf" + data
    if what == "crlf":
        return data.replace(b"\n", b"\r\n")
    if what == "cr":
        return data.replace(b"\n", b"\r")
    at = rng.randrange(len(data) + 1)
    return data[:at] + b"\x00" * rng.randint(1, 4) + data[at:]


def m_gzip(rng, data, others):
    z = bytearray(gzip.compress(data, mtime=0))
    what = rng.choice(["truncate", "flip", "intact"])
    if what == "truncate":
        return bytes(z[: rng.randrange(2, len(z))])
    if what == "flip":
        for _ in range(rng.randint(1, 4)):
            z[rng.randrange(10, len(z))] = rng.randrange(256)
    return bytes(z)


def m_other_format(rng, data, others):
    lines = _lines(data)
    donor = _lines(rng.choice(others))
    for _ in range(rng.randint(1, 3)):
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(donor)[:5000])
    return b"\n".join(lines)


def m_damage_first_line(rng, data, others):
    lines = _lines(data)
    lines[0] = rng.choice([b"garbage", lines[0][: len(lines[0]) // 2], b"\x00\x01", b"{", b"", b"# comment"])
    return b"\n".join(lines)


def m_python_keys(rng, data, others):
    """Python-literal hazards (TRT-LLM's dict repr, vLLM's non-default args)."""
    junk = rng.choice(
        [
            b"(1, 2)",
            b"[1]",
            b"{1}",
            b"frozenset()",
            b"10**400",
            b"1" * 5000,
            b"{[1]: 2}",
            b"{(1,): 2}",
            b"{1, 2}",
            b"__import__('os')",
            b"1j",
            b"...",
            b"b'x'",
        ]
    )
    lines = _lines(data)
    i = rng.randrange(len(lines))
    line = lines[i]
    key = re.search(rb"'[A-Za-z_]+': ", line) or re.search(rb"\{", line)
    if key is None:
        lines[i] = line + b" " + junk
    else:
        pos = key.start() + (1 if line[key.start() : key.start() + 1] == b"{" else 0)
        lines[i] = line[:pos] + junk + b": 1, " + line[pos:]
    return b"\n".join(lines)


def m_duplicate_lines(rng, data, others):
    lines = _lines(data)
    i = rng.randrange(len(lines))
    lines[i:i] = [lines[i]] * rng.randint(1, 3)
    return b"\n".join(lines)


MUTATIONS = [
    m_byte_flip,
    m_truncate,
    m_wrong_type,
    m_extreme,
    m_unicode,
    m_bad_utf8,
    m_long_line,
    m_deep_nesting,
    m_bom_crlf_nul,
    m_gzip,
    m_other_format,
    m_damage_first_line,
    m_python_keys,
    m_duplicate_lines,
]


@dataclass
class Outcome:
    fmt: str
    case: int
    mutations: list[str]
    exit_code: int
    seconds: float
    message: str
    problems: list[str] = field(default_factory=list)


def run_cli(args: list[str]) -> tuple[int, str]:
    """``tracelat ARGS`` in this process: exit code and the text written to stdout and stderr."""
    from pipeline.cli import main

    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException as exc:  # noqa: BLE001 - anything escaping main() is a finding
            code = -1
            out.write(f"escaped main(): {type(exc).__name__}: {exc}")
    return code, out.getvalue()


BASELINE_SQL = """
select (select count(*) || ':' || coalesce(sum(hash(iter, t_start, t_end, prefill_tokens, decode_tokens)), 0)
        from iterations where run_id = 'fuzz-baseline')
    || '|' || (select count(*) || ':' || coalesce(sum(hash(req_id, t_arrival, t_first_token, t_finish)), 0)
        from requests where run_id = 'fuzz-baseline')
    || '|' || (select count(*) from tokens where run_id = 'fuzz-baseline')
    || '|' || (select count(*) from runs where run_id = 'fuzz-baseline')
"""

NONFINITE_SQL = """
select (select count(*) from iterations where not (isfinite(coalesce(t_start, 0)) and isfinite(coalesce(t_end, 0))
          and isfinite(coalesce(dur_ms, 0)) and isfinite(coalesce(kv_usage, 0))))
     + (select count(*) from requests where not (isfinite(coalesce(t_arrival, 0)) and isfinite(coalesce(t_scheduled, 0))
          and isfinite(coalesce(t_first_token, 0)) and isfinite(coalesce(t_finish, 0))))
     + (select count(*) from tokens where not (isfinite(coalesce(t, 0)) and isfinite(coalesce(itl_ms, 0))))
"""

SUMS_SQL = (
    "select path, lines_read, lines_accepted, lines_rejected, lines_skipped from ingests "
    "where lines_read <> lines_accepted + lines_rejected + lines_skipped"
)


def _store_check(db: Path, baseline: str | None) -> tuple[str, list[str]]:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        state = con.execute(BASELINE_SQL).fetchone()[0]
        problems = []
        if baseline is not None and state != baseline:
            problems.append(f"baseline run changed: {baseline} -> {state}")
        bad = con.execute(NONFINITE_SQL).fetchone()[0]
        if bad:
            problems.append(f"{bad} non-finite values stored")
        for row in con.execute(SUMS_SQL).fetchall():
            problems.append(f"{row[0]}: read {row[1]} != accepted {row[2]} + rejected {row[3]} + skipped {row[4]}")
        return state, problems
    finally:
        con.close()


def sources(fmt: str, workdir: Path) -> tuple[bytes, list[bytes]]:
    """The format's fixture, and the other fixtures whose lines a mutation may splice in."""
    others = [
        fixture_bytes(f, workdir)
        for f in ("jsonl", "vllm-log", "vllm-requests", "trtllm-iterlog", "sglang-log")
        if f != fmt
    ]
    return fixture_bytes(fmt, workdir), others


def mutated(fmt: str, case: int, seed: int, data: bytes, others: list[bytes]):
    """Case ``case``'s random source, mutations and damaged body: a function of seed, format and case only."""
    rng = random.Random(f"{seed}:{fmt}:{case}")
    muts = rng.sample(MUTATIONS, rng.choice([1, 1, 2]))
    body = data
    for m in muts:
        body = m(rng, body, others)
    return rng, muts, body


# Formats whose converter reads lines with DuckDB's reader, the Python line reader standing by
# (reader.lines): --readers checks that both give the same store for every damaged case.
READER_FORMATS = (
    "vllm-log",
    "sglang-log",
    "vllm-requests",
    "trtllm-iterlog",
    "sglang-metrics",
    "aiperf",
    "llmservingsim-timeseries",
)


def _companions(fmt: str, workdir: Path) -> None:
    for f in COMPANIONS.get(fmt, ()):
        shutil.copy(f, workdir / f.name)


def readers_agree(fmt: str, cases: int, workdir: Path, seed: int = 0) -> list[str]:
    """Ingest each damaged case twice, DuckDB's line reader and the Python one; the differences."""
    from pipeline import store
    from pipeline.errors import TracelatError
    from pipeline.ingest import ingest_paths, reader

    workdir.mkdir(parents=True, exist_ok=True)
    _companions(fmt, workdir)
    data, others = sources(fmt, workdir)
    problems = []
    queries = (
        "select * exclude (ingest_id) from iterations order by all",
        "select * exclude (ingest_id) from requests order by all",
        "select * exclude (ingest_id) from token_lists order by all",
        "select line_no, reason, raw from rejects order by all",
        "select * exclude (ingest_id) from runs order by all",
    )
    for case in range(cases):
        _, muts, body = mutated(fmt, case, seed, data, others)
        path = workdir / f"case{case:05d}{FORMATS[fmt][1]}"
        path.write_bytes(body)
        seen = []
        for name, lines in (("duckdb", contextlib.nullcontext), ("python", reader.python_lines)):
            db = workdir / f"{name}.duckdb"
            for p in (db, Path(str(db) + ".wal")):
                p.unlink(missing_ok=True)
            con = store.connect(db)
            try:
                with lines():
                    (res,) = ingest_paths(con, [path], fmt=fmt)
                seen.append(
                    (
                        (res.accepted, res.rejected, res.skipped, res.lines_read),
                        [con.execute(q).fetchall() for q in queries],
                    )
                )
            except TracelatError as exc:
                seen.append((type(exc).__name__, str(exc)))
            finally:
                con.close()
        if seen[0] != seen[1]:
            problems.append(
                f"{fmt} case {case} [{'+'.join(m.__name__[2:] for m in muts)}]: {str(seen[0])[:300]} != {str(seen[1])[:300]}"
            )
        path.unlink()
    return problems


def fuzz_format(
    fmt: str, cases: int, workdir: Path, seed: int = 0, max_seconds: float = 10.0, first_case: int = 0
) -> list[Outcome]:
    """Run ``cases`` mutated copies of the format's fixture; one store for all of them."""
    workdir.mkdir(parents=True, exist_ok=True)
    _companions(fmt, workdir)
    db = workdir / f"{fmt}.duckdb"
    code, text = run_cli(
        ["ingest", str(FIX / "canonical" / "tiny.jsonl"), "--run-id", "fuzz-baseline", "--db", str(db)]
    )
    if code != 0:
        raise RuntimeError(f"baseline ingest failed: {text}")
    baseline, problems = _store_check(db, None)
    assert not problems, problems
    data, others = sources(fmt, workdir)
    suffix = FORMATS[fmt][1]
    fmt_name = "trtllm-iterlog" if fmt == "trtllm-json" else fmt
    results = []
    for case in range(first_case, first_case + cases):
        rng, muts, body = mutated(fmt, case, seed, data, others)
        path = workdir / f"case{case:05d}-{hashlib.sha1(body).hexdigest()[:6]}{suffix}"
        path.write_bytes(body)
        args = ["ingest", str(path), "--db", str(db)]
        if rng.random() < 0.5:
            args += ["--format", fmt_name]
        t0 = time.perf_counter()
        code, text = run_cli(args)
        took = time.perf_counter() - t0
        out = Outcome(
            fmt,
            case,
            [m.__name__[2:] for m in muts],
            code,
            took,
            text.strip().splitlines()[-1:] and text.strip().splitlines()[-1][:300] or "",
        )
        if code not in (0, 2):
            out.problems.append(f"exit code {code}: {text.strip()[-600:]}")
        if took > max_seconds:
            out.problems.append(f"took {took:.1f} s")
        _, store_problems = _store_check(db, baseline)
        out.problems += store_problems
        if store_problems:  # report each store problem once, at the case that caused it
            baseline = _store_check(db, None)[0] if any("baseline" in p for p in store_problems) else baseline
            import duckdb

            con = duckdb.connect(str(db))
            con.execute("delete from ingests where path = ?", [str(path)])
            con.close()
        path.unlink()
        results.append(out)
    return results


def summarize(results: list[Outcome]) -> str:
    by_fmt: dict[str, Counter] = {}
    for r in results:
        c = by_fmt.setdefault(r.fmt, Counter())
        c["cases"] += 1
        c[f"exit {r.exit_code}"] += 1
        c["problems"] += bool(r.problems)
        c["max_s"] = max(c["max_s"], round(r.seconds, 2))
    lines = []
    for fmt, c in by_fmt.items():
        parts = ", ".join(f"{k} {v}" for k, v in sorted(c.items()) if k not in ("cases", "problems", "max_s"))
        lines.append(
            f"{fmt:<16} {c['cases']:>5} cases: {parts}; slowest {c['max_s']:.2f} s; "
            f"cases with problems: {c['problems']}"
        )
    return "\n".join(lines)


def _chunk(task: tuple[str, int, int, int, Path, float]) -> list[Outcome]:
    fmt, first, n, seed, work, max_seconds = task
    sys.path.insert(0, str(REPO))
    return fuzz_format(fmt, n, work / f"{fmt}-{first}", seed=seed, max_seconds=max_seconds, first_case=first)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=200, help="cases per format")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma-separated formats")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--max-seconds", type=float, default=10.0)
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="worker processes; cases are split in chunks of --chunk, each with its own store "
        "(a case's mutations depend only on seed, format and case number, so the cases are "
        "the same for any --jobs)",
    )
    ap.add_argument("--chunk", type=int, default=250, help="cases per task when --jobs > 1")
    ap.add_argument(
        "--readers",
        action="store_true",
        help=f"instead: ingest each case of {', '.join(READER_FORMATS)} with DuckDB's line reader and with "
        "the Python one, and report every case where the stores (or errors) differ",
    )
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import tempfile

    if args.readers:
        with tempfile.TemporaryDirectory(prefix="tracelat-fuzz-") as tmp:
            work = args.workdir or Path(tmp)
            fmts = [f for f in args.formats.split(",") if f in READER_FORMATS]
            problems = []
            for fmt in fmts:
                t0 = time.perf_counter()
                found = readers_agree(fmt, args.cases, work / fmt, seed=args.seed)
                print(f"{fmt}: {args.cases} cases, {len(found)} differ ({time.perf_counter() - t0:.0f} s)", flush=True)
                problems += found
            for p in problems:
                print("  " + p)
        return 1 if problems else 0

    results: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="tracelat-fuzz-") as tmp:
        work = args.workdir or Path(tmp)
        fmts = args.formats.split(",")
        if args.jobs > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            tasks = [
                (fmt, first, min(args.chunk, args.cases - first), args.seed, work, args.max_seconds)
                for fmt in fmts
                for first in range(0, args.cases, args.chunk)
            ]
            with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
                chunks = list(pool.map(_chunk, tasks))
            per_fmt = {fmt: [o for (f, *_), c in zip(tasks, chunks) if f == fmt for o in c] for fmt in fmts}
        else:
            per_fmt = {}
        t0 = time.perf_counter()
        for fmt in fmts:
            res = per_fmt.get(fmt)
            if res is None:
                t0 = time.perf_counter()
                res = fuzz_format(fmt, args.cases, work / fmt, seed=args.seed, max_seconds=args.max_seconds)
            results += res
            print(summarize(res) + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
            for r in res:
                for p in r.problems:
                    print(f"  case {r.case} [{'+'.join(r.mutations)}]: {p}", flush=True)
    bad = [r for r in results if r.problems]
    print(f"\n{len(results)} cases, {len(bad)} with problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
