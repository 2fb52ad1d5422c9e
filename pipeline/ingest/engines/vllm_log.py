"""vLLM server logs with ``--enable-logging-iteration-details``.

One record per ``Iteration(N): a context requests, b context tokens, c generation
requests, d generation tokens, iteration elapsed time: x ms[ (dummy)], <dev> KV cache
usage: y%`` line (vLLM ``v1/metrics/loggers.py``); every other line is skipped.
The fields are read one by one (order and optional tails do not matter), so a line
that says ``Iteration(N):`` but lacks a field is a reject naming the field, and one whose
field holds no plausible value (``-12 ms``, ``abc``, ``1e23 context tokens``) a reject
naming the field and the value.  Every line holding ``Iteration(`` is a step line: one
cut off or garbled before its counter (``... Engine 000: Iteration(3``) is rejected,
never skipped, so no step is lost unnoticed.

Timestamps: the most precise stamp in the prefix wins (epoch seconds from a custom
logging config, a Docker/ISO stamp with fraction, else vLLM's default
``INFO 05-19 10:13:11``, whole seconds and no year).  The line is written when the
step's stats reach the front end, so the stamp is the step end.  With whole-second
stamps the step timeline is rebuilt from the elapsed times
(:func:`_common.reconstruct_ends`) and the run says ``timestamps_reconstructed``.

A coloured log (vLLM's ColoredFormatter, stdout a terminal: ``docker run -t``) has ANSI
codes around the level, the stamp and ``[file:line]``; the fields are read from the line
without them (:func:`_common.log_lines`), and a reject keeps the line as written.

A data-parallel server prefixes each line with its engine (``Engine 001:``, or the
EngineCore process ``(EngineCore_DP1 pid=N)`` on the older EngineCore line) and
counts steps per engine: a log with several engines becomes one run per engine,
``<run>-engine000``, ``<run>-engine001``, ... (``<run>``: --run-id or the file name).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl

from .. import reader
from ..load import Batch
from . import _common as c
from . import _wallclock as wallclock

MARK = r"Iteration\((\d+)\):"
STEP = "Iteration("  # a line holding it is a step line: read or rejected, never skipped
SNIFF = re.compile(r"Iteration\(\d+\): \d+ context requests")
# vLLM's start-up banner, so that a log whose first step line lies past the head detection
# reads (health probes and start-up can fill 64 KiB) is still known: "vLLM server version X"
# (0.3x), "vLLM API server version X" (0.6-0.2x), "Starting vLLM [API ]server [N ]on http://...",
# "Initializing a V1 LLM engine (vX)" / "Initializing an LLM engine (vX)" (EngineCore).
BANNER = re.compile(
    r"vLLM (?:API )?server version \d|Starting vLLM (?:API )?server (?:\d+ )?on |Initializing (?:a V1|an) LLM engine \(v\d"
)
# ... on a log line: a level name before it on its line (a note or script quoting it is no log)
_LEVEL = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")

# Lines before the first step that describe the server (vLLM prints them at start-up).
_META = {
    "engine_version": r"(?:vLLM server version|vLLM API server version|LLM engine \(v)\s*([0-9][\w.+-]*)",
    "model": r"serving model (\S+)",
    "kv_cache_tokens": r"(?:GPU|CPU|XPU|TPU) KV cache size: ([\d,]+) tokens",
    "chunked_prefill_tokens": r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)",
    "num_gpu_blocks": r"Overriding num_gpu_blocks=\d+ with num_gpu_blocks_override=(\d+)",
    "non_default_args": r"non-default args: (\{.*\})\s*$",
    # V1 engines (v0.8 on): "Initializing a V1 LLM engine (v0.10.1) with config: model=..., dtype=torch.bfloat16,
    # ..., kv_cache_dtype=auto, ..."; V0 engines (v0.4-v0.7): "Initializing an LLM engine (v0.6.3) with config:"
    # with the same key=value fields
    "engine_config": r"Initializing (?:a V1|an) LLM engine .*? with config: (.*)$",
}


def sniff(path: Path, head: str) -> bool:
    """A step line in the head, or vLLM's start-up banner on a log line (the first few found).

    A banner without a step line is no vLLM log when the head could not be read whole (a
    compressed copy cut short in its start-up lines): detection then says the file is damaged.
    """
    head = c.strip_ansi(head)
    if SNIFF.search(head):
        return True
    for _, m in zip(range(8), BANNER.finditer(head)):
        if _LEVEL.search(head, head.rfind("\n", 0, m.start()) + 1, m.start()):
            return reader.head_damage(path) is None
    return False


def _records(lines: pl.DataFrame, written: float, tz: str = "UTC", after_s: float | None = None) -> pl.DataFrame:
    """Candidate record lines with every field extracted (NULL where absent).

    ``lines``: :func:`_common.log_lines` (fields are read from ``text``, the line without
    ANSI colour codes; ``raw`` stays as written, for rejects); ``after_s``: the latest stamp
    of the step lines of earlier batches."""
    raw = pl.col("text")
    rec = lines.filter(raw.str.contains(STEP, literal=True)).with_columns(
        _prefix=raw.str.split_exact("Iteration(", 1).struct.field("field_0")
    )
    rec = c.with_log_times(rec, "_prefix", written, tz, after_s)
    return (
        rec.with_columns(
            iter=c.int_field(raw, MARK),
            prefill_reqs=c.int_field(raw, r"(\d+) context requests"),
            prefill_tokens=c.int_field(raw, r"(\d+) context tokens"),
            decode_reqs=c.int_field(raw, r"(\d+) generation requests"),
            decode_tokens=c.int_field(raw, r"(\d+) generation tokens"),
            dur_ms=c.float_field(raw, r"iteration elapsed time: ([0-9.]+) ms"),
            kv_usage=c.float_field(raw, r"KV cache usage: ([0-9.]+)%") / 100.0,
            # the mark follows the time (EngineCore lines) or the KV/encoder fields (front end);
            # read anywhere after the counter, so a reordered line still marks its step
            is_dummy=raw.str.contains(r"Iteration\(\d+\):.*\(dummy\)"),
            # the front end names the engine ("Engine 001:"), the EngineCore line its process
            # ("(EngineCore_DP1 pid=N)"): data-parallel rank k either way
            engine_index=pl.coalesce(
                c.int_field(pl.col("_prefix"), r"Engine (\d{3}):"),
                c.int_field(pl.col("_prefix"), r"\(EngineCore_DP(\d+)[\s)]"),
            ),
        )
        .drop("_prefix")
        .select(
            "line_no",
            "raw",
            "text",
            "iter",
            "prefill_reqs",
            "prefill_tokens",
            "decode_reqs",
            "decode_tokens",
            "dur_ms",
            "kv_usage",
            "is_dummy",
            "engine_index",
            "stamp_s",
            "stamp_resolution_s",
            "stamp_zone",
            "stamp_problem",
            *[x for x in lines.columns if x not in ("line_no", "raw", "text")],
        )
    )


def _reason(rec: pl.DataFrame) -> pl.Series:
    checks = [
        (name, pl.col(name)) for name in ("prefill_reqs", "prefill_tokens", "decode_reqs", "decode_tokens", "dur_ms")
    ]
    checks.append(("timestamp", pl.col("stamp_s")))
    garbled = pl.when(pl.col("iter").is_null()).then(
        pl.lit("truncated or garbled Iteration line (no complete 'Iteration(N):' step counter)")
    )
    # a line cut short with the next one written on it holds two counters: read as one step, it
    # gave the first step the second's numbers and the second step was gone without a word
    glued = pl.when(pl.col("text").str.count_matches(STEP, literal=True) > 1).then(
        pl.lit("two Iteration lines run together (a line cut short with the next written on it): neither is read")
    )
    # a stamp with a malformed UTC offset has no time: the line says why, not "without timestamp"
    unread = pl.lit("vLLM Iteration line with an unreadable timestamp: ") + pl.col("stamp_problem")
    return rec.select(
        pl.coalesce(garbled, glued, unread, c.missing_reason(checks, "vLLM Iteration line without ")).alias("reason")
    ).to_series()


# Each field as the loosest token where it stands (``(name, pattern, kind, strict column)``):
# on lines already rejected (few), it says why: a value there but out of range or no
# number, rather than "without" the field.
_LOOSE = (
    ("iter", r"Iteration\(([^)\s]*)\):", "count", "iter"),
    ("prefill_reqs", r"([^\s,:]+) context requests", "count", "prefill_reqs"),
    ("prefill_tokens", r"([^\s,:]+) context tokens", "count", "prefill_tokens"),
    ("decode_reqs", r"([^\s,:]+) generation requests", "count", "decode_reqs"),
    ("decode_tokens", r"([^\s,:]+) generation tokens", "count", "decode_tokens"),
    ("dur_ms", r"iteration elapsed time: ([^\s,]+)", "number", "dur_ms"),
    ("kv_usage", r"KV cache usage: ([^\s,%]+)", "number", "kv_usage"),
)


def _explain(rec: pl.DataFrame) -> pl.DataFrame:
    """``rec`` (lines already rejected, or without KV usage) with reasons naming bad values."""
    raw = pl.col("text")
    problems = []
    for name, pattern, kind, col in _LOOSE:
        text = raw.str.extract(pattern, 1)
        problems.append(
            pl.coalesce(
                c.text_value_problem(text, name, kind),
                # a number, but not written as vLLM writes it (1e3 where digits belong, no " ms")
                pl.when(text.is_not_null() & pl.col(col).is_null()).then(
                    pl.format("{}: {} is not in the form vLLM writes", pl.lit(name), text.str.slice(0, c.SHOWN_CHARS))
                ),
            )
        )
    value = pl.concat_list(problems).list.drop_nulls().list.join("; ")
    return rec.with_columns(reason=pl.when(value.str.len_chars() > 0).then(value).otherwise(pl.col("reason")))


def _with_reasons(rec: pl.DataFrame) -> pl.DataFrame:
    """``rec`` with ``reason`` set (NULL for a good step). The explaining patterns run only
    on the few lines that need them (a mask and ``any``, no copy, on a clean log)."""
    rec = rec.with_columns(reason=_reason(rec))
    need = rec.select(pl.col("reason").is_not_null() | pl.col("kv_usage").is_null()).to_series()
    if not need.any():
        return rec
    return pl.concat([rec.filter(~need), _explain(rec.filter(need))])


def _meta(lines: pl.DataFrame) -> dict:
    """Run facts from the start-up lines (a few lines, read once)."""
    out: dict = {}
    hits = lines.filter(pl.col("text").str.contains("|".join(f"(?:{p})" for p in _META.values())))
    for text in hits.get_column("text").to_list():
        for key, pat in _META.items():
            m = re.search(pat, text)
            if m and key not in out:
                out[key] = m.group(1)
    meta: dict = {}
    if "kv_cache_tokens" in out:
        meta["kv_cache_tokens"] = int(out["kv_cache_tokens"].replace(",", ""))
    if "chunked_prefill_tokens" in out:
        meta["chunked_prefill"] = True
        meta["max_num_batched_tokens"] = int(out["chunked_prefill_tokens"])
    if "non_default_args" in out:
        try:  # a Python dict repr: literal_eval only, never eval
            args = ast.literal_eval(out["non_default_args"])
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):  # TypeError: {[1]: 2}
            args = {}
        if not isinstance(args, dict):  # the line is run metadata only: unreadable, it is left out
            args = {}
        for key in (
            "max_num_seqs",
            "max_num_batched_tokens",
            "enable_chunked_prefill",
            "max_model_len",
            "enable_prefix_caching",
            "tensor_parallel_size",
            "kv_cache_memory_bytes",
            "gpu_memory_utilization",
            "scheduler_reserve_full_isl",
        ):
            if key in args and isinstance(args[key], (int, float, bool, str)):
                meta["chunked_prefill" if key == "enable_chunked_prefill" else key] = args[key]
        for key, to in (("block_size", "kv_block_size"), ("num_gpu_blocks_override", "num_gpu_blocks")):
            if isinstance(args.get(key), int) and not isinstance(args[key], bool) and args[key] > 0:
                meta[to] = args[key]
        if isinstance(args.get("served_model_name"), list) and args["served_model_name"]:
            out.setdefault("served", args["served_model_name"][0])
        for key in ("dtype", "kv_cache_dtype"):  # listed only when not the default ("auto")
            if isinstance(args.get(key), str) and args[key]:
                out.setdefault("arg_" + key, args[key])
    _kv_blocks(meta, out.get("num_gpu_blocks"))
    cfg = out.get("engine_config", "")
    # "\b": kv_cache_dtype= is no match for dtype= ("_" is a word character)
    dtype = re.search(r"\bdtype=(?:torch\.)?(\w+)", cfg)
    kv_dtype = re.search(r"\bkv_cache_dtype=(?:torch\.)?(\w+)", cfg)
    return {
        "engine_version": out.get("engine_version"),
        "model": out.get("served") or out.get("model"),
        # the engine's config line, else the non-default arguments (auto: the model's dtype)
        "dtype": dtype.group(1) if dtype else _arg_dtype(out.get("arg_dtype")),
        "kv_dtype": kv_dtype.group(1) if kv_dtype else _arg_dtype(out.get("arg_kv_cache_dtype")),
        "meta": meta,
    }


def _arg_dtype(value: str | None) -> str | None:
    """A dtype argument as the config line prints it: ``torch.float16`` -> ``float16``."""
    return value.removeprefix("torch.") if value else None


def _kv_blocks(meta: dict, override: str | None) -> None:
    """Block size and usable KV capacity, when the log lets them be derived.

    vLLM v1 logs ``KV cache size: N tokens`` = blocks x block size, and one block
    is its reserved null block (``KV cache usage`` counts the others: 16 blocks
    read as steps of 1/15), so the usable capacity is ``(blocks - 1) x block
    size``. The block size is the ``block_size`` argument or ``N / blocks`` when
    the block count is known (``--num-gpu-blocks-override``); otherwise the log
    does not say it and nothing is recorded.
    """
    if override:
        meta["num_gpu_blocks"] = int(override)
    tokens, blocks = meta.get("kv_cache_tokens"), meta.get("num_gpu_blocks")
    if "kv_block_size" not in meta and tokens and blocks and tokens % blocks == 0:
        meta["kv_block_size"] = tokens // blocks
    bs = meta.get("kv_block_size")
    if tokens and bs and tokens % bs == 0 and tokens // bs > 1:
        meta["num_gpu_blocks"] = tokens // bs
        meta["kv_capacity_tokens"] = (tokens // bs - 1) * bs


OUT_BATCH_ROWS = 200_000

# How late a step's line may be written after the step ended, beyond the stamp resolution:
# the front end logs a step when its output arrives (ms later in our recordings, more
# under load), so two lines can be closer than the second step's elapsed time.
LOG_LAG_S = 1.0
_NO_STAMPS = pl.DataFrame(schema={"engine": pl.Int64, "stamp_s": pl.Float64})


def _check_elapsed(rec: pl.DataFrame, last: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Reject steps whose elapsed time the log's own stamps rule out; ``last``: each engine's last stamp so far.

    A step starts after the previous step (of its engine) ended, which was no earlier
    than that step's stamp, and ends before its own stamp plus the resolution; so it
    lasts at most the gap between the two stamps plus the resolution, plus LOG_LAG_S
    for lines written later after their step than the line before.
    A longer one, e.g. a corrupted 999999 ms, would otherwise move every later step
    when the timeline is rebuilt from elapsed times. Returns ``rec`` with those
    reasons set and the engines' last stamps for the next batch of lines.
    """
    ok = rec.filter(pl.col("reason").is_null()).select(
        "line_no", "dur_ms", "stamp_resolution_s", "stamp_s", engine=pl.col("engine_index").fill_null(0)
    )
    steps = pl.concat([last.with_columns(line_no=pl.lit(-1, pl.Int64)), ok], how="diagonal_relaxed")
    gap = pl.col("stamp_s") - pl.col("stamp_s").shift(1).over("engine", order_by="line_no")
    bad = (
        steps.with_columns(gap=gap)
        .with_columns(allowed=pl.col("gap") + pl.col("stamp_resolution_s") + LOG_LAG_S)
        .filter((pl.col("dur_ms") / 1000.0 > pl.col("allowed")) & (pl.col("line_no") >= 0))
        .select(
            "line_no",
            elapsed_reason=pl.format(
                "iteration elapsed time {} ms is longer than the log's timestamps allow: "
                "this step's line is {} s after the previous step's (stamp resolution {} s, "
                f"logging lag up to {LOG_LAG_S:g} s), so the step took at most {{}} s",
                pl.col("dur_ms"),
                pl.col("gap").round(6),
                pl.col("stamp_resolution_s"),
                pl.col("allowed").round(6),
            ),
        )
    )
    last = steps.group_by("engine").agg(pl.col("stamp_s").sort_by("line_no").last())
    if bad.height:
        rec = (
            rec.join(bad, on="line_no", how="left")
            .with_columns(reason=pl.coalesce("reason", "elapsed_reason"))
            .drop("elapsed_reason")
        )
    return rec, last


def convert(
    path: Path, progress: Callable[[int], None] | None = None, run_name: str | None = None, tz: str | None = None
) -> Iterator[Batch]:
    """Whole-file conversion: the timeline rebuild needs every step in order.

    Memory is bounded by the record lines (a few hundred bytes each), not the log.
    """
    written = c.written_s(path)
    zone = c.check_zone(tz) if tz else c.local_zone()
    goods, bads, head_lines, total, n_rec = [], [], [], 0, 0
    last_stamp, after_s = _NO_STAMPS, None
    for table in reader.lines(path, progress):
        lines = c.log_lines(table)
        total += lines.height
        if not head_lines:
            head_lines.append(lines.head(2000))
        rec = _records(lines, written, zone, after_s)
        # a repeated DST hour is read on from the stamps of the batches before (with_log_times)
        after_s = wallclock.latest(rec, after_s)
        rec = _with_reasons(rec)
        rec, last_stamp = _check_elapsed(rec, last_stamp)
        n_rec += rec.height
        # only rejects keep their text: a step's typed fields are a fraction of its log line
        bads.append(rec.filter(pl.col("reason").is_not_null()).select("line_no", "reason", "raw"))
        goods.append(rec.filter(pl.col("reason").is_null()).drop("raw", "text", "reason"))
    empty = _records(pl.DataFrame(schema={"line_no": pl.Int64, "raw": pl.String, "text": pl.String}), written, zone)
    bad = pl.concat(bads) if bads else empty.select("line_no", pl.lit(None, pl.String).alias("reason"), "raw")
    good = (pl.concat(goods) if goods else empty.drop("raw", "text")).sort("line_no")
    del goods
    info = _meta(pl.concat(head_lines)) if head_lines else {"meta": {}}
    coarse = good.height > 0 and good.get_column("stamp_resolution_s").max() >= 1.0
    # Data-parallel servers log each engine's steps with its own counter ("Engine 001:
    # Iteration(7)"): one run per engine, each with its own timeline.
    engines = good.get_column("engine_index").fill_null(0).unique().sort().to_list()
    good = good.with_columns(engine=pl.col("engine_index").fill_null(0))
    good, restarts = _number_restarts(good)
    if coarse:
        good = good.with_columns(t_end=c.reconstruct_ends(pl.col("stamp_s"), pl.col("dur_ms")).over("engine"))
    else:
        good = good.with_columns(t_end=pl.col("stamp_s"))
    good = good.with_columns(t_start=pl.col("t_end") - pl.col("dur_ms") / 1000.0)
    meta = dict(info["meta"])
    meta.update(
        source_format="vllm-log",
        timestamps_reconstructed=bool(coarse),
        timestamp_resolution_s=float(good.get_column("stamp_resolution_s").max()) if good.height else None,
        # vLLM times the wait for the executor's result (dispatch happens just before, sampling
        # inside): not GPU time, and near 0 under --async-scheduling (docs/formats.md)
        elapsed_time_scope="host wait for the executor's step result (plus sampling), vLLM "
        "--enable-logging-iteration-details: includes waiting for the executor, "
        "near 0 with --async-scheduling",
    )
    if coarse:
        meta["assumed_year"] = c.stamp_year(float(good.get_column("stamp_s").min()), zone)
        meta["year_source"] = (
            "file modification time: each stamp takes the latest year that puts it before the file was "
            "last written (vLLM's default stamps have no year)"
        )
    # the zone wall-clock stamps were read in, or the offsets the stamps carried themselves
    meta.update(wallclock.zone_meta(good.get_column("stamp_zone"), zone, bool(tz)))
    run = {
        "engine": "vllm",
        "engine_version": info.get("engine_version"),
        "model": info.get("model"),
        "dtype": info.get("dtype"),
        "kv_dtype": info.get("kv_dtype"),
        "clock": "unix",
        "meta": meta,
    }
    notes = []
    if restarts:
        meta["engine_restarts"] = restarts
        notes.append(
            f"the iteration counter starts again {len(restarts)} time(s) (an engine restart, line "
            f"{', '.join(str(r['line_no']) for r in restarts[:5])}): later steps are numbered on "
            "from the steps before (the log's own counter is kept as extra.log_iter)"
        )
    rejects = bad
    if len(engines) <= 1:
        yield from _batches(good, run, total, rejects, total - n_rec, notes)
        return
    base = run_name or c.stem(path)
    for k, idx in enumerate(engines):
        rid = f"{base}-engine{idx:03d}"
        part = good.filter(pl.col("engine") == idx).with_columns(run_id=pl.lit(rid))
        run_k = run | {"run_id": rid, "meta": meta | {"dp_engine_index": idx, "dp_engines": len(engines)}}
        if k == 0:
            yield from _batches(part, run_k, total, rejects, total - n_rec, notes)
        else:
            yield from _batches(part, run_k, 0, None, 0)


EXTRA = ("engine_index", "is_dummy", "stamp_s")
RESTART_EXTRA = ("log_iter", "engine_start")  # only on a log whose counter starts again
# A counter that falls by at most this is lines written out of order (within one second they
# cannot be told apart by their stamps), not a restart.
MAX_REORDER_STEPS = 16


def _number_restarts(good: pl.DataFrame) -> tuple[pl.DataFrame, list[dict]]:
    """Number the steps of a log whose engine restarted on from the steps before.

    A restarted engine counts its steps from 0 again, so its ``Iteration(N)`` repeat the first
    start's: as they were, every step after the restart was rejected as a duplicate and the run
    lost them. A step line whose counter is below the previous step line's (same engine, file
    order) while its stamp is not earlier starts a new engine start; its steps get the previous
    starts' counts added (``extra.log_iter`` keeps the log's own counter, ``extra.engine_start``
    which start it belongs to). A counter that falls while the stamps go back too (a log pasted
    twice) is no restart: those lines stay duplicates; nor is a fall of at most
    MAX_REORDER_STEPS (lines out of order, perhaps within one stamped second). Returns the steps and one
    ``{line_no, log_iter, previous_iter}`` per restart."""
    if good.height < 2:
        return good, []
    by = {"partition_by": "engine", "order_by": "line_no"}
    flagged = good.with_columns(
        _restart=(
            (pl.col("iter") < pl.col("iter").shift(1).over(**by) - MAX_REORDER_STEPS)
            & (pl.col("stamp_s") >= pl.col("stamp_s").shift(1).over(**by))
        ).fill_null(False)
    )
    if not flagged.get_column("_restart").any():
        return good, []
    restarts = (
        flagged.with_columns(previous_iter=pl.col("iter").shift(1).over(**by))
        .filter("_restart")
        .select("line_no", log_iter="iter", previous_iter="previous_iter")
        .sort("line_no")
        .to_dicts()
    )
    flagged = flagged.with_columns(engine_start=pl.col("_restart").cast(pl.Int64).cum_sum().over(**by))
    # each start's steps are numbered after the largest number of the starts before it
    bases = (
        flagged.group_by("engine", "engine_start")
        .agg(top=pl.col("iter").max())
        .sort("engine", "engine_start")
        .with_columns(base=(pl.col("top") + 1).cum_sum().shift(1, fill_value=0).over("engine"))
        .select("engine", "engine_start", "base")
    )
    out = (
        flagged.join(bases, on=["engine", "engine_start"], how="left")
        .with_columns(log_iter=pl.col("iter"), iter=pl.col("iter") + pl.col("base"))
        .drop("_restart", "base")
        .sort("line_no")
    )
    return out, restarts


def _batches(
    good: pl.DataFrame,
    run: dict,
    lines_read: int,
    rejects: pl.DataFrame | None,
    skipped: int,
    notes: list[str] | None = None,
) -> Iterator[Batch]:
    """One run's steps, encoded in slices: the typed steps are small, their JSON text and
    the loader's work on it are not. The first slice carries the run record and the counts."""
    extra = EXTRA + tuple(x for x in RESTART_EXTRA + ("run_id",) if x in good.columns)
    for lo in range(0, max(good.height, 1), OUT_BATCH_ROWS):
        records = c.encode(good.slice(lo, OUT_BATCH_ROWS), "iteration", extra)
        if lo == 0:
            yield c.batch(records, lines_read, run=run, rejects=rejects, skipped=skipped, notes=notes)
        else:
            yield c.batch(records, 0)
