"""LLMServingSim's vLLM bench folder: ``meta.json`` (run facts) and ``timeseries.csv`` (engine gauges).

``python -m bench`` of casys-kaist/LLMServingSim (``bench/core/runner.py``, ``recorder.py``,
``stat_logger.py``) writes three files per run: ``requests.jsonl`` (the ``vllm-requests``
format), and the two read here.

**meta.json** (``schema_version`` 1): ``model, vllm_version, engine_kwargs {model,
tensor_parallel_size, data_parallel_size, enable_expert_parallel, max_num_seqs,
max_num_batched_tokens, max_model_len, dtype, kv_cache_dtype, seed, ...}, dataset_path,
dataset_hash, num_requests, started_at, finished_at, tick_seconds`` and, in later runs,
``kv_cache {num_gpu_blocks, block_size, num_kv_tokens, enable_prefix_caching, ...}``,
``hardware {device_name, device_count, ...}`` and ``resolved_config`` (vLLM's whole
resolved config).  It becomes one run record (see :func:`run_fields`); the same fields
are what ``vllm-requests`` takes from a ``meta.json`` beside its file, so the files of one
folder say the same about their run.  The document counts as one line.

**timeseries.csv**: ``t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct``
(newer runs add ``prompt_compute_throughput, prompt_cached_throughput, preempted``).  The
bench's stat logger records every engine iteration; the writer buckets them into
``tick_seconds`` windows ``[t - tick, t)`` and writes one row per window that saw an
iteration: ``t`` is the window's **end**, in seconds since the stat logger was created
(while the engine boots, just before ``started_at`` is stamped); the throughputs are the
window's token counts divided by the tick (tokens/s, summed over data-parallel engines;
``prompt_throughput`` credits a request's whole prompt when its prefill finishes, prefix
cache hits included); ``running``/``waiting`` are the last snapshot in the window, summed
over engines; ``kv_cache_pct`` is vLLM's ``kv_cache_usage`` times 100 (a percent), averaged
over engines; ``preempted`` counts preemptions in the window.

The rows become ``metric_samples`` under vLLM's Prometheus names, at Unix time
``started_at + t`` (meta.json beside the file gives ``started_at``; without it the file is
refused, naming the missing file: ``t`` has no other origin).  See :data:`GAUGES`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from ...errors import InputError
from .. import reader
from ..load import Batch
from . import _common as c

META_FILE = "meta.json"
META_SCHEMA_VERSION = 1

# timeseries column -> (metric family, kind, scale to the family's unit, check kind)
GAUGES: dict[str, tuple[str, str, float, str]] = {
    "running": ("vllm:num_requests_running", "gauge", 1.0, "count"),
    "waiting": ("vllm:num_requests_waiting", "gauge", 1.0, "count"),
    # vLLM's Prometheus gauge is a fraction (1 = full) despite its name; the CSV has a percent
    "kv_cache_pct": ("vllm:kv_cache_usage_perc", "gauge", 0.01, "number"),
    # vLLM v0's logged throughput gauges, tokens/s over the tick
    "prompt_throughput": ("vllm:avg_prompt_throughput_toks_per_s", "gauge", 1.0, "number"),
    "gen_throughput": ("vllm:avg_generation_throughput_toks_per_s", "gauge", 1.0, "number"),
    "prompt_compute_throughput": ("llmservingsim:prompt_computed_toks_per_s", "gauge", 1.0, "number"),
    "prompt_cached_throughput": ("llmservingsim:prompt_cached_toks_per_s", "gauge", 1.0, "number"),
    # preemptions per tick, summed into vLLM's counter (its increase over the run is the count)
    "preempted": ("vllm:num_preemptions_total", "counter", 1.0, "count"),
}
REQUIRED = ("t", "prompt_throughput", "gen_throughput", "running", "waiting", "kv_cache_pct")


# --- meta.json ---------------------------------------------------------------------------


def sniff_meta(path: Path, head: str) -> bool:
    # engine_start.json (the boot snapshot of an unfinished run) has no vllm_version
    return (
        head.lstrip().startswith("{")
        and '"schema_version"' in head
        and '"vllm_version"' in head
        and '"engine_kwargs"' in head
    )


def _part(doc: dict, key: str) -> dict:
    v = doc.get(key)
    return v if isinstance(v, dict) else {}


def parse_started_at(value: Any) -> float | None:
    """``started_at`` (``datetime.utcnow().isoformat() + "Z"``) as Unix seconds; a stamp
    without a zone is UTC, as the bench writes it.  None when it is no ISO-8601 time."""
    if not isinstance(value, str):
        return None
    try:
        t = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()


def run_fields(doc: dict, file_name: str = META_FILE) -> dict[str, Any]:
    """The run record a bench ``meta.json`` gives (also used by ``vllm-requests`` for the
    ``meta.json`` beside its file).

    ``num_gpus`` is the GPUs the engine ran on: ``tensor_parallel_size x data_parallel_size
    x pipeline_parallel_size`` (the last from ``resolved_config``, else 1: the bench never
    sets it), not ``hardware.device_count``, which counts the GPUs the process could see
    (kept as ``meta.visible_gpus``).  ``kv_dtype`` is vLLM's ``kv_cache_dtype`` as given
    (``auto``: the model's dtype).
    """
    kw, kv, hw = _part(doc, "engine_kwargs"), _part(doc, "kv_cache"), _part(doc, "hardware")
    resolved = _part(doc, "resolved_config")
    sched, par = _part(resolved, "scheduler_config"), _part(resolved, "parallel_config")

    def count(v: Any) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    tp, dp = count(kw.get("tensor_parallel_size")), count(kw.get("data_parallel_size"))
    pp = count(par.get("pipeline_parallel_size")) or 1
    meta = {
        k: kw.get(k)
        for k in (
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "tensor_parallel_size",
            "data_parallel_size",
            "enable_expert_parallel",
        )
    }
    meta.update(
        kv_cache_tokens=kv.get("num_kv_tokens"),
        kv_block_size=kv.get("block_size"),
        kv_gpu_blocks=kv.get("num_gpu_blocks"),
        enable_prefix_caching=kv.get("enable_prefix_caching"),
        gpu_memory_utilization=kv.get("gpu_memory_utilization"),
        # the scheduler settings replay reads (docs/replay.md, Policy)
        enable_chunked_prefill=sched.get("enable_chunked_prefill"),
        scheduler_reserve_full_isl=sched.get("scheduler_reserve_full_isl"),
        scheduler_policy=sched.get("policy"),
        pipeline_parallel_size=par.get("pipeline_parallel_size"),
        visible_gpus=hw.get("device_count"),
        metadata_file=file_name,
    )
    return {
        "engine": "vllm",
        "engine_version": doc.get("vllm_version"),
        "model": doc.get("model") or kw.get("model"),
        "gpu": hw.get("device_name"),
        "num_gpus": tp * dp * pp if tp and dp else None,
        "dtype": kw.get("dtype"),
        "kv_dtype": kw.get("kv_cache_dtype"),
        "meta": meta,
    }


def _problems(doc: dict) -> list[str]:
    """What in a meta.json cannot be taken as it is (each names the key and the fix)."""
    out = []
    if doc.get("schema_version") != META_SCHEMA_VERSION:
        out.append(
            f"schema_version {str(doc.get('schema_version'))[: c.SHOWN_CHARS]!r}: this reader knows version "
            f"{META_SCHEMA_VERSION} (LLMServingSim bench/core/recorder.py); a newer bench changed a field's meaning"
        )
    kw, kv = doc.get("engine_kwargs"), doc.get("kv_cache")
    if not isinstance(kw, dict):
        out.append("engine_kwargs: expected an object of vLLM engine arguments")
        kw = {}
    if kv is not None and not isinstance(kv, dict):
        out.append("kv_cache: expected an object")
        kv = {}
    for where, d, key in (
        ("engine_kwargs", kw, "max_num_seqs"),
        ("engine_kwargs", kw, "max_num_batched_tokens"),
        ("engine_kwargs", kw, "max_model_len"),
        ("engine_kwargs", kw, "tensor_parallel_size"),
        ("engine_kwargs", kw, "data_parallel_size"),
        ("kv_cache", kv or {}, "num_kv_tokens"),
        ("kv_cache", kv or {}, "block_size"),
        ("kv_cache", kv or {}, "num_gpu_blocks"),
    ):
        v = d.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= c.MAX_COUNT):
            out.append(f"{where}.{key}: expected a positive integer or null, got {json.dumps(v)[: c.SHOWN_CHARS]}")
    for key in ("model", "vllm_version"):
        if doc.get(key) is not None and not isinstance(doc.get(key), str):
            out.append(f"{key}: expected text, got {json.dumps(doc.get(key))[: c.SHOWN_CHARS]}")
    if doc.get("started_at") is not None and parse_started_at(doc.get("started_at")) is None:
        out.append(f"started_at: expected an ISO-8601 time, got {json.dumps(doc.get('started_at'))[: c.SHOWN_CHARS]}")
    tick = doc.get("tick_seconds")
    if tick is not None and (
        isinstance(tick, bool) or not isinstance(tick, (int, float)) or not math.isfinite(tick) or tick <= 0
    ):
        out.append(f"tick_seconds: expected a positive number of seconds, got {json.dumps(tick)[: c.SHOWN_CHARS]}")
    return out


def convert_meta(
    path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None
) -> Iterator[Batch]:
    """The document as one run record (line 1), or one reject naming every bad key."""
    doc = c.read_json_document(path)
    if not isinstance(doc, dict):
        raise InputError(f"{path}: not an LLMServingSim bench meta.json (a JSON {type(doc).__name__}, not an object)")
    problems = _problems(doc)
    if problems:
        raw = json.dumps({k: v for k, v in doc.items() if k != "resolved_config"})[:1024]
        reason = "meta.json: " + "; ".join(problems) + "; fix these keys (or remove them) and ingest again"
        yield Batch(
            pa.table({"line_no": pa.array([], pa.int64()), "raw": pa.array([], pa.string())}), 1, [(1, reason, raw)]
        )
        return
    run = run_fields(doc, path.name)
    run["meta"].update(
        started_at=doc.get("started_at"),
        finished_at=doc.get("finished_at"),
        tick_seconds=doc.get("tick_seconds"),
        num_requests=doc.get("num_requests"),
        dataset_path=doc.get("dataset_path"),
        dataset_hash=doc.get("dataset_hash"),
    )
    lines = pa.table({"line_no": pa.array([1], pa.int64()), "raw": pa.array([c.run_json(run)], pa.string())})
    yield Batch(lines, 1)


# --- timeseries.csv ----------------------------------------------------------------------


def _header(head: str) -> list[str] | None:
    first = next((ln for ln in head.splitlines() if ln.strip()), "")
    cols = [x.strip() for x in first.split(",")]
    return cols if cols and cols[0] == "t" else None


def sniff_timeseries(path: Path, head: str) -> bool:
    cols = _header(head)
    return cols is not None and set(REQUIRED) <= set(cols) and set(cols) <= set(GAUGES) | {"t"}


def _origin(path: Path) -> tuple[float, float, dict]:
    """(Unix time of t = 0, tick seconds, the meta.json document) from the meta.json beside ``path``."""
    side = path.parent / META_FILE
    fix = (
        f"put the run's {META_FILE} (written by the same bench run) in the same folder as {path.name} and ingest again"
    )
    if not side.is_file():
        raise InputError(
            f"{path}: the t column counts seconds from the bench run's start, which only {META_FILE} records "
            f"(started_at), and there is no {side}; {fix}"
        )
    doc = c.read_json_document(side)
    start = parse_started_at(doc.get("started_at")) if isinstance(doc, dict) else None
    if start is None:
        raise InputError(
            f"{side}: no readable started_at (an ISO-8601 time), which places the rows of {path.name} in time; {fix}"
        )
    tick = doc.get("tick_seconds")
    ok = isinstance(tick, (int, float)) and not isinstance(tick, bool) and math.isfinite(tick) and tick > 0
    return start, float(tick) if ok else 1.0, doc


def convert_timeseries(
    path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None
) -> Iterator[Batch]:
    start, tick, doc = _origin(path)
    tables = [pl.from_arrow(t) for t in reader.lines(path, progress)]
    if not tables:
        yield c.batch(None, 0)
        return
    lines = pl.concat(tables)
    blank = pl.col("raw").str.strip_chars() == ""
    body = lines.filter(~blank)
    if not body.height:
        yield c.batch(None, lines.height, skipped=lines.height)
        return
    header_line, header_raw = body.row(0)
    cols = [x.strip() for x in header_raw.split(",")]
    missing = [k for k in REQUIRED if k not in cols]
    unknown = [k for k in cols if k not in GAUGES and k != "t"]
    if missing or cols[0] != "t" or len(set(cols)) != len(cols):
        raise InputError(
            f"{path}:{header_line}: header {header_raw.strip()[:200]!r} is not an LLMServingSim timeseries.csv header "
            f"(it needs {', '.join(REQUIRED)}, each once, t first"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + "); is --format right?"
        )
    rows = body.slice(1)
    parts = pl.col("raw").str.strip_chars().str.split(",")
    df = rows.with_columns(
        n=parts.list.len(), **{k: parts.list.get(i, null_on_oob=True).str.strip_chars() for i, k in enumerate(cols)}
    )
    known = [k for k in cols if k in GAUGES]
    problems = [c.text_value_problem(pl.col(k), k, GAUGES[k][3]) for k in known]
    t = pl.col("t").cast(pl.Float64, strict=False)
    reason = pl.coalesce(
        pl.when(pl.col("n") != len(cols)).then(
            pl.format(
                "expected {} comma-separated values (the header's {}), got {}",
                pl.lit(len(cols)),
                pl.lit(",".join(cols)),
                pl.col("n"),
            )
        ),
        pl.when(pl.col("t").is_null() | (pl.col("t") == "")).then(pl.lit("t: missing")),
        c.text_value_problem(pl.col("t"), "t", "number"),
        pl.when(t <= 0).then(
            pl.format("t: {} is not positive (t is a tick's end, seconds since the start)", pl.col("t"))
        ),
        pl.when(t > c.MAX_ABS_TIME_S / 10).then(pl.format("t: {} s after the start is implausible", pl.col("t"))),
        *[pl.when(pl.col(k).is_null() | (pl.col(k) == "")).then(pl.lit(f"{k}: missing")) for k in known],
        *problems,
        pl.when(pl.col("kv_cache_pct").cast(pl.Float64, strict=False) > 100.0).then(
            pl.format("kv_cache_pct: {} is above 100 (a percent of the KV cache)", pl.col("kv_cache_pct"))
        ),
    )
    df = df.with_columns(reason=reason)
    # ticks in time order: a t not after every earlier row's is a repeated or misplaced row
    good = df.filter(pl.col("reason").is_null()).with_columns(t_s=t)
    late = pl.col("t_s") <= pl.col("t_s").cum_max().shift(1)
    order_bad = good.filter(late).select(
        "line_no",
        pl.format(
            "t: {} is not after an earlier row's t (rows are ticks in time order; a repeated row?)", pl.col("t")
        ).alias("reason"),
        "raw",
    )
    good = good.filter(~late.fill_null(False))
    bad = (
        pl.concat([df.filter(pl.col("reason").is_not_null()).select("line_no", "reason", "raw"), order_bad])
        .sort("line_no")
        .with_columns(reason=pl.format("{} ({})", pl.col("reason"), pl.lit(f"{path.name}: fix or delete the row")))
    )
    good = good.with_columns(t_unix=pl.lit(start) + pl.col("t_s"), **{k: pl.col(k).cast(pl.Float64) for k in known})
    # vLLM holds at least one KV block per running request: kv_cache_pct 0 on every row with
    # running requests is a column the bench did not record (its logger read a missing field as 0)
    busy = good.filter(pl.col("running") > 0)
    kv_unrecorded = busy.height > 0 and bool(busy.select((pl.col("kv_cache_pct") == 0).all()).item())
    samples = []
    for k in known:
        if k == "kv_cache_pct" and kv_unrecorded:
            continue
        family, kind, scale, _ = GAUGES[k]
        value = pl.col(k) * scale
        if kind == "counter":
            value = value.cum_sum()
        samples.append(
            good.select(
                "line_no",
                t=pl.col("t_unix"),
                family=pl.lit(family),
                labels=pl.lit("{}"),
                kind=pl.lit(kind),
                le=pl.lit(None, pl.Float64),
                value=value,
            )
        )
    metrics = pl.concat(samples) if samples and good.height else None
    run = run_fields(doc if isinstance(doc, dict) else {}, META_FILE)
    run["clock"] = "unix"
    run["meta"].update(
        engine_metrics=True,
        timeseries_file=path.name,
        timeseries_t0_unix_s=start,
        tick_seconds=tick,
        timeseries_clock="t + meta.json started_at; a row holds the tick [t - tick_seconds, t)",
    )
    if kv_unrecorded:
        run["meta"]["kv_cache_pct_unrecorded"] = (
            f"{path.name}: kv_cache_pct is 0 on every row with running requests; the bench did not record it "
            "(no KV usage gauge stored)"
        )
    if unknown:
        run["meta"]["timeseries_ignored_columns"] = unknown
    b = c.batch(None, lines.height, run=run, rejects=bad, skipped=lines.height - rows.height)
    if metrics is not None:
        b.metrics = metrics.select(
            pl.col("line_no").cast(pl.Int64),
            pl.col("t").cast(pl.Float64),
            pl.col("family").cast(pl.String),
            pl.col("labels").cast(pl.String),
            pl.col("kind").cast(pl.String),
            pl.col("le").cast(pl.Float64),
            pl.col("value").cast(pl.Float64),
        ).to_arrow()
        b.metric_lines = good.height
    yield b
