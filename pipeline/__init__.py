"""tracelat: trace-replay latency analysis for LLM serving runs."""

__version__ = "0.1.0"
