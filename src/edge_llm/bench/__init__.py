"""``edge-llm bench``: the same prompts against several OpenAI-compatible endpoints.

Modules: ``targets`` (``NAME=URL[,key=..,model=..]``), ``prompts`` (built-in sets and
JSONL), ``connection`` (a minimal HTTP/1.1 client with socket control), ``chat_stream``
(one timestamped streaming request), ``record`` and ``stats`` (metrics), ``runner``
(warm-up, interleaved levels), ``slow_consumer`` (the stalled-reader probe),
``inspector`` (edge-llm's /debug/streams and /metrics), ``table``, ``svg`` and
``report`` (terminal and HTML output). ``storm/`` is the storm lab behind
``edge-llm storm``, built on the same pieces.
"""

from edge_llm.bench.chat_stream import RequestOptions, run_request
from edge_llm.bench.prompts import Prompt, builtin_prompts, load_jsonl
from edge_llm.bench.record import RequestRecord
from edge_llm.bench.runner import BenchConfig, BenchResult, run_bench
from edge_llm.bench.slow_consumer import SlowConsumerResult, SlowConsumerSettings, probe
from edge_llm.bench.stats import Distribution, Summary, percentile, summarize
from edge_llm.bench.targets import Target, parse_target

__all__ = [
    "BenchConfig",
    "BenchResult",
    "Distribution",
    "Prompt",
    "RequestOptions",
    "RequestRecord",
    "SlowConsumerResult",
    "SlowConsumerSettings",
    "Summary",
    "Target",
    "builtin_prompts",
    "load_jsonl",
    "parse_target",
    "percentile",
    "probe",
    "run_bench",
    "run_request",
    "summarize",
]
