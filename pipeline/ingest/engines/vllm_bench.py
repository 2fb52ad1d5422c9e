"""``vllm bench serve --save-result --save-detailed`` result JSON.

The per-request arrays (``input_lens, output_lens, ttfts, itls, latencies,
start_times, errors``) are index-aligned; entry ``i`` becomes request ``i`` and its
"line number" is ``i + 1``.  Times are the client's ``time.perf_counter()``; we keep
that clock but subtract the first start so numbers stay small (the offset is in
``meta.perf_counter_origin_s``).

Mapping, chosen so that our TTFT/TPOT/ITL equal what vLLM computed from the same
file (``calculate_metrics`` in ``vllm/benchmarks/serve.py``):

* ``t_arrival = start_time``; ``t_first_token = start + ttft``;
* ``t_finish = start + latency`` (``latency`` is ``ttft + sum(itl)`` in vLLM; we use
  that sum when ``latencies`` is absent), so ``(t_finish - t_first_token) /
  (output_tokens - 1)`` is vLLM's TPOT ``(latency - ttft) / (output_len - 1)``;
* ``token_times = t_first_token + cumsum([0] + itl)``: one entry per streamed chunk,
  so our ``itl_ms`` is vLLM's ITL (a chunk may carry several tokens, hence fewer
  token times than ``output_tokens``);
* a failed request (non-empty ``errors[i]``, or ``ttft`` 0 with no ITLs) becomes
  ``status=error`` with no first-token, finish or token times.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl

from ...errors import InputError
from ... import store
from ..load import Batch
from . import _common as c

ARRAYS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors", "queue_times")
SUMMARY_KEYS = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "max_concurrent_requests",
)


def sniff(path: Path, head: str) -> bool:
    text = head.lstrip()
    return text.startswith("{") and ('"ttfts"' in head or '"mean_ttft_ms"' in head) and '"completed"' in head


def _documents(path: Path) -> list[dict]:
    """One result, or several (``--append-result`` writes one JSON object per line)."""
    text = c.read_document_text(path)
    try:
        doc = json.loads(text)
        return [doc] if isinstance(doc, dict) else []
    except RecursionError as exc:
        raise InputError(f"{path}: JSON nested too deeply to read; the file is damaged or not this format") from exc
    except json.JSONDecodeError:
        pass  # not one document: one result per line (--append-result), below
    except ValueError as exc:  # an integer of more than 4300 digits (Python's conversion limit)
        raise InputError(f"{path}: not a vllm bench result this tool can read ({exc}); the file is damaged") from exc
    docs = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            raise InputError(
                f"{path}:{n}: not a vllm bench result (invalid JSON: {exc}); "
                "the file is neither one JSON document nor one per line"
            ) from exc
        if not isinstance(doc, dict):
            raise InputError(f"{path}:{n}: not a vllm bench result (a JSON {type(doc).__name__}, not an object)")
        docs.append(doc)
    return docs


SCHEMA = {
    "input_lens": pl.Int64,
    "output_lens": pl.Int64,
    "ttfts": pl.Float64,
    "itls": pl.List(pl.Float64),
    "latencies": pl.Float64,
    "start_times": pl.Float64,
    "errors": pl.String,
    "queue_times": pl.Float64,
}
_SQL_TYPE = {pl.Int64: "bigint", pl.Float64: "double", pl.String: "varchar", pl.List(pl.Float64): "double[]"}

# Each entry of a damaged array, typed by DuckDB from its JSON text: ``bad`` when it holds a
# value (not null) that does not cast, or a list with an element that does not.  A number
# written as a string ("0.007") would cast: ``str`` marks it (and a list holding one), since
# vllm bench writes numbers and the canonical format rejects strings there too.
_ENTRIES_SQL = """
select case when t = 'VARCHAR' then x->>'$' when t = 'NULL' then null else x::varchar end as text, x::varchar as json,
  try_cast(x as {typ}) as v, t,
  t = 'VARCHAR' or (t = 'ARRAY' and list_bool_or(list_transform(json_type(x, '$[*]'), lambda e: e = 'VARCHAR')))
    as str
from (select i, xs[i + 1] as x, json_type(xs[i + 1]) as t
      from (select json_extract($doc::json, '$[*]') as xs), range(len(xs)) r(i)) order by i
"""


_WANT = {pl.Int64: "an integer", pl.Float64: "a number", pl.List(pl.Float64): "a list of numbers"}


def _column(key: str, vals: list) -> tuple[pl.Series, pl.Series | None]:
    """The array as a typed column, and each entry's problem (None when there is none).

    Well-formed arrays take the strict fast path.  Otherwise DuckDB types every entry from
    the array's JSON text: an entry that does not cast makes its request a reject naming the
    array, the value and what is wrong with it, not the file an error.
    """
    dtype = SCHEMA[key]
    try:
        return pl.Series(key, vals, dtype=dtype, strict=True), None
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        pass
    con = store.scratch()
    try:
        # json.dumps writes NaN/Infinity, which DuckDB's JSON reader accepts
        df = store.frame(con, _ENTRIES_SQL.format(typ=_SQL_TYPE[dtype]), {"doc": json.dumps(vals)}, rows=len(vals))
    finally:
        con.close()
    if dtype == pl.String:  # error texts: any value is shown as its text
        return df["text"].alias(key), None
    col = df["v"]
    short = None
    if isinstance(dtype, pl.List):
        short = (col.list.len() > col.list.drop_nulls().list.len()).fill_null(False)
        col = pl.select(pl.when(pl.lit(short)).then(None).otherwise(pl.lit(col))).to_series()
    got = pl.format("{}: expected {}, got {}", pl.lit(key), pl.lit(_WANT[dtype]), pl.col("json").str.slice(0, 40))
    number = pl.col("t").is_in(["UBIGINT", "BIGINT", "DOUBLE"])
    problem = df.with_columns(short=pl.lit(short) if short is not None else pl.lit(False)).select(
        pl.when(pl.col("str").fill_null(False))
        .then(got + pl.lit(" (a string: write the number without quotes)"))
        .when(number & pl.col("v").is_null())
        .then(
            pl.format(
                "{}: {} is out of range for {}", pl.lit(key), pl.col("text").str.slice(0, 40), pl.lit(_WANT[dtype])
            )
        )
        .when((pl.col("t") != "NULL") & pl.col("v").is_null())
        .then(got)
        .when(pl.col("short"))
        .then(got + pl.lit(" (a null or a value that is no number in the list)"))
    )
    return col.cast(dtype).alias(key), problem.to_series()


def _frame(doc: dict, path: Path) -> pl.DataFrame:
    """The per-request arrays as columns, and ``wrong``: what is wrong with an entry's values, if anything."""
    if "ttfts" not in doc or "itls" not in doc:
        raise InputError(
            f"{path}: vllm bench result has no per-request arrays (ttfts, itls); "
            "re-run `vllm bench serve` with --save-result --save-detailed"
        )
    if not isinstance(doc["ttfts"], list):
        raise InputError(f"{path}: ttfts is a JSON {type(doc['ttfts']).__name__}, not an array; is --format right?")
    n = len(doc["ttfts"])
    cols, wrong = [], []
    for key in ARRAYS:
        vals = doc.get(key)
        if vals is None:
            continue
        if not isinstance(vals, list):
            raise InputError(f"{path}: {key} is a JSON {type(vals).__name__}, not an array; the file is damaged")
        if len(vals) != n:
            raise InputError(
                f"{path}: array {key} has {len(vals)} entries but ttfts has {n}; the file is cut or edited"
            )
        col, problem = _column(key, vals)
        cols.append(col)
        if problem is not None:
            wrong.append(pl.lit(problem))
    df = pl.DataFrame(cols)
    reason = pl.concat_list(wrong).list.drop_nulls().list.join("; ") if wrong else pl.lit("")
    return df.with_columns(wrong=pl.when(reason.str.len_chars() > 0).then(pl.lit("vllm bench entry: ") + reason))


def _requests(df: pl.DataFrame, origin: float) -> pl.DataFrame:
    """Request records of the entries without a wrong-typed value (``df`` has ``idx``)."""
    df = df.filter(pl.col("wrong").is_null())
    n = df.height
    for missing in ("latencies", "start_times", "errors", "queue_times"):
        if missing not in df.columns:
            df = df.with_columns(pl.lit(None, pl.Float64 if missing != "errors" else pl.String).alias(missing))
    failed = (pl.col("errors").fill_null("").str.len_chars() > 0) | (
        (pl.col("ttfts").fill_null(0.0) == 0.0) & (pl.col("itls").list.len().fill_null(0) == 0)
    )
    start = pl.col("start_times").fill_null(origin) - origin
    latency = pl.coalesce(pl.col("latencies"), pl.col("ttfts") + pl.col("itls").list.sum())
    first = start + pl.col("ttfts")
    ok = pl.when(~failed)
    # the token times and a missing latency are derived from the TTFT: a NaN or infinite one is
    # its own reject, and must not come back as a second reason under itls or latencies
    derived = pl.when(~failed & first.is_finite())
    finish = pl.when(~failed & (pl.col("latencies").is_not_null() | first.is_finite()))
    return (
        df.with_columns(failed=failed).select(
            line_no=pl.col("idx").cast(pl.Int64) + 1,
            req_id=pl.col("idx").cast(pl.String),
            t_arrival=start,
            t_first_token=ok.then(first),
            t_finish=finish.then(start + latency),
            prompt_tokens=pl.col("input_lens"),
            output_tokens=ok.then(pl.col("output_lens")),
            status=pl.when(pl.col("failed")).then(pl.lit("error")).otherwise(pl.lit("ok")),
            token_times=derived.then(
                pl.concat_list(pl.lit(0.0), pl.col("itls")).list.eval(pl.element().cum_sum()) + first
            ),
            error=pl.when(pl.col("errors").fill_null("") != "").then(pl.col("errors")),
            client_queue_s=pl.col("queue_times"),
        )
        if n
        else pl.DataFrame()
    )


def _run(doc: dict, origin: float, has_starts: bool) -> dict:
    reported = {k: v for k, v in doc.items() if k.endswith("_ms") and isinstance(v, (int, float))}
    meta = {
        k: doc.get(k)
        for k in (
            "backend",
            "endpoint_type",
            "label",
            "tokenizer_id",
            "num_prompts",
            "request_rate",
            "burstiness",
            "max_concurrency",
            "date",
        )
    }
    meta.update(
        source_format="vllm-bench",
        perf_counter_origin_s=origin,
        arrival_times_known=has_starts,
        reported=reported,
        bench_summary={k: doc.get(k) for k in SUMMARY_KEYS if doc.get(k) is not None},
        token_times_are="streamed chunk arrival times (one per SSE chunk); itl_ms is per chunk as in vLLM",
    )
    model = doc.get("model_id")
    return {"engine": "vllm", "model": None if model is None else str(model), "clock": "monotonic", "meta": meta}


def convert(path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None) -> Iterator[Batch]:
    docs = _documents(path)
    if not docs:
        raise InputError(f"{path}: no vllm bench result object found")
    first_line = 1
    for k, doc in enumerate(docs):
        df = _frame(doc, path).with_row_index("idx")
        starts = df["start_times"].filter(df["start_times"].is_finite()) if "start_times" in df.columns else None
        if df.height and (starts is None or not starts.len()):
            # every arrival would sit at 0: durations, throughput, goodput and clock alignment wrong
            raise InputError(
                f"{path}: vllm bench result{f' {k + 1}' if len(docs) > 1 else ''} has no start_times "
                "(older benchmark_serving.py results lack them): the requests' arrival times are unknown, "
                "so the run's duration, throughput and goodput cannot be computed; save the result with "
                "`vllm bench serve --save-result --save-detailed`, which records them"
            )
        # an entry without its start time has no arrival: rejected, not put at the origin
        if df.height:
            df = df.with_columns(
                wrong=pl.coalesce(
                    pl.col("wrong"),
                    pl.when(~pl.col("start_times").is_finite().fill_null(False)).then(
                        pl.lit("vllm bench entry without a start_times value (its arrival time is unknown)")
                    ),
                )
            )
        origin = float(starts.min()) if starts is not None and starts.len() else 0.0
        run = _run(doc, origin, df.height > 0)
        if len(docs) > 1:  # several appended results: one run each
            run["run_id"] = f"{run_name or c.stem(path)}-{k + 1}"
        req = _requests(df, origin)
        records = None
        if req.height:
            req = req.with_columns(pl.col("line_no") + (first_line - 1))  # entries are numbered through the file
            records = c.encode(
                req,
                "request",
                ("error", "client_queue_s"),
                sources={
                    "prompt_tokens": "input_lens",
                    "output_tokens": "output_lens",
                    "t_arrival": "start_times",
                    "t_first_token": "ttfts",
                    "t_finish": "latencies",
                    "token_times": "itls",
                },
            )
        rejects = df.filter(pl.col("wrong").is_not_null()).select(
            line_no=pl.col("idx").cast(pl.Int64) + first_line,
            reason="wrong",
            raw=pl.lit("entry ") + pl.col("idx").cast(pl.String) + pl.lit(" of the per-request arrays"),
        )
        first_line += df.height
        yield c.batch(records, df.height, run=run, rejects=rejects, positional_ids=True)
