"""Load generators' per-request results: guidellm ``benchmarks.json`` and inference-perf
``per_request_lifecycle_metrics.json``.

**guidellm** (report schema v2, ``metadata.version``): ``benchmarks[]``, each with
``requests.{successful, incomplete, errored}[]`` of ``GenerativeRequestStats``.  One run
per benchmark (``<run>-<k>`` when the file holds several).  Times are ``time.time()``::

    t_arrival     = info.timings.request_start (else resolve_start)
    t_first_token = info.timings.first_token_iteration
    t_finish      = info.timings.last_token_iteration (else request_end, resolve_end)
    prompt_tokens = input_metrics.total_tokens; output_tokens = output_metrics.total_tokens
                    (else info.timings.token_iterations, as guidellm does)
    status        = ok (successful), aborted (incomplete), error (errored)

guidellm keeps no per-token times, so ``itl_ms`` is unknown; its ITL is our TPOT.

**inference-perf** (a JSON list, one object per request)::

    t_arrival     = start_time; t_finish = end_time
    token_times   = info.response_metrics.output_token_times (else chunk_times)
    t_first_token = the first of them
    prompt_tokens = info.input_tokens (else info.request_metrics.text.input_tokens)
    output_tokens = info.response_metrics.output_tokens
    status        = error when ``error`` is set

inference-perf stamps with ``time.perf_counter()``: values below 1e9 are taken as a
``monotonic`` clock (the run says so; ingest with the server log aligns it), larger
ones as Unix seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl

from ...errors import InputError
from ..load import Batch
from . import _common as c

STATUSES = (("successful", "ok"), ("incomplete", "aborted"), ("errored", "error"))
# canonical field -> where its value is in the file (the first of the fields read), so that a
# record failing a canonical check is named as the user wrote it
GUIDELLM_SOURCES = {
    "req_id": "request_id",
    "t_arrival": "info.timings.request_start",
    "t_first_token": "info.timings.first_token_iteration",
    "t_finish": "info.timings.last_token_iteration",
    "prompt_tokens": "input_metrics.total_tokens",
    "output_tokens": "output_metrics.total_tokens",
}
INFERENCE_PERF_SOURCES = {
    "t_arrival": "start_time",
    "t_finish": "end_time",
    "token_times": "info.response_metrics.output_token_times",
    "t_first_token": "info.response_metrics.output_token_times[0]",
    "prompt_tokens": "info.input_tokens",
    "output_tokens": "info.response_metrics.output_tokens",
}
EMPTY_GUIDELLM = {
    "req_id": pl.String,
    "t_arrival": pl.Float64,
    "t_first_token": pl.Float64,
    "t_finish": pl.Float64,
    "prompt_tokens": pl.Int64,
    "output_tokens": pl.Int64,
    "status": pl.String,
    "guidellm_status": pl.String,
    "vproblem": pl.String,
}


def sniff_guidellm(path: Path, head: str) -> bool:
    return (
        head.lstrip().startswith("{")
        and '"benchmarks"' in head
        and ('"guidellm_version"' in head or '"generative_benchmark"' in head or '"scheduler_metrics"' in head)
    )


def sniff_inference_perf(path: Path, head: str) -> bool:
    text = head.lstrip()
    return (
        text.startswith("[")
        and '"start_time"' in head
        and '"end_time"' in head
        and ('"response_metrics"' in head or '"request_metrics"' in head)
    )


def _field(df: pl.DataFrame, dotted: str, dtype: pl.DataType = pl.Float64) -> pl.Expr:
    """``a.b.c`` of a frame made from nested dicts; NULL when any level is missing."""
    head, *rest = dotted.split(".")
    if head not in df.columns:
        return pl.lit(None, dtype)
    expr, schema = pl.col(head), df.schema[head]
    for name in rest:
        if not isinstance(schema, pl.Struct) or name not in {f.name for f in schema.fields}:
            return pl.lit(None, dtype)
        schema = next(f.dtype for f in schema.fields if f.name == name)
        expr = expr.struct.field(name)
    if isinstance(dtype, pl.List):
        return expr.cast(dtype, strict=False) if isinstance(schema, pl.List) else pl.lit(None, dtype)
    return expr.cast(dtype, strict=False) if not isinstance(schema, (pl.Struct, pl.List)) else pl.lit(None, dtype)


# Fields whose value is checked in each request's JSON (``(path, name, kind)``, see
# c.json_value_problem): from_dicts gives a field that is a string in one request a String
# column, and the cast below would read "0.007" as a number and "x" as absent; the check
# rejects the request naming the field, as the other converters do.
_T = "info.timings."
GUIDELLM_CHECKED = [
    *(
        (f"$.{_T}{k}", _T + k, "number")
        for k in (
            "request_start",
            "resolve_start",
            "first_token_iteration",
            "last_token_iteration",
            "request_end",
            "resolve_end",
        )
    ),
    ("$.input_metrics.total_tokens", "input_metrics.total_tokens", "count"),
    ("$.output_metrics.total_tokens", "output_metrics.total_tokens", "count"),
    (f"$.{_T}token_iterations", _T + "token_iterations", "count"),
]
_R = "info.response_metrics."
INFERENCE_PERF_CHECKED = [
    ("$.start_time", "start_time", "number"),
    ("$.end_time", "end_time", "number"),
    ("$.info.input_tokens", "info.input_tokens", "count"),
    ("$.info.request_metrics.text.input_tokens", "info.request_metrics.text.input_tokens", "count"),
    (f"$.{_R}output_tokens", _R + "output_tokens", "count"),
    (f"$.{_R}output_token_times", _R + "output_token_times", "numbers"),
    (f"$.{_R}chunk_times", _R + "chunk_times", "numbers"),
]


def _value_problems(items: list, fields: list[tuple[str, str, str]]) -> pl.Series:
    """Per item (in order): why a checked field's value is unusable, or NULL; typed by DuckDB
    from the items' JSON text (no Python loop over items)."""
    import json

    from ... import store

    con = store.scratch()
    try:
        sql = (
            f"select {c.json_problems('r', fields)} as vproblem from ("
            "select unnest(range(len(xs))) as idx, unnest(xs) as r "
            "from (select json_extract($doc::json, '$[*]') as xs)) order by idx"
        )
        # json.dumps keeps NaN/Infinity as such; DuckDB's JSON reader accepts them
        return store.frame(con, sql, {"doc": json.dumps(items)}, rows=len(items)).get_column("vproblem")
    finally:
        con.close()


def _frame(items: list, what: str, path: Path) -> pl.DataFrame:
    dicts = [x for x in items if isinstance(x, dict)] if isinstance(items, list) else []
    if len(dicts) != len(items if isinstance(items, list) else []):
        raise InputError(f"{path}: {what} holds entries that are not objects; is the file complete?")
    try:
        return pl.from_dicts(dicts, infer_schema_length=None) if dicts else pl.DataFrame()
    except (pl.exceptions.PolarsError, TypeError, ValueError) as exc:
        raise InputError(f"{path}: {what}: fields of mixed types ({exc}); is --format right?") from exc


def convert_guidellm(
    path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None
) -> Iterator[Batch]:
    doc = c.read_json_document(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise InputError(f"{path}: guidellm report without a 'benchmarks' list")
    benches = doc["benchmarks"]
    version = (doc.get("metadata") or {}).get("guidellm_version") if isinstance(doc.get("metadata"), dict) else None
    line = 1
    for k, bench in enumerate(benches):
        reqs = bench.get("requests") if isinstance(bench, dict) else None
        frames = []
        for key, status in STATUSES:
            items = (reqs or {}).get(key) or [] if isinstance(reqs, dict) else []
            df = _frame(items, f"benchmarks[{k}].requests.{key}", path)
            if not df.height:
                continue
            t = "info.timings."
            frames.append(
                df.select(
                    req_id=_field(df, "request_id", pl.String),
                    t_arrival=pl.coalesce(_field(df, t + "request_start"), _field(df, t + "resolve_start")),
                    t_first_token=_field(df, t + "first_token_iteration"),
                    t_finish=pl.coalesce(
                        _field(df, t + "last_token_iteration"),
                        _field(df, t + "request_end"),
                        _field(df, t + "resolve_end"),
                    ),
                    prompt_tokens=_field(df, "input_metrics.total_tokens", pl.Int64),
                    output_tokens=pl.coalesce(
                        _field(df, "output_metrics.total_tokens", pl.Int64),
                        _field(df, t + "token_iterations", pl.Int64),
                    ),
                    status=pl.lit(status),
                    guidellm_status=pl.lit(key),
                    vproblem=_value_problems(items, GUIDELLM_CHECKED),
                )
            )
        # a benchmark without requests still needs every column the checks below name
        df = pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame(schema=EMPTY_GUIDELLM)
        # without request_id (older guidellm) every id is a position: a second client's file
        # of the run would clash with this one (load.py names such ids after the file)
        positional = df.height > 0 and df.get_column("req_id").null_count() == df.height
        df = df.with_row_index("idx").with_columns(
            line_no=pl.col("idx").cast(pl.Int64) + line,
            req_id=pl.coalesce(pl.col("req_id"), pl.lit(f"{k}-") + pl.col("idx").cast(pl.String)),
        )
        ok = pl.col("status") == "ok"
        df = df.with_columns(
            reason=pl.coalesce(
                pl.col("vproblem"),
                c.missing_reason([("info.timings.request_start", pl.col("t_arrival"))], "guidellm request without "),
                pl.when(ok & pl.col("t_first_token").is_null()).then(
                    pl.lit("successful guidellm request without info.timings.first_token_iteration")
                ),
            )
        )
        good = df.filter(pl.col("reason").is_null()).with_columns(
            t_first_token=pl.when(ok).then(pl.col("t_first_token")), t_finish=pl.when(ok).then(pl.col("t_finish"))
        )
        meta = {
            "source_format": "guidellm-benchmarks",
            "guidellm_version": version,
            "benchmark_index": k,
            "token_times_are": "not recorded by guidellm (no itl_ms)",
        }
        if isinstance(bench, dict):
            sm = bench.get("scheduler_metrics") or {}
            cfg = bench.get("config") or {}
            meta["strategy"] = (
                (cfg.get("strategy") or {}).get("type_") if isinstance(cfg.get("strategy"), dict) else None
            )
            meta["measure_window_s"] = (
                [sm.get("measure_start_time"), sm.get("measure_end_time")]
                if isinstance(sm, dict) and sm.get("measure_start_time")
                else None
            )
        run = {"engine": "guidellm-client", "clock": "unix", "meta": meta}
        if len(benches) > 1:
            run["run_id"] = f"{run_name or c.stem(path)}-{k + 1}"
        bad = df.filter(pl.col("reason").is_not_null()).select("line_no", "reason", raw=pl.col("req_id"))
        records = c.encode(good, "request", ("guidellm_status",), sources=GUIDELLM_SOURCES)
        yield c.batch(records, df.height, run=run, rejects=bad, positional_ids=positional)
        line += df.height


def convert_inference_perf(
    path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None
) -> Iterator[Batch]:
    doc = c.read_json_document(path)
    if not isinstance(doc, list):
        raise InputError(f"{path}: inference-perf lifecycle metrics must be a JSON list of request objects")
    df = _frame(doc, "the request list", path)
    if not df.height:
        yield c.batch(None, 0)
        return
    r = "info.response_metrics."
    toks = pl.coalesce(
        _field(df, r + "output_token_times", pl.List(pl.Float64)), _field(df, r + "chunk_times", pl.List(pl.Float64))
    )
    df = (
        df.with_row_index("idx")
        .select(
            line_no=pl.col("idx").cast(pl.Int64) + 1,
            req_id=pl.col("idx").cast(pl.String),
            t_arrival=_field(df, "start_time"),
            t_finish=_field(df, "end_time"),
            token_times=toks,
            prompt_tokens=pl.coalesce(
                _field(df, "info.input_tokens", pl.Int64),
                _field(df, "info.request_metrics.text.input_tokens", pl.Int64),
            ),
            output_tokens=_field(df, r + "output_tokens", pl.Int64),
            error=pl.coalesce(
                _field(df, "error.error_type", pl.String),
                _field(df, "error.error_msg", pl.String),
                _field(df, "error", pl.String),
            ),
            vproblem=_value_problems(doc, INFERENCE_PERF_CHECKED),
        )
        .with_columns(t_first_token=pl.col("token_times").list.first())
    )
    failed = pl.col("error").is_not_null()
    df = df.with_columns(
        reason=pl.coalesce(
            pl.col("vproblem"),
            c.missing_reason([("start_time", pl.col("t_arrival"))], "inference-perf request without "),
            pl.when(~failed & pl.col("t_first_token").is_null()).then(
                pl.lit("inference-perf request without output_token_times or chunk_times (and no error)")
            ),
        )
    )
    good = df.filter(pl.col("reason").is_null()).with_columns(
        status=pl.when(failed).then(pl.lit("error")).otherwise(pl.lit("ok")),
        t_first_token=pl.when(~failed).then(pl.col("t_first_token")),
        t_finish=pl.when(~failed).then(pl.col("t_finish")),
        token_times=pl.when(~failed).then(pl.col("token_times")),
        output_tokens=pl.when(~failed).then(pl.col("output_tokens")),
    )
    first = good.get_column("t_arrival").min() if good.height else None
    clock = "unix" if first is not None and first > 1e9 else "monotonic"
    run = {
        "engine": "inference-perf-client",
        "clock": clock,
        "meta": {
            "source_format": "inference-perf-lifecycle",
            "token_times_are": "output_token_times (else chunk_times) as recorded by the client",
        },
    }
    bad = df.filter(pl.col("reason").is_not_null()).select("line_no", "reason", raw=pl.col("req_id"))
    yield c.batch(  # ids are positions in the list: a second client's file gets its own (load.py)
        c.encode(good, "request", ("error",), sources=INFERENCE_PERF_SOURCES),
        df.height,
        run=run,
        rejects=bad,
        positional_ids=True,
    )
