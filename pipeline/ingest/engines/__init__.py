"""Engine ingestors: real log and benchmark formats turned into canonical records.

Importing this package registers every ingestor (detection tries them in this
order after the canonical ones).
docs/formats.md documents each format and its mapping to canonical fields.
"""

from __future__ import annotations

from .. import Ingestor, register
from . import aiperf, fpm, harness, llmservingsim, otel, prometheus, sglang, trtllm, vllm_bench, vllm_log, vllm_requests

register(
    Ingestor(
        "vllm-log",
        "vLLM server log with --enable-logging-iteration-details (Iteration(N) lines)",
        vllm_log.sniff,
        vllm_log.convert,
    )
)
register(
    Ingestor(
        "vllm-bench",
        "vllm bench serve --save-result --save-detailed JSON (ttfts, itls, ...)",
        vllm_bench.sniff,
        vllm_bench.convert,
    )
)
register(
    Ingestor(
        "vllm-requests",
        "vLLM per-request stats JSONL (arrival_time, queued_ts, first_token_ts, ...)",
        vllm_requests.sniff,
        vllm_requests.convert,
    )
)
register(
    Ingestor(
        "llmservingsim-meta",
        "LLMServingSim vLLM bench meta.json (engine_kwargs, vllm_version, started_at)",
        llmservingsim.sniff_meta,
        llmservingsim.convert_meta,
    )
)
register(
    Ingestor(
        "llmservingsim-timeseries",
        "LLMServingSim vLLM bench timeseries.csv (running, waiting, kv_cache_pct per tick)",
        llmservingsim.sniff_timeseries,
        llmservingsim.convert_timeseries,
    )
)
register(
    Ingestor(
        "trtllm-iterlog",
        "TensorRT-LLM IterationStats: JSON lines/array (/metrics) or trtllm-bench --iteration_log",
        trtllm.sniff,
        trtllm.convert,
    )
)
register(
    Ingestor(
        "sglang-log", "SGLang server log: Prefill batch / Decode batch lines", sglang.sniff_log, sglang.convert_log
    )
)
register(
    Ingestor(
        "sglang-metrics",
        "SGLang --export-metrics-to-file request records (sglang-request-metrics-*.log)",
        sglang.sniff_metrics,
        sglang.convert_metrics,
    )
)
register(
    Ingestor(
        "fpm",
        "ForwardPassMetrics JSONL (SGLang/vLLM/Dynamo per-step stream; fpm-relay*.jsonl.gz)",
        fpm.sniff,
        fpm.convert,
    )
)
register(
    Ingestor(
        "aiperf",
        "AIPerf profile_export.jsonl (per-request records, epoch ns)",
        aiperf.sniff_aiperf,
        aiperf.convert_aiperf,
    )
)
register(
    Ingestor(
        "genai-perf",
        "GenAI-Perf profile_export.json (experiments -> requests, epoch ns)",
        aiperf.sniff_genai_perf,
        aiperf.convert_genai_perf,
    )
)

register(
    Ingestor(
        "guidellm",
        "guidellm benchmarks.json (report v2: benchmarks -> requests, time.time())",
        harness.sniff_guidellm,
        harness.convert_guidellm,
    )
)
register(
    Ingestor(
        "inference-perf",
        "inference-perf per_request_lifecycle_metrics.json (perf_counter clock)",
        harness.sniff_inference_perf,
        harness.convert_inference_perf,
    )
)

register(
    Ingestor(
        "otel",
        "OpenTelemetry OTLP JSON spans from vLLM (llm_request: queue, TTFT, E2E per request)",
        otel.sniff,
        otel.convert,
    )
)

register(
    Ingestor(
        "aiperf-server-metrics",
        "AIPerf server_metrics_export.jsonl (Prometheus scrapes of the engine)",
        prometheus.sniff_aiperf_metrics,
        prometheus.convert_aiperf_metrics,
    )
)
register(
    Ingestor(
        "prometheus-text",
        "Prometheus text exposition snapshots with '# Timestamp:' headers",
        prometheus.sniff_exposition,
        prometheus.convert_exposition,
    )
)
register(
    Ingestor(
        "prometheus-range",
        "Prometheus query_range JSON (matrix of series)",
        prometheus.sniff_query_range,
        prometheus.convert_query_range,
    )
)
