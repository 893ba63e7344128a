"""Who is responsible for a stall: the rules behind ``edge-llm blame`` (pure, no I/O).

Input is the engine's and the client's JSONL event logs (see
:mod:`edge_llm.observability.events`), already parsed into dicts. The steps, one
module each:

1. :mod:`.timeline` joins both logs per request (:func:`build_timelines`).
2. :mod:`.rules`: each rule is a small function ``(Timeline, Thresholds) -> list[Finding]``.
   A finding names a party and carries the evidence lines, untouched.
3. :mod:`.verdict` runs every rule (:func:`blame`): the verdict is the most serious
   party found (``engine`` > ``upstream`` > ``transport`` > ``client`` > ``unknown``),
   else ``ok``.
4. :mod:`.render` prints the report as text or JSON.

:mod:`.model` holds the parties, thresholds and report types; :mod:`.lines` reads
one log line.

Parties:

- ``engine``: tokens after a PAUSE beyond the one step in flight, a PAUSE or CANCEL it
  never acted on, lines for a sequence after its own ``cancel``, KV not freed.
- ``client``: its render queue passed the high watermark and it sent no PAUSE, or it
  stopped reading so the engine's ring filled (cause ``socket_full``).
- ``transport``: the ring filled while the client was reading, a first token that
  took long to cross from engine to client, a connection that dropped with nobody
  asking for it.
- ``upstream``: a request relayed to an upstream engine (its ``routed`` line names
  one) whose first token came late from the upstream while nobody paused, or that
  the upstream ended with an error or a TTFT time-out. Rules about the local
  decode loop (tokens after PAUSE, KV freed) do not apply to such requests.
- ``unknown``: a stall that only the missing log could attribute.

Cross-log comparisons use the wall clock ``ts`` (``mono`` is per process), so they
assume both sides ran on the same host or on synchronised clocks.
"""

from edge_llm.observability.blame.lines import LogLine
from edge_llm.observability.blame.model import (
    CLIENT,
    ENGINE,
    OK,
    TRANSPORT,
    UNKNOWN,
    UPSTREAM,
    VERDICTS,
    BlameReport,
    Finding,
    PauseStats,
    RequestReport,
    Thresholds,
    Timeline,
)
from edge_llm.observability.blame.render import format_event, render_text, report_json
from edge_llm.observability.blame.timeline import build_timelines, split_sources
from edge_llm.observability.blame.verdict import blame, judge, select

__all__ = [
    "CLIENT",
    "ENGINE",
    "OK",
    "TRANSPORT",
    "UNKNOWN",
    "UPSTREAM",
    "VERDICTS",
    "BlameReport",
    "Finding",
    "LogLine",
    "PauseStats",
    "RequestReport",
    "Thresholds",
    "Timeline",
    "blame",
    "build_timelines",
    "format_event",
    "judge",
    "render_text",
    "report_json",
    "select",
    "split_sources",
]
