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
from ..load import Batch
from . import _common as c

ARRAYS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors", "queue_times")
SUMMARY_KEYS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "output_throughput", "max_concurrent_requests")


def sniff(path: Path, head: str) -> bool:
    text = head.lstrip()
    return text.startswith("{") and ('"ttfts"' in head or '"mean_ttft_ms"' in head) and '"completed"' in head


def _documents(path: Path) -> list[dict]:
    """One result, or several (``--append-result`` writes one JSON object per line)."""
    from .. import reader

    with reader.open_binary(path) as f:
        text = f.read().decode("utf-8", errors="replace")
    try:
        doc = json.loads(text)
        return [doc] if isinstance(doc, dict) else []
    except json.JSONDecodeError:
        docs = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                docs.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{n}: not a vllm bench result (invalid JSON: {exc}); "
                                 "the file is neither one JSON document nor one per line") from exc
        return docs


def _frame(doc: dict, path: Path) -> pl.DataFrame:
    if "ttfts" not in doc or "itls" not in doc:
        raise InputError(
            f"{path}: vllm bench result has no per-request arrays (ttfts, itls); "
            "re-run `vllm bench serve` with --save-result --save-detailed"
        )
    n = len(doc["ttfts"])
    cols = {}
    for key in ARRAYS:
        vals = doc.get(key)
        if vals is None:
            continue
        if len(vals) != n:
            raise InputError(f"{path}: array {key} has {len(vals)} entries but ttfts has {n}; the file is cut or edited")
        cols[key] = vals
    schema = {"input_lens": pl.Int64, "output_lens": pl.Int64, "ttfts": pl.Float64, "itls": pl.List(pl.Float64),
              "latencies": pl.Float64, "start_times": pl.Float64, "errors": pl.String, "queue_times": pl.Float64}
    return pl.DataFrame(cols, schema={k: v for k, v in schema.items() if k in cols}, strict=False)


def _requests(df: pl.DataFrame, origin: float) -> pl.DataFrame:
    n = df.height
    df = df.with_row_index("idx")
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
    return df.with_columns(failed=failed).select(
        line_no=pl.col("idx").cast(pl.Int64) + 1,
        req_id=pl.col("idx").cast(pl.String),
        t_arrival=start,
        t_first_token=ok.then(first),
        t_finish=ok.then(start + latency),
        prompt_tokens=pl.col("input_lens"),
        output_tokens=ok.then(pl.col("output_lens")),
        status=pl.when(pl.col("failed")).then(pl.lit("error")).otherwise(pl.lit("ok")),
        token_times=ok.then(pl.concat_list(pl.lit(0.0), pl.col("itls")).list.eval(pl.element().cum_sum()) + first),
        error=pl.when(pl.col("errors").fill_null("") != "").then(pl.col("errors")),
        client_queue_s=pl.col("queue_times"),
    ) if n else pl.DataFrame()


def _run(doc: dict, origin: float, has_starts: bool) -> dict:
    reported = {k: v for k, v in doc.items() if k.endswith("_ms") and isinstance(v, (int, float))}
    meta = {k: doc.get(k) for k in ("backend", "endpoint_type", "label", "tokenizer_id", "num_prompts",
                                    "request_rate", "burstiness", "max_concurrency", "date")}
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
        df = _frame(doc, path)
        starts = doc.get("start_times") or []
        origin = float(min(starts)) if starts else 0.0
        run = _run(doc, origin, bool(starts))
        if len(docs) > 1:  # several appended results: one run each
            run["run_id"] = f"{run_name or c.stem(path)}-{k + 1}"
        req = _requests(df, origin)
        records = c.encode(req, "request", ("error", "client_queue_s")) if req.height else None
        if records is not None:  # entries are numbered through the whole file
            records = records.with_columns(pl.col("line_no") + (first_line - 1))
        first_line += df.height
        yield c.batch(records, df.height, run=run)
