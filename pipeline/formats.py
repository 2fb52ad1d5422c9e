"""Names and one-line descriptions of the input formats, in detection order.

A plain tuple in a module that imports nothing: `tracelat ingest --help` lists the
formats from here instead of importing the ingestors (DuckDB, PyArrow, Polars: about
0.4 s before any help is shown).  The ingestor registry in pipeline/ingest is the
working copy; tests/ingest/test_formats_registry.py checks that both name the same
formats, in the same order, with the same descriptions.
"""

from __future__ import annotations

FORMATS: tuple[tuple[str, str], ...] = (
    ("parquet", "canonical records in Parquet (docs/canonical-format.md columns)"),
    ("jsonl", "canonical JSON Lines, plain/.gz/.zst (docs/canonical-format.md)"),
    ("vllm-log", "vLLM server log with --enable-logging-iteration-details (Iteration(N) lines)"),
    ("vllm-bench", "vllm bench serve --save-result --save-detailed JSON (ttfts, itls, ...)"),
    ("vllm-requests", "vLLM per-request stats JSONL (arrival_time, queued_ts, first_token_ts, ...)"),
    ("llmservingsim-meta", "LLMServingSim vLLM bench meta.json (engine_kwargs, vllm_version, started_at)"),
    (
        "llmservingsim-timeseries",
        "LLMServingSim vLLM bench timeseries.csv (running, waiting, kv_cache_pct per tick)",
    ),
    ("trtllm-iterlog", "TensorRT-LLM IterationStats: JSON lines/array (/metrics) or trtllm-bench --iteration_log"),
    ("sglang-log", "SGLang server log: Prefill batch / Decode batch lines"),
    ("sglang-metrics", "SGLang --export-metrics-to-file request records (sglang-request-metrics-*.log)"),
    ("fpm", "ForwardPassMetrics JSONL (SGLang/vLLM/Dynamo per-step stream; fpm-relay*.jsonl.gz)"),
    ("aiperf", "AIPerf profile_export.jsonl (per-request records, epoch ns)"),
    ("genai-perf", "GenAI-Perf profile_export.json (experiments -> requests, epoch ns)"),
    ("guidellm", "guidellm benchmarks.json (report v2: benchmarks -> requests, time.time())"),
    ("inference-perf", "inference-perf per_request_lifecycle_metrics.json (perf_counter clock)"),
    ("otel", "OpenTelemetry OTLP JSON spans from vLLM (llm_request: queue, TTFT, E2E per request)"),
    ("aiperf-server-metrics", "AIPerf server_metrics_export.jsonl (Prometheus scrapes of the engine)"),
    ("prometheus-text", "Prometheus text exposition snapshots with '# Timestamp:' headers"),
    ("prometheus-range", "Prometheus query_range JSON (matrix of series)"),
)


# Where a format's request records were timed: by the load generator ("client": its TTFT and E2E
# hold the network and the HTTP server) or inside the engine ("server"). Two runs timed at
# different places differ by that alone (`tracelat compare` says so). Formats not listed (the
# canonical ones, whose writer may be either) are not judged.
REQUEST_SIDE: dict[str, str] = {
    "vllm-bench": "client",
    "aiperf": "client",
    "genai-perf": "client",
    "guidellm": "client",
    "inference-perf": "client",
    "vllm-requests": "server",
    "sglang-metrics": "server",
    "otel": "server",
}
