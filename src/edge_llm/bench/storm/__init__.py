"""``edge-llm storm``: simulated users who press regenerate, abandon and read slowly.

Modules: ``corpus`` (real text for prompts), ``load`` (the load model: who sends
what, when they give up, how they read; pure), ``user`` (one user against one
target), ``watch`` (what the server does meanwhile: /debug/streams, /metrics, RSS),
``stats`` (a target's figures from the records and samples; pure), ``run`` (the
storm against several targets, interleaved) and ``report`` (table and HTML).
"""

from edge_llm.bench.storm.load import StormSettings, StormSettingsError
from edge_llm.bench.storm.report import class_table, storm_table, summary_row, write_html
from edge_llm.bench.storm.run import LiveState, StormConfig, StormResult, run_storm
from edge_llm.bench.storm.user import OUTCOMES

__all__ = [
    "OUTCOMES",
    "LiveState",
    "StormConfig",
    "StormResult",
    "StormSettings",
    "StormSettingsError",
    "class_table",
    "run_storm",
    "storm_table",
    "summary_row",
    "write_html",
]
