"""Who is responsible for a stall: the rules behind ``edge-llm blame`` (pure, no I/O).

Input is the engine's and the client's JSONL event logs (see
:mod:`edge_llm.observability.events`), already parsed into dicts. The steps:

1. :func:`build_timelines` joins both logs per request, keyed by the server's stream
   id. Client lines written before that id was known are matched through
   ``client_request_id`` (one key per attempt); ``kv_freed`` lines (request_id null)
   go to the request whose ``scheduled`` line last named their slot.
2. Each rule is a small function ``(Timeline, Thresholds) -> list[Finding]``. A
   finding names a party and carries the evidence lines, untouched.
3. :func:`judge` runs every rule: the verdict is the most serious party found
   (``engine`` > ``upstream`` > ``transport`` > ``client`` > ``unknown``), else ``ok``.

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

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Event = Mapping[str, Any]

ENGINE = "engine"
UPSTREAM = "upstream"
CLIENT = "client"
TRANSPORT = "transport"
UNKNOWN = "unknown"
OK = "ok"
VERDICT_PRIORITY = (ENGINE, UPSTREAM, TRANSPORT, CLIENT, UNKNOWN)
VERDICTS = (*VERDICT_PRIORITY, OK)

MAX_PAUSE_TOKENS = 1  # the step already in flight when the pause took effect
CLIENT_HIGH_EVENTS = ("watermark_high", "pause_sent", "read_paused")
CLIENT_LOW_EVENTS = ("watermark_low", "resume_sent", "read_resumed")
CLIENT_PAUSE_EVENTS = ("pause_sent", "read_paused")
TRANSPORT_ERROR_CODES = ("read_error", "dead_connection", "socket_eagain")
LINES_AFTER_CANCEL_ALLOWED = ("end", "kv_freed")
LOCAL_BACKEND = "local"
UPSTREAM_ERROR_CODES = ("upstream_error", "upstream_unavailable", "ttft_timeout")


@dataclass(frozen=True)
class Thresholds:
    """How long each side may take before silence counts against it."""

    grace_s: float = 0.5  # watermark_high -> PAUSE sent; PAUSE/CANCEL sent -> engine acts
    lag_s: float = 1.0  # engine first token -> client first token
    kv_grace_s: float = 1.0  # end/cancel -> kv_freed (a step, with margin)
    upstream_ttft_s: float = 3.0  # an upstream's first token (the client's ttft_warn_ms)


@dataclass(frozen=True)
class Finding:
    party: str
    rule: str
    message: str
    evidence: tuple[Event, ...]


@dataclass
class Timeline:
    """One request: its engine lines and client lines, each in log order."""

    request_id: str
    client_request_ids: list[str] = field(default_factory=list)
    engine: list[Event] = field(default_factory=list)
    client: list[Event] = field(default_factory=list)
    have_engine_log: bool = False
    have_client_log: bool = False
    engine_log_end_ts: float | None = None  # the last line of the whole engine log

    @property
    def first_ts(self) -> float:
        return min((_ts(e) for e in [*self.engine, *self.client]), default=0.0)


@dataclass(frozen=True)
class PauseStats:
    pauses: int
    paused_ms: float
    backpressure_peak: int
    source: str  # which lines the numbers come from


@dataclass(frozen=True)
class RequestReport:
    request_id: str
    client_request_ids: tuple[str, ...]
    verdict: str
    findings: tuple[Finding, ...]
    notes: tuple[str, ...]
    outcome: str
    n_generated: int | None
    stats: PauseStats
    first_ts: float


@dataclass(frozen=True)
class BlameReport:
    requests: tuple[RequestReport, ...]
    notes: tuple[str, ...]

    def totals(self) -> dict[str, int]:
        counts = dict.fromkeys(VERDICTS, 0)
        for request in self.requests:
            counts[request.verdict] += 1
        return counts


# -- small accessors -----------------------------------------------------------------------


def _ts(event: Event) -> float:
    value = event.get("ts")
    return float(value) if isinstance(value, int | float) else 0.0


def _int(event: Event | None, key: str) -> int | None:
    value = None if event is None else event.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(event: Event | None, key: str) -> float | None:
    value = None if event is None else event.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _name(event: Event) -> str:
    return str(event.get("event"))


def _named(events: Iterable[Event], *names: str) -> list[Event]:
    return [e for e in events if e.get("event") in names]


def _first(events: Iterable[Event], *names: str) -> Event | None:
    return next(iter(_named(events, *names)), None)


def _last(events: Sequence[Event], *names: str) -> Event | None:
    found = _named(events, *names)
    return found[-1] if found else None


def _within(events: Iterable[Event], start: float, stop: float, *names: str) -> list[Event]:
    return [e for e in _named(events, *names) if start <= _ts(e) <= stop]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


# -- reading -------------------------------------------------------------------------------


def split_sources(
    events: Iterable[dict[str, Any]], default: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(engine lines, client lines) by each line's ``source``; ``default`` if it has none."""
    engine: list[dict[str, Any]] = []
    client: list[dict[str, Any]] = []
    for event in events:
        source = event.get("source") or default
        if source == ENGINE:
            engine.append(event)
        elif source == CLIENT:
            client.append(event)
    return engine, client


# -- joining -------------------------------------------------------------------------------


def engine_by_request(events: Iterable[Event]) -> dict[str, list[Event]]:
    """Engine lines per request id; ``kv_freed`` goes to the slot's last holder."""
    grouped: dict[str, list[Event]] = {}
    slot_owner: dict[int, str] = {}
    for event in events:
        request_id = event.get("request_id")
        if _name(event) == "scheduled" and isinstance(request_id, str):
            slot = _int(event, "slot")
            if slot is not None:
                slot_owner[slot] = request_id
        if request_id is None and _name(event) == "kv_freed":
            request_id = _slot_holder(event, slot_owner)
        if isinstance(request_id, str) and request_id:
            grouped.setdefault(request_id, []).append(event)
    return grouped


def _slot_holder(event: Event, slot_owner: Mapping[int, str]) -> str | None:
    slot = _int(event, "slot")
    return None if slot is None else slot_owner.get(slot)


def client_attempts(events: Iterable[Event]) -> list[tuple[str, str, list[Event]]]:
    """(request key, client_request_id, lines) per attempt. An attempt starts at a
    ``request_sent``; its key is the first server id any of its lines carries, else
    the client_request_id (the request never got a server id)."""
    attempts: dict[str, list[list[Event]]] = {}
    for event in events:
        client_id = event.get("client_request_id") or event.get("request_id")
        if not client_id:
            continue  # not about a request (log_closed)
        segments = attempts.setdefault(str(client_id), [[]])
        if _name(event) == "request_sent" and _first(segments[-1], "request_sent"):
            segments.append([])
        segments[-1].append(event)
    result = []
    for client_id, segments in attempts.items():
        for lines in segments:
            server_id = next((e["request_id"] for e in lines if e.get("request_id")), None)
            result.append((str(server_id or client_id), client_id, lines))
    return result


def build_timelines(
    engine_events: Sequence[Event],
    client_events: Sequence[Event],
    *,
    have_engine_log: bool,
    have_client_log: bool,
) -> list[Timeline]:
    """One timeline per request seen in either log, oldest first."""
    timelines: dict[str, Timeline] = {}
    log_end = max((_ts(e) for e in engine_events), default=None)

    def timeline(key: str) -> Timeline:
        if key not in timelines:
            timelines[key] = Timeline(
                key,
                have_engine_log=have_engine_log,
                have_client_log=have_client_log,
                engine_log_end_ts=log_end,
            )
        return timelines[key]

    for request_id, lines in engine_by_request(engine_events).items():
        timeline(request_id).engine.extend(lines)
    for key, client_id, lines in client_attempts(client_events):
        found = timeline(key)
        found.client.extend(lines)
        if client_id not in found.client_request_ids:
            found.client_request_ids.append(client_id)
    return sorted(timelines.values(), key=lambda t: t.first_ts)


# -- engine rules --------------------------------------------------------------------------


def _pause_cause(event: Event) -> str | None:
    name = _name(event)
    if name in ("pause_received", "resume_received"):
        return "client"
    if name in ("paused", "resumed"):
        return str(event.get("cause"))
    return None


def _closes_pause(event: Event, cause: str) -> bool:
    name = _name(event)
    if name in ("end", "cancel"):
        return True
    return name in ("resume_received", "resumed") and _pause_cause(event) == cause


def pause_episodes(engine: Sequence[Event]) -> list[tuple[str, list[Event]]]:
    """(cause, lines) for each pause: from ``pause_received`` (or ``paused``) to its
    ``resume_received``/``resumed``/``end``, with every engine line in between."""
    episodes: list[tuple[str, list[Event]]] = []
    open_: dict[str, list[Event]] = {}
    for event in engine:
        for open_cause in list(open_):
            open_[open_cause].append(event)
            if _closes_pause(event, open_cause):
                episodes.append((open_cause, open_.pop(open_cause)))
        cause = _pause_cause(event)
        starts = _name(event) in ("pause_received", "paused")
        if starts and cause is not None and cause not in open_:
            open_[cause] = [event]
    episodes.extend(open_.items())
    return episodes


def _tokens_in_episode(lines: Sequence[Event]) -> tuple[int, int | None, int | None, int]:
    """(tokens generated, n_generated at start, highest n_generated seen, lines)."""
    start = _int(lines[0], "n_generated")
    seen = [n for n in (_int(e, "n_generated") for e in lines[1:]) if n is not None]
    highest = max(seen, default=start)
    growth = highest - start if start is not None and highest is not None else 0
    n_lines = len(_named(lines, "token_while_paused"))
    return max(growth, n_lines), start, highest, n_lines


def _pause_sent_before(t: Timeline, received: Event, th: Thresholds) -> list[Event]:
    """The client's PAUSE line that this ``pause_received`` answers, if logged."""
    sent = [e for e in _named(t.client, "pause_sent") if _ts(e) <= _ts(received) + th.grace_s]
    return sent[-1:]


def tokens_after_pause(t: Timeline, th: Thresholds) -> list[Finding]:
    """Engine: more than one token generated during one pause."""
    findings = []
    for cause, lines in pause_episodes(t.engine):
        tokens, start, highest, n_lines = _tokens_in_episode(lines)
        if tokens <= MAX_PAUSE_TOKENS:
            continue
        closing = lines[-1] if len(lines) > 1 and _closes_pause(lines[-1], cause) else None
        shown = ("paused", "token_while_paused")
        evidence = [e for e in lines if e is lines[0] or e is closing or _name(e) in shown]
        if cause == "client":
            evidence = sorted([*_pause_sent_before(t, lines[0], th), *evidence], key=_ts)
        findings.append(
            Finding(
                ENGINE,
                "tokens_after_pause",
                f"kept generating after the {cause} PAUSE: {tokens} tokens (n_generated "
                f"{start} -> {highest}, {n_lines} token_while_paused lines); at most "
                f"{MAX_PAUSE_TOKENS} is allowed, the step already in flight",
                tuple(evidence),
            )
        )
    return findings


def lines_after_cancel(t: Timeline, th: Thresholds) -> list[Finding]:
    """Engine: a sequence kept producing lines after its own ``cancel``."""
    cancel = _first(t.engine, "cancel")
    if cancel is None:
        return []
    after = t.engine[t.engine.index(cancel) + 1 :]
    extra = [e for e in after if _name(e) not in LINES_AFTER_CANCEL_ALLOWED]
    if not extra:
        return []
    names = ", ".join(sorted({_name(e) for e in extra}))
    message = f"ignored its own cancel ({cancel.get('reason')}): {len(extra)} lines after it"
    return [Finding(ENGINE, "lines_after_cancel", f"{message} ({names})", (cancel, *extra))]


def kv_release(t: Timeline, th: Thresholds) -> str:
    """``freed``, ``not_freed``, ``unseen`` (the log ends or the engine shut down
    before it could show) or ``none`` (the request never held a slot or never ended)."""
    end = _last(t.engine, "end")
    if _first(t.engine, "scheduled") is None or end is None:
        return "none"
    if _first(t.engine, "kv_freed") is not None:
        return "freed"
    cancel = _first(t.engine, "cancel")
    if cancel is not None and cancel.get("reason") == "shutdown":
        return "unseen"
    log_end = t.engine_log_end_ts
    if log_end is None or log_end <= _ts(end) + th.kv_grace_s:
        return "unseen"
    return "not_freed"


def kv_not_freed(t: Timeline, th: Thresholds) -> list[Finding]:
    """Engine: the sequence ended but no ``kv_freed`` line for its slot followed."""
    if kv_release(t, th) != "not_freed":
        return []
    scheduled = _first(t.engine, "scheduled") or {}
    ending = [e for e in (_first(t.engine, "cancel"), _last(t.engine, "end")) if e is not None]
    return [
        Finding(
            ENGINE,
            "kv_not_freed",
            f"KV cells of slot {scheduled.get('slot')} were never freed after the sequence "
            f"ended (no kv_freed within {_ms(th.kv_grace_s)}; cancel_release_kv off?)",
            (scheduled, *ending),
        )
    ]


def _engine_live_after(t: Timeline, when: float) -> list[Event]:
    """Engine lines after ``when``, if the sequence had not ended by then."""
    end = _last(t.engine, "end")
    if end is not None and _ts(end) <= when:
        return []
    return [e for e in t.engine if _ts(e) > when and _name(e) != "kv_freed"]


def pause_not_acted(t: Timeline, th: Thresholds) -> list[Finding]:
    """Engine: the client sent PAUSE (WebSocket) and the engine never logged receiving
    it, while the sequence went on."""
    findings = []
    for sent in _named(t.client, "pause_sent"):
        when = _ts(sent)
        window = (when - th.grace_s, when + th.grace_s)
        if _within(t.engine, *window, "pause_received", "end") or not t.engine:
            continue
        later = _engine_live_after(t, window[1])
        if later:
            findings.append(
                Finding(
                    ENGINE,
                    "pause_not_received",
                    f"the client sent PAUSE but the engine logged no pause_received within "
                    f"{_ms(th.grace_s)} and went on (or the frame was lost on the way)",
                    (sent, *later[:3]),
                )
            )
    return findings


def cancel_not_acted(t: Timeline, th: Thresholds) -> list[Finding]:
    """Engine: the client cancelled and the engine neither cancelled nor ended the
    sequence in time, but went on."""
    sent = _first(t.client, "cancel_sent")
    if sent is None or not t.engine:
        return []
    deadline = _ts(sent) + th.grace_s
    if [e for e in _named(t.engine, "cancel", "end") if _ts(e) <= deadline]:
        return []
    later = _engine_live_after(t, deadline)
    if not later:
        return []
    return [
        Finding(
            ENGINE,
            "cancel_not_acted",
            f"the client cancelled ({sent.get('reason')}, by {sent.get('method')}) but the "
            f"engine logged no cancel within {_ms(th.grace_s)} and went on",
            (sent, *later[:3]),
        )
    ]


# -- client rules --------------------------------------------------------------------------


def _socket_full_pauses(engine: Iterable[Event]) -> list[Event]:
    return [e for e in _named(engine, "paused") if e.get("cause") == "socket_full"]


def _until_low(t: Timeline, high: Event) -> list[Event]:
    """Engine socket_full pauses from ``high`` until the client's next ``watermark_low``."""
    low = next((e for e in _named(t.client, "watermark_low") if _ts(e) >= _ts(high)), None)
    stop = _ts(low) if low is not None else float("inf")
    return [e for e in _socket_full_pauses(t.engine) if _ts(high) <= _ts(e) <= stop]


def _stream_ended_by(t: Timeline, when: float) -> bool:
    ends = [*_named(t.client, "end", "error", "cancel_sent"), *_named(t.engine, "end")]
    return any(_ts(e) <= when for e in ends)


def _missing_pause(t: Timeline, high: Event, th: Thresholds) -> str | None:
    """Why no PAUSE followed this high watermark, or None if one did (or none was due)."""
    if high.get("pause_enabled") is False:
        return "with PAUSE disabled: no PAUSE was sent"
    deadline = _ts(high) + th.grace_s
    if _within(t.client, _ts(high), deadline, *CLIENT_PAUSE_EVENTS):
        return None
    if _stream_ended_by(t, deadline):
        return None
    return f"and sent no PAUSE within {_ms(th.grace_s)}"


def no_pause(t: Timeline, th: Thresholds) -> list[Finding]:
    """Client: render queue at its high watermark, and no PAUSE (or read pause) sent:
    either pausing was disabled or it did not happen within the grace period."""
    findings = []
    for high in _named(t.client, "watermark_high"):
        reason = _missing_pause(t, high, th)
        if reason is None:
            continue
        fill = f"{high.get('queue_fill')}, {high.get('queue_len')}/{high.get('queue_capacity')}"
        consequence = _until_low(t, high)
        tail = "; the engine's ring then filled (socket_full)" if consequence else ""
        message = f"render queue reached its high watermark (fill {fill}) {reason}{tail}"
        findings.append(Finding(CLIENT, "no_pause", message, (high, *consequence)))
    return findings


def _client_flow_state(t: Timeline, when: float) -> Event | None:
    """The client's last watermark/pause/read line at or before ``when``."""
    flow = _named(t.client, *CLIENT_HIGH_EVENTS, *CLIENT_LOW_EVENTS)
    before = [e for e in flow if _ts(e) <= when]
    return before[-1] if before else None


def socket_full_cause(t: Timeline, th: Thresholds) -> list[Finding]:
    """The engine's ring filled (``paused`` socket_full). The client's state then says
    why: it had stopped reading (client), it was reading (transport), or there is no
    client log to tell (unknown). A high watermark with PAUSE disabled is left to
    :func:`no_pause`, which shows these pauses as its consequence."""
    findings = []
    for paused in _socket_full_pauses(t.engine):
        if not t.client:
            findings.append(_socket_full_unattributed(t, paused))
            continue
        state = _client_flow_state(t, _ts(paused))
        if state is not None and state.get("pause_enabled") is False:
            continue
        findings.append(_socket_full_with_client(paused, state, th))
    return findings


def _socket_full_unattributed(t: Timeline, paused: Event) -> Finding:
    missing = "the client log missing" if not t.have_client_log else "no client lines for it"
    return Finding(
        UNKNOWN,
        "socket_full",
        f"the engine's ring filled and it paused this sequence (socket_full): the reader "
        f"was slow, but with {missing} it cannot tell client from transport",
        (paused,),
    )


def _socket_full_with_client(paused: Event, state: Event | None, th: Thresholds) -> Finding:
    ring = f"ring {paused.get('ring_write')}/{paused.get('ring_read')} write/read"
    if state is not None and _name(state) in CLIENT_HIGH_EVENTS:
        return Finding(
            CLIENT,
            "stopped_reading",
            f"the client stopped reading ({_name(state)}, render queue high), so the "
            f"engine's ring filled ({ring}) and it paused this sequence (socket_full)",
            (state, paused),
        )
    if state is not None and _ts(paused) - _ts(state) <= th.lag_s:
        return Finding(
            CLIENT,
            "stopped_reading",
            f"the engine's ring filled ({ring}) {_ms(_ts(paused) - _ts(state))} after the "
            f"client resumed reading ({_name(state)}): the backlog of its own pause",
            (state, paused),
        )
    return Finding(
        TRANSPORT,
        "ring_full_while_reading",
        f"the engine's ring filled ({ring}) while the client was reading (render queue "
        f"not high): bytes were stuck between the engine and the client",
        (paused,) if state is None else (state, paused),
    )


# -- transport rules -----------------------------------------------------------------------


def late_first_token(t: Timeline, th: Thresholds) -> list[Finding]:
    """Transport: the first token took longer than ``lag_s`` from the engine to the
    client, while the engine was not paused."""
    produced = _first(t.engine, "first_token")
    seen = _first(t.client, "first_token")
    if produced is None or seen is None:
        return []
    lag = _ts(seen) - _ts(produced)
    paused = _within(t.engine, _ts(produced), _ts(seen), "paused")
    if lag <= th.lag_s or paused:
        return []
    warned = _within(t.client, _ts(produced), _ts(seen), "ttft_warn")
    return [
        Finding(
            TRANSPORT,
            "late_first_token",
            f"the engine produced the first token {_ms(lag)} before the client saw it, "
            f"not paused in between: delayed between them (network, proxy, or a blocked "
            f"client event loop)",
            (produced, *warned, seen),
        )
    ]


def _cancel_requested_before(t: Timeline, when: float, th: Thresholds) -> bool:
    return any(_ts(e) <= when + th.grace_s for e in _named(t.client, "cancel_sent"))


def dropped_connection(t: Timeline, th: Thresholds) -> list[Finding]:
    """Transport: the engine saw a disconnect nobody asked for, or the client lost the
    stream (read error, dead connection) while the engine had not ended it on purpose."""
    disconnect = next(
        (e for e in _named(t.engine, "cancel") if e.get("reason") == "disconnect"), None
    )
    if disconnect is not None and _cancel_requested_before(t, _ts(disconnect), th):
        return []
    error = next(
        (e for e in _named(t.client, "error") if e.get("code") in TRANSPORT_ERROR_CODES), None
    )
    if disconnect is None and (error is None or _named(t.engine, "cancel")):
        return []  # nothing dropped, or the engine ended the stream on purpose
    return [_drop_finding(t, disconnect, error)]


def _drop_finding(t: Timeline, disconnect: Event | None, error: Event | None) -> Finding:
    """Transport, unless a log is missing or the client log stops before the disconnect:
    then a dropped connection cannot be told from a client that died (its last lines
    may never have been flushed)."""
    evidence = tuple(e for e in (error, disconnect, _last(t.engine, "end")) if e is not None)
    if not t.engine or not t.client:
        side = "client" if not t.client else "engine"
        return _unattributed_drop(f"without the {side} side it cannot tell who closed it", evidence)
    if error is None and disconnect is not None and not _client_went_on(t, _ts(disconnect)):
        return _unattributed_drop(
            "the client log stops before it (no end, error or cancel): the client "
            "process may have died, or its last lines were never flushed",
            (*evidence, t.client[-1]),
        )
    what = f"client error {error.get('code')}" if error is not None else "no client cancel"
    seen = "saw a disconnect" if disconnect is not None else "had not ended it"
    return Finding(
        TRANSPORT,
        "dropped_connection",
        f"the connection dropped with nobody asking for it ({what}; engine {seen})",
        evidence,
    )


def _unattributed_drop(why: str, evidence: tuple[Event, ...]) -> Finding:
    return Finding(UNKNOWN, "dropped_connection", f"the connection dropped; {why}", evidence)


def _client_went_on(t: Timeline, when: float) -> bool:
    """The client logged something at or after ``when`` (it was alive then)."""
    return any(_ts(e) >= when for e in t.client)


# -- upstream rules ------------------------------------------------------------------------


def upstream_of(t: Timeline) -> tuple[str, Event] | None:
    """The upstream the request was relayed to, with its ``routed`` line."""
    routed = _first(t.engine, "routed")
    backend = routed.get("backend") if routed is not None else None
    if routed is None or not backend or backend == LOCAL_BACKEND:
        return None
    return str(backend), routed


def upstream_failed(t: Timeline, th: Thresholds) -> list[Finding]:
    """Upstream: it ended the stream with an error or never sent a first token in time."""
    relayed = upstream_of(t)
    end = _last(t.engine, "end")
    if relayed is None or end is None or end.get("error") not in UPSTREAM_ERROR_CODES:
        return []
    backend, routed = relayed
    failovers = _named(t.engine, "upstream_failover")
    message = f"the upstream {backend!r} ended the stream: {end.get('error')}"
    if failovers:
        message += f" (after {len(failovers)} failover(s))"
    return [Finding(UPSTREAM, "upstream_failed", message, (routed, *failovers, end))]


def slow_upstream(t: Timeline, th: Thresholds) -> list[Finding]:
    """Upstream: its first token took longer than ``upstream_ttft_s``, not paused."""
    relayed = upstream_of(t)
    first = _first(t.engine, "first_token")
    if relayed is None or first is None:
        return []
    backend, routed = relayed
    ttft_ms = _num(first, "ttft_ms") or 0.0
    if ttft_ms <= th.upstream_ttft_s * 1000.0 or _within(
        t.engine, _ts(routed), _ts(first), "paused"
    ):
        return []
    message = (
        f"the upstream {backend!r} sent its first token after {ttft_ms:.0f} ms "
        f"(over {_ms(th.upstream_ttft_s)}), nothing paused: the wait was the upstream's"
    )
    return [Finding(UPSTREAM, "slow_upstream", message, (routed, first))]


Rule = Callable[[Timeline, Thresholds], list[Finding]]
# About the local decode loop: a relayed request has none.
LOCAL_ONLY_RULES: tuple[Rule, ...] = (tokens_after_pause, kv_not_freed)
RULES: tuple[Rule, ...] = (
    tokens_after_pause,
    lines_after_cancel,
    kv_not_freed,
    pause_not_acted,
    cancel_not_acted,
    no_pause,
    socket_full_cause,
    late_first_token,
    dropped_connection,
    upstream_failed,
    slow_upstream,
)


# -- what a single log cannot tell ---------------------------------------------------------


def notes_for(t: Timeline, th: Thresholds) -> list[str]:
    """What this request's lines cannot tell (a log missing altogether is said once,
    in :func:`log_notes`)."""
    notes = []
    if t.have_engine_log and not t.engine:
        notes.append("no engine lines for this request: it never reached this engine's log")
    if t.have_client_log and not t.client:
        notes.append("no client lines for this request (a client without an event log?)")
    if kv_release(t, th) == "unseen":
        notes.append("the log ends (or the engine shut down) before KV release could show")
    return notes


# -- judging -------------------------------------------------------------------------------


def pause_stats(t: Timeline) -> PauseStats:
    """Pauses, paused time and backpressure peak: from the engine's ``end`` line, else
    its paused/resumed lines, else the client's pause lines."""
    end = _last(t.engine, "end")
    if end is not None:
        return PauseStats(
            _int(end, "pauses") or 0,
            _num(end, "paused_ms") or 0.0,
            _int(end, "backpressure_peak") or 0,
            "engine end",
        )
    if t.engine:
        return _stats_from_engine_pauses(t.engine)
    return _stats_from_client_pauses(t.client)


def _stats_from_engine_pauses(engine: Sequence[Event]) -> PauseStats:
    level = peak = pauses = 0
    paused_ms = 0.0
    for event in _named(engine, "paused", "resumed"):
        step = 1 if _name(event) == "paused" else -1
        level = max(0, level + step)
        peak = max(peak, level)
        pauses += step == 1
        paused_ms += _num(event, "paused_ms") or 0.0
    return PauseStats(pauses, round(paused_ms, 3), peak, "engine pause lines")


def _stats_from_client_pauses(client: Sequence[Event]) -> PauseStats:
    pauses = 0
    paused_ms = 0.0
    since: float | None = None
    for event in _named(client, *CLIENT_PAUSE_EVENTS, "resume_sent", "read_resumed"):
        mono = _num(event, "mono")
        if _name(event) in CLIENT_PAUSE_EVENTS:
            pauses += 1
            since = mono
        elif since is not None and mono is not None:
            paused_ms += (mono - since) * 1000.0
            since = None
    return PauseStats(pauses, round(paused_ms, 3), min(pauses, 1), "client pause lines")


def outcome(t: Timeline) -> str:
    rejected = _first(t.engine, "rejected")
    cancel = _first(t.engine, "cancel")
    end = _last(t.engine, "end")
    client_end = _last(t.client, "end")
    client_error = _last(t.client, "error")
    if rejected is not None:
        return f"rejected ({rejected.get('code')})"
    if cancel is not None:
        return f"cancelled ({cancel.get('reason')})"
    if end is not None:
        return str(end.get("finish_reason") or f"error ({end.get('error')})")
    if client_error is not None:
        return f"client error ({client_error.get('code')})"
    if client_end is not None:
        return str(client_end.get("finish_reason"))
    return "no end line"


def n_generated(t: Timeline) -> int | None:
    counts = [n for n in (_int(e, "n_generated") for e in t.engine) if n is not None]
    if counts:
        return max(counts)
    return _int(_last(t.client, "end"), "n_tokens")


def verdict_of(findings: Iterable[Finding]) -> str:
    parties = {f.party for f in findings}
    return next((p for p in VERDICT_PRIORITY if p in parties), OK)


def judge(t: Timeline, th: Thresholds) -> RequestReport:
    relayed = upstream_of(t) is not None
    rules = [r for r in RULES if not (relayed and r in LOCAL_ONLY_RULES)]
    findings = tuple(f for rule in rules for f in rule(t, th))
    return RequestReport(
        request_id=t.request_id,
        client_request_ids=tuple(t.client_request_ids),
        verdict=verdict_of(findings),
        findings=findings,
        notes=tuple(notes_for(t, th)),
        outcome=outcome(t),
        n_generated=n_generated(t),
        stats=pause_stats(t),
        first_ts=t.first_ts,
    )


def log_notes(
    engine_events: Sequence[Event],
    client_events: Sequence[Event],
    *,
    have_engine: bool,
    have_client: bool,
) -> list[str]:
    notes = []
    if not have_engine:
        notes.append(
            "no engine log: cannot tell whether the engine honoured PAUSE/CANCEL, freed KV, "
            "or why its ring filled"
        )
    if not have_client:
        notes.append(
            "no client log: cannot tell whether the render queue was high, whether PAUSE was "
            "sent in time, or whether bytes were delayed in transit"
        )
    for closed in _named([*engine_events, *client_events], "log_closed"):
        dropped = _int(closed, "dropped") or 0
        if dropped:
            notes.append(
                f"the {closed.get('source')} log dropped {dropped} lines: evidence may be missing"
            )
    return notes


def blame(
    engine_events: Sequence[Event],
    client_events: Sequence[Event],
    *,
    have_engine_log: bool,
    have_client_log: bool,
    thresholds: Thresholds | None = None,
) -> BlameReport:
    """Join both logs and judge every request. Pass ``have_*_log=False`` for a log that
    was not given (an empty list then means "unknown", not "nothing happened")."""
    th = thresholds or Thresholds()
    timelines = build_timelines(
        engine_events,
        client_events,
        have_engine_log=have_engine_log,
        have_client_log=have_client_log,
    )
    return BlameReport(
        requests=tuple(judge(t, th) for t in timelines),
        notes=tuple(
            log_notes(
                engine_events,
                client_events,
                have_engine=have_engine_log,
                have_client=have_client_log,
            )
        ),
    )


def select(report: BlameReport, request: str) -> BlameReport:
    """Only the requests whose server id starts with ``request`` or whose client id is it."""
    chosen = tuple(
        r
        for r in report.requests
        if r.request_id.startswith(request) or request in r.client_request_ids
    )
    return BlameReport(chosen, report.notes)
