"""The rules: each a small function ``(Timeline, Thresholds) -> list[Finding]``.

A finding names a party and carries the evidence lines, untouched. Rules about the
local decode loop (tokens after PAUSE, KV freed) do not apply to a request relayed
to an upstream (:data:`LOCAL_ONLY_RULES`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from edge_llm.observability.blame.lines import (
    LogLine,
    first_of,
    int_of,
    last_of,
    ms,
    name_of,
    named,
    num_of,
    ts_of,
    within,
)
from edge_llm.observability.blame.model import (
    CLIENT,
    ENGINE,
    NETWORK,
    TRANSPORT,
    UNKNOWN,
    UPSTREAM,
    Finding,
    Thresholds,
    Timeline,
)
from edge_llm.observability.events import Event

MAX_PAUSE_TOKENS = 1  # the step already in flight when the pause took effect
CLIENT_HIGH_EVENTS = (Event.WATERMARK_HIGH, Event.PAUSE_SENT, Event.READ_PAUSED)
CLIENT_LOW_EVENTS = (Event.WATERMARK_LOW, Event.RESUME_SENT, Event.READ_RESUMED)
CLIENT_PAUSE_EVENTS = (Event.PAUSE_SENT, Event.READ_PAUSED)
TRANSPORT_ERROR_CODES = ("read_error", "dead_connection", "socket_eagain")
LINES_AFTER_CANCEL_ALLOWED = (Event.END, Event.KV_FREED)
LOCAL_BACKEND = "local"
UPSTREAM_ERROR_CODES = ("upstream_error", "upstream_unavailable", "ttft_timeout")


# -- engine rules --------------------------------------------------------------------------


def _pause_cause(event: LogLine) -> str | None:
    name = name_of(event)
    if name in (Event.PAUSE_RECEIVED, Event.RESUME_RECEIVED):
        return "client"
    if name in (Event.PAUSED, Event.RESUMED):
        return str(event.get("cause"))
    return None


def _closes_pause(event: LogLine, cause: str) -> bool:
    name = name_of(event)
    if name in (Event.END, Event.CANCEL):
        return True
    return name in (Event.RESUME_RECEIVED, Event.RESUMED) and _pause_cause(event) == cause


def pause_episodes(engine: Sequence[LogLine]) -> list[tuple[str, list[LogLine]]]:
    """(cause, lines) for each pause: from ``pause_received`` (or ``paused``) to its
    ``resume_received``/``resumed``/``end``, with every engine line in between."""
    episodes: list[tuple[str, list[LogLine]]] = []
    open_: dict[str, list[LogLine]] = {}
    for event in engine:
        for open_cause in list(open_):
            open_[open_cause].append(event)
            if _closes_pause(event, open_cause):
                episodes.append((open_cause, open_.pop(open_cause)))
        cause = _pause_cause(event)
        starts = name_of(event) in (Event.PAUSE_RECEIVED, Event.PAUSED)
        if starts and cause is not None and cause not in open_:
            open_[cause] = [event]
    episodes.extend(open_.items())
    return episodes


def _tokens_in_episode(lines: Sequence[LogLine]) -> tuple[int, int | None, int | None, int]:
    """(tokens generated, n_generated at start, highest n_generated seen, lines)."""
    start = int_of(lines[0], "n_generated")
    seen = [n for n in (int_of(e, "n_generated") for e in lines[1:]) if n is not None]
    highest = max(seen, default=start)
    growth = highest - start if start is not None and highest is not None else 0
    n_lines = len(named(lines, Event.TOKEN_WHILE_PAUSED))
    return max(growth, n_lines), start, highest, n_lines


def _pause_sent_before(t: Timeline, received: LogLine, th: Thresholds) -> list[LogLine]:
    """The client's PAUSE line that this ``pause_received`` answers, if logged."""
    sent = [
        e for e in named(t.client, Event.PAUSE_SENT) if ts_of(e) <= ts_of(received) + th.grace_s
    ]
    return sent[-1:]


def tokens_after_pause(t: Timeline, th: Thresholds) -> list[Finding]:
    """Engine: more than one token generated during one pause."""
    findings = []
    for cause, lines in pause_episodes(t.engine):
        tokens, start, highest, n_lines = _tokens_in_episode(lines)
        if tokens <= MAX_PAUSE_TOKENS:
            continue
        closing = lines[-1] if len(lines) > 1 and _closes_pause(lines[-1], cause) else None
        shown = (Event.PAUSED, Event.TOKEN_WHILE_PAUSED)
        evidence = [e for e in lines if e is lines[0] or e is closing or name_of(e) in shown]
        if cause == "client":
            evidence = sorted([*_pause_sent_before(t, lines[0], th), *evidence], key=ts_of)
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
    cancel = first_of(t.engine, Event.CANCEL)
    if cancel is None:
        return []
    after = t.engine[t.engine.index(cancel) + 1 :]
    extra = [e for e in after if name_of(e) not in LINES_AFTER_CANCEL_ALLOWED]
    if not extra:
        return []
    names = ", ".join(sorted({name_of(e) for e in extra}))
    message = f"ignored its own cancel ({cancel.get('reason')}): {len(extra)} lines after it"
    return [Finding(ENGINE, "lines_after_cancel", f"{message} ({names})", (cancel, *extra))]


def kv_release(t: Timeline, th: Thresholds) -> str:
    """``freed``, ``not_freed``, ``unseen`` (the log ends or the engine shut down
    before it could show) or ``none`` (the request never held a slot or never ended)."""
    end = last_of(t.engine, Event.END)
    if first_of(t.engine, Event.SCHEDULED) is None or end is None:
        return "none"
    if first_of(t.engine, Event.KV_FREED) is not None:
        return "freed"
    cancel = first_of(t.engine, Event.CANCEL)
    if cancel is not None and cancel.get("reason") == "shutdown":
        return "unseen"
    log_end = t.engine_log_end_ts
    if log_end is None or log_end <= ts_of(end) + th.kv_grace_s:
        return "unseen"
    return "not_freed"


def kv_not_freed(t: Timeline, th: Thresholds) -> list[Finding]:
    """Engine: the sequence ended but no ``kv_freed`` line for its slot followed."""
    if kv_release(t, th) != "not_freed":
        return []
    scheduled = first_of(t.engine, Event.SCHEDULED) or {}
    ending = [
        e for e in (first_of(t.engine, Event.CANCEL), last_of(t.engine, Event.END)) if e is not None
    ]
    return [
        Finding(
            ENGINE,
            "kv_not_freed",
            f"KV cells of slot {scheduled.get('slot')} were never freed after the sequence "
            f"ended (no kv_freed within {ms(th.kv_grace_s)}; cancel_release_kv off?)",
            (scheduled, *ending),
        )
    ]


def _engine_live_after(t: Timeline, when: float) -> list[LogLine]:
    """Engine lines after ``when``, if the sequence had not ended by then."""
    end = last_of(t.engine, Event.END)
    if end is not None and ts_of(end) <= when:
        return []
    return [e for e in t.engine if ts_of(e) > when and name_of(e) != Event.KV_FREED]


def pause_not_acted(t: Timeline, th: Thresholds) -> list[Finding]:
    """Engine: the client sent PAUSE (WebSocket) and the engine never logged receiving
    it, while the sequence went on."""
    findings = []
    for sent in named(t.client, Event.PAUSE_SENT):
        when = ts_of(sent)
        window = (when - th.grace_s, when + th.grace_s)
        if within(t.engine, *window, Event.PAUSE_RECEIVED, Event.END) or not t.engine:
            continue
        later = _engine_live_after(t, window[1])
        if later:
            findings.append(
                Finding(
                    ENGINE,
                    "pause_not_received",
                    f"the client sent PAUSE but the engine logged no pause_received within "
                    f"{ms(th.grace_s)} and went on (or the frame was lost on the way)",
                    (sent, *later[:3]),
                )
            )
    return findings


def cancel_not_acted(t: Timeline, th: Thresholds) -> list[Finding]:
    """Engine: the client cancelled and the engine neither cancelled nor ended the
    sequence in time, but went on."""
    sent = first_of(t.client, Event.CANCEL_SENT)
    if sent is None or not t.engine:
        return []
    deadline = ts_of(sent) + th.grace_s
    if [e for e in named(t.engine, Event.CANCEL, Event.END) if ts_of(e) <= deadline]:
        return []
    later = _engine_live_after(t, deadline)
    if not later:
        return []
    return [
        Finding(
            ENGINE,
            "cancel_not_acted",
            f"the client cancelled ({sent.get('reason')}, by {sent.get('method')}) but the "
            f"engine logged no cancel within {ms(th.grace_s)} and went on",
            (sent, *later[:3]),
        )
    ]


# -- client rules --------------------------------------------------------------------------


def _socket_full_pauses(engine: Iterable[LogLine]) -> list[LogLine]:
    return [e for e in named(engine, Event.PAUSED) if e.get("cause") == "socket_full"]


def _until_low(t: Timeline, high: LogLine) -> list[LogLine]:
    """Engine socket_full pauses from ``high`` until the client's next ``watermark_low``."""
    low = next((e for e in named(t.client, Event.WATERMARK_LOW) if ts_of(e) >= ts_of(high)), None)
    stop = ts_of(low) if low is not None else float("inf")
    return [e for e in _socket_full_pauses(t.engine) if ts_of(high) <= ts_of(e) <= stop]


def _stream_ended_by(t: Timeline, when: float) -> bool:
    ends = [
        *named(t.client, Event.END, Event.ERROR, Event.CANCEL_SENT),
        *named(t.engine, Event.END),
    ]
    return any(ts_of(e) <= when for e in ends)


def _missing_pause(t: Timeline, high: LogLine, th: Thresholds) -> str | None:
    """Why no PAUSE followed this high watermark, or None if one did (or none was due)."""
    if high.get("pause_enabled") is False:
        return "with PAUSE disabled: no PAUSE was sent"
    deadline = ts_of(high) + th.grace_s
    if within(t.client, ts_of(high), deadline, *CLIENT_PAUSE_EVENTS):
        return None
    if _stream_ended_by(t, deadline):
        return None
    return f"and sent no PAUSE within {ms(th.grace_s)}"


def no_pause(t: Timeline, th: Thresholds) -> list[Finding]:
    """Client: render queue at its high watermark, and no PAUSE (or read pause) sent:
    either pausing was disabled or it did not happen within the grace period."""
    findings = []
    for high in named(t.client, Event.WATERMARK_HIGH):
        reason = _missing_pause(t, high, th)
        if reason is None:
            continue
        fill = f"{high.get('queue_fill')}, {high.get('queue_len')}/{high.get('queue_capacity')}"
        consequence = _until_low(t, high)
        tail = "; the engine's ring then filled (socket_full)" if consequence else ""
        message = f"render queue reached its high watermark (fill {fill}) {reason}{tail}"
        findings.append(Finding(CLIENT, "no_pause", message, (high, *consequence)))
    return findings


def _client_flow_state(t: Timeline, when: float) -> LogLine | None:
    """The client's last watermark/pause/read line at or before ``when``."""
    flow = named(t.client, *CLIENT_HIGH_EVENTS, *CLIENT_LOW_EVENTS)
    before = [e for e in flow if ts_of(e) <= when]
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
        state = _client_flow_state(t, ts_of(paused))
        if state is not None and state.get("pause_enabled") is False:
            continue
        findings.append(_socket_full_with_client(paused, state, th))
    return findings


def _socket_full_unattributed(t: Timeline, paused: LogLine) -> Finding:
    missing = "the client log missing" if not t.have_client_log else "no client lines for it"
    return Finding(
        UNKNOWN,
        "socket_full",
        f"the engine's ring filled and it paused this sequence (socket_full): the reader "
        f"was slow, but with {missing} it cannot tell client from transport",
        (paused,),
    )


def _socket_full_with_client(paused: LogLine, state: LogLine | None, th: Thresholds) -> Finding:
    ring = f"ring {paused.get('ring_write')}/{paused.get('ring_read')} write/read"
    if state is not None and name_of(state) in CLIENT_HIGH_EVENTS:
        return Finding(
            CLIENT,
            "stopped_reading",
            f"the client stopped reading ({name_of(state)}, render queue high), so the "
            f"engine's ring filled ({ring}) and it paused this sequence (socket_full)",
            (state, paused),
        )
    if state is not None and ts_of(paused) - ts_of(state) <= th.lag_s:
        return Finding(
            CLIENT,
            "stopped_reading",
            f"the engine's ring filled ({ring}) {ms(ts_of(paused) - ts_of(state))} after the "
            f"client resumed reading ({name_of(state)}): the backlog of its own pause",
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
    produced = first_of(t.engine, Event.FIRST_TOKEN)
    seen = first_of(t.client, Event.FIRST_TOKEN)
    if produced is None or seen is None:
        return []
    lag = ts_of(seen) - ts_of(produced)
    paused = within(t.engine, ts_of(produced), ts_of(seen), Event.PAUSED)
    if lag <= th.lag_s or paused:
        return []
    warned = within(t.client, ts_of(produced), ts_of(seen), Event.TTFT_WARN)
    return [
        Finding(
            TRANSPORT,
            "late_first_token",
            f"the engine produced the first token {ms(lag)} before the client saw it, "
            f"not paused in between: delayed between them (network, proxy, or a blocked "
            f"client event loop)",
            (produced, *warned, seen),
        )
    ]


def _cancel_requested_before(t: Timeline, when: float, th: Thresholds) -> bool:
    return any(ts_of(e) <= when + th.grace_s for e in named(t.client, Event.CANCEL_SENT))


def dropped_connection(t: Timeline, th: Thresholds) -> list[Finding]:
    """Transport: the engine saw a disconnect nobody asked for, or the client lost the
    stream (read error, dead connection) while the engine had not ended it on purpose."""
    disconnect = next(
        (e for e in named(t.engine, Event.CANCEL) if e.get("reason") == "disconnect"), None
    )
    if disconnect is not None and _cancel_requested_before(t, ts_of(disconnect), th):
        return []
    if named(t.engine, Event.DETACHED):
        return []  # a resumable stream's drop: network_drop tells it
    error = next(
        (e for e in named(t.client, Event.ERROR) if e.get("code") in TRANSPORT_ERROR_CODES), None
    )
    if disconnect is None and (error is None or named(t.engine, Event.CANCEL)):
        return []  # nothing dropped, or the engine ended the stream on purpose
    return [_drop_finding(t, disconnect, error)]


def _drop_finding(t: Timeline, disconnect: LogLine | None, error: LogLine | None) -> Finding:
    """Transport, unless a log is missing or the client log stops before the disconnect:
    then a dropped connection cannot be told from a client that died (its last lines
    may never have been flushed)."""
    evidence = tuple(e for e in (error, disconnect, last_of(t.engine, Event.END)) if e is not None)
    if not t.engine or not t.client:
        side = "client" if not t.client else "engine"
        return _unattributed_drop(f"without the {side} side it cannot tell who closed it", evidence)
    if error is None and disconnect is not None and not _client_went_on(t, ts_of(disconnect)):
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


def network_drop(t: Timeline, th: Thresholds) -> list[Finding]:
    """Network: a resumable stream's connection dropped and the server detached it
    (nobody asked for it); resumed, nothing was lost, else it timed out."""
    drops = named(t.engine, Event.DETACHED)
    if not drops:
        return []
    resumes = [e for e in named(t.engine, Event.RESUMED) if e.get("cause") == "disconnected"]
    timeout = first_of(t.engine, Event.RESUME_TIMEOUT)
    replayed = sum(int_of(e, "replayed") or 0 for e in resumes)
    outcome = f"resumed {len(resumes)} times, {replayed} events replayed"
    if timeout is not None:
        outcome += "; not resumed within the grace at last: cancelled (resume_timeout)"
    evidence = tuple(e for e in (drops[0], first_of(resumes, Event.RESUMED), timeout) if e)
    return [
        Finding(
            NETWORK,
            "network_drop",
            f"the network dropped the connection {len(drops)} times ({outcome})",
            evidence,
        )
    ]


def _unattributed_drop(why: str, evidence: tuple[LogLine, ...]) -> Finding:
    return Finding(UNKNOWN, "dropped_connection", f"the connection dropped; {why}", evidence)


def _client_went_on(t: Timeline, when: float) -> bool:
    """The client logged something at or after ``when`` (it was alive then)."""
    return any(ts_of(e) >= when for e in t.client)


# -- upstream rules ------------------------------------------------------------------------


def upstream_of(t: Timeline) -> tuple[str, LogLine] | None:
    """The upstream the request was relayed to, with its ``routed`` line."""
    routed = first_of(t.engine, Event.ROUTED)
    backend = routed.get("backend") if routed is not None else None
    if routed is None or not backend or backend == LOCAL_BACKEND:
        return None
    return str(backend), routed


def upstream_failed(t: Timeline, th: Thresholds) -> list[Finding]:
    """Upstream: it ended the stream with an error or never sent a first token in time."""
    relayed = upstream_of(t)
    end = last_of(t.engine, Event.END)
    if relayed is None or end is None or end.get("error") not in UPSTREAM_ERROR_CODES:
        return []
    backend, routed = relayed
    failovers = named(t.engine, Event.UPSTREAM_FAILOVER)
    message = f"the upstream {backend!r} ended the stream: {end.get('error')}"
    if failovers:
        message += f" (after {len(failovers)} failover(s))"
    return [Finding(UPSTREAM, "upstream_failed", message, (routed, *failovers, end))]


def slow_upstream(t: Timeline, th: Thresholds) -> list[Finding]:
    """Upstream: its first token took longer than ``upstream_ttft_s``, not paused."""
    relayed = upstream_of(t)
    first = first_of(t.engine, Event.FIRST_TOKEN)
    if relayed is None or first is None:
        return []
    backend, routed = relayed
    ttft_ms = num_of(first, "ttft_ms") or 0.0
    if ttft_ms <= th.upstream_ttft_s * 1000.0 or within(
        t.engine, ts_of(routed), ts_of(first), Event.PAUSED
    ):
        return []
    message = (
        f"the upstream {backend!r} sent its first token after {ttft_ms:.0f} ms "
        f"(over {ms(th.upstream_ttft_s)}), nothing paused: the wait was the upstream's"
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
    network_drop,
    upstream_failed,
    slow_upstream,
)
