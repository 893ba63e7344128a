"""``edge-llm blame``: the per-request rules, the join of both logs, and the CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_llm.cli import blame as blame_cli
from edge_llm.observability.blame import (
    BlameReport,
    RequestReport,
    Thresholds,
    blame,
    build_timelines,
    format_event,
    render_text,
    report_json,
    split_sources,
)
from edge_llm.observability.events import parse_event_lines

DATA = Path(__file__).parent.parent / "data" / "blame"
T0 = 1767225600.0
RID = "chatcmpl-t0000000000000000000001"
CID = "c-t000000000000001"


def eng(at: float, event: str, **fields: Any) -> dict[str, Any]:
    request_id = fields.pop("request_id", RID)
    line = {"ts": T0 + at, "mono": 100 + at, "source": "engine", "event": event}
    return {**line, "request_id": request_id, **fields}


def cli(at: float, event: str, **fields: Any) -> dict[str, Any]:
    request_id = fields.pop("request_id", RID)
    line = {"ts": T0 + at, "mono": 900 + at, "source": "client", "event": event}
    return {**line, "request_id": request_id, "client_request_id": CID, **fields}


def engine_start(slot: int = 0) -> list[dict[str, Any]]:
    return [
        eng(0.0, "admitted", n_prompt_tokens=10, max_tokens=40, queue_position=1),
        eng(0.001, "scheduled", slot=slot, queue_ms=0.1),
        eng(0.05, "first_token", ttft_ms=50.0),
    ]


def engine_end(at: float, n: int = 40, slot: int = 0, **stats: Any) -> list[dict[str, Any]]:
    fields = {"pauses": 0, "paused_ms": 0.0, "backpressure_peak": 0, "tokens_while_paused": 0}
    return [
        eng(at, "end", finish_reason="length", error=None, n_generated=n, **{**fields, **stats}),
        eng(at + 0.01, "kv_freed", request_id=None, slot=slot, kv_tokens=49, kv_used_bytes=0),
    ]


def client_start() -> list[dict[str, Any]]:
    return [
        cli(-0.002, "request_sent", request_id=None, transport="ws", attempt=1, url="ws://x"),
        cli(0.001, "first_byte", request_id=None, elapsed_ms=3.0),
        cli(0.052, "first_token", ttft_ms=54.0),
    ]


def client_end(at: float) -> list[dict[str, Any]]:
    return [cli(at, "end", finish_reason="length", n_chunks=40, n_tokens=40, pauses=0)]


def judge_one(
    engine: list[dict[str, Any]] | None, client: list[dict[str, Any]] | None
) -> RequestReport:
    report = blame(
        engine or [],
        client or [],
        have_engine_log=engine is not None,
        have_client_log=client is not None,
    )
    assert len(report.requests) == 1
    return report.requests[0]


def rules_of(report: RequestReport) -> list[str]:
    return [f.rule for f in report.findings]


def load_pair(name: str) -> BlameReport:
    engine, _ = parse_event_lines((DATA / name / "engine.jsonl").read_text().splitlines())
    client, _ = parse_event_lines((DATA / name / "client.jsonl").read_text().splitlines())
    return blame(engine, client, have_engine_log=True, have_client_log=True)


# -- the handwritten pairs -------------------------------------------------------------------


def test_well_behaved_run_is_ok_with_its_pause_counted() -> None:
    report = load_pair("ok")
    assert [r.verdict for r in report.requests] == ["ok", "ok"]
    paused = report.requests[0]
    assert (paused.stats.pauses, paused.stats.backpressure_peak) == (1, 1)
    assert paused.stats.paused_ms == 750.2
    assert paused.client_request_ids == ("c-0a00000000000001",)
    assert report.totals()["ok"] == 2


def test_slow_renderer_without_pause_is_the_clients_fault_with_evidence() -> None:
    (request,) = load_pair("client_no_pause").requests
    assert request.verdict == "client"
    (finding,) = request.findings
    assert finding.rule == "no_pause"
    events = [(e["source"], e["event"]) for e in finding.evidence]
    assert events == [("client", "watermark_high"), ("engine", "paused")]
    assert finding.evidence[1]["cause"] == "socket_full"


def test_tokens_after_pause_are_the_engines_fault_with_every_token_line() -> None:
    (request,) = load_pair("engine_ignores_pause").requests
    assert request.verdict == "engine"
    (finding,) = request.findings
    assert finding.rule == "tokens_after_pause"
    names = [e["event"] for e in finding.evidence]
    assert names[:3] == ["pause_sent", "pause_received", "paused"]
    assert names.count("token_while_paused") == 7
    assert names[-1] == "resume_received"
    assert "7 tokens" in finding.message


# -- joining ------------------------------------------------------------------------------------


def test_client_lines_before_the_id_is_known_join_by_client_request_id() -> None:
    timelines = build_timelines(
        [*engine_start(), *engine_end(1.0)],
        [*client_start(), *client_end(1.1)],
        have_engine_log=True,
        have_client_log=True,
    )
    (timeline,) = timelines
    assert [e["event"] for e in timeline.client] == [
        "request_sent",
        "first_byte",
        "first_token",
        "end",
    ]
    assert timeline.engine[-1]["event"] == "kv_freed"


def test_each_retry_attempt_is_its_own_request() -> None:
    first, second = "chatcmpl-attempt1", "chatcmpl-attempt2"
    client = [
        cli(0.0, "request_sent", request_id=None, transport="sse", attempt=1, url="u"),
        cli(0.01, "first_byte", request_id=first, elapsed_ms=1.0),
        cli(0.5, "retry", request_id=first, attempt=2, cause="read_error"),
        cli(1.0, "request_sent", request_id=None, transport="sse", attempt=2, url="u"),
        cli(1.01, "first_byte", request_id=second, elapsed_ms=1.0),
    ]
    timelines = build_timelines([], client, have_engine_log=False, have_client_log=True)
    assert {t.request_id: len(t.client) for t in timelines} == {first: 3, second: 2}


def test_kv_freed_goes_to_the_slots_last_holder_when_slots_are_reused() -> None:
    other = "chatcmpl-other"
    engine = [
        *engine_start(slot=3),
        *engine_end(1.0, slot=3),
        eng(1.02, "scheduled", request_id=other, slot=3, queue_ms=0.0),
        eng(2.0, "end", request_id=other, finish_reason="stop", n_generated=2),
        eng(2.01, "kv_freed", request_id=None, slot=3, kv_tokens=12, kv_used_bytes=0),
    ]
    timelines = build_timelines(engine, [], have_engine_log=True, have_client_log=False)
    freed = {
        t.request_id: [e["ts"] for e in t.engine if e["event"] == "kv_freed"] for t in timelines
    }
    assert freed == {RID: [T0 + 1.01], other: [T0 + 2.01]}


def test_lines_are_split_by_their_source_not_by_the_file() -> None:
    engine, client = split_sources([cli(0, "end"), eng(0, "end"), {"event": "x"}], "engine")
    assert [e["source"] for e in client] == ["client"]
    assert len(engine) == 2


# -- engine rules -------------------------------------------------------------------------------


def paused_run(n_tokens_while_paused: int, resume_n: int | None = None) -> list[dict[str, Any]]:
    tokens = [
        eng(0.51 + 0.01 * i, "token_while_paused", cause="client", n_generated=21 + i)
        for i in range(n_tokens_while_paused)
    ]
    final = resume_n if resume_n is not None else 20 + n_tokens_while_paused
    return [
        *engine_start(),
        eng(0.5, "pause_received", n_generated=20),
        eng(0.5, "paused", cause="client", ring_write=20, ring_read=19, n_generated=20),
        *tokens,
        eng(1.0, "resume_received", n_generated=final),
        eng(1.0, "resumed", cause="client", paused_ms=500.0, n_generated=final),
        *engine_end(2.0, pauses=1, paused_ms=500.0, backpressure_peak=1),
    ]


def test_the_one_token_in_flight_after_pause_is_allowed() -> None:
    assert judge_one(paused_run(1), None).verdict == "ok"


def test_two_tokens_after_pause_blame_the_engine() -> None:
    report = judge_one(paused_run(2), None)
    assert (report.verdict, rules_of(report)) == ("engine", ["tokens_after_pause"])


def test_n_generated_growth_during_pause_blames_the_engine_without_token_lines() -> None:
    report = judge_one(paused_run(0, resume_n=25), None)
    assert report.verdict == "engine"
    assert "n_generated 20 -> 25" in report.findings[0].message


@given(st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=4))
def test_engine_is_blamed_exactly_when_a_pause_had_more_than_one_token(tokens: list[int]) -> None:
    engine, n, at = list(engine_start()), 20, 0.1
    for count in tokens:
        engine.append(eng(at, "paused", cause="socket_full", n_generated=n))
        for _ in range(count):
            n += 1
            engine.append(eng(at, "token_while_paused", cause="socket_full", n_generated=n))
        engine.append(eng(at + 0.05, "resumed", cause="socket_full", paused_ms=50.0, n_generated=n))
        n, at = n + 3, at + 0.1
    report = blame(engine, [], have_engine_log=True, have_client_log=False).requests[0]
    assert ("tokens_after_pause" in rules_of(report)) == any(c > 1 for c in tokens)


def test_lines_after_its_own_cancel_blame_the_engine() -> None:
    engine = [
        *engine_start(),
        eng(0.5, "cancel", reason="client", state="decoding"),
        eng(0.5, "end", finish_reason=None, error="cancelled", n_generated=10),
        eng(0.52, "token_while_paused", cause="client", n_generated=11),
        eng(0.53, "kv_freed", request_id=None, slot=0, kv_tokens=20, kv_used_bytes=0),
    ]
    report = judge_one(engine, None)
    assert rules_of(report) == ["lines_after_cancel"]
    assert [e["event"] for e in report.findings[0].evidence] == ["cancel", "token_while_paused"]


def test_kv_not_freed_blames_the_engine_only_when_the_log_goes_on() -> None:
    ended = [*engine_start(), eng(1.0, "end", finish_reason="stop", n_generated=3)]
    later = eng(5.0, "admitted", request_id="chatcmpl-later", n_prompt_tokens=1, max_tokens=1)
    report = blame([*ended, later], [], have_engine_log=True, have_client_log=False)
    assert rules_of(report.requests[0]) == ["kv_not_freed"]
    unseen = judge_one(ended, None)
    assert unseen.verdict == "ok"
    assert any("before KV release" in note for note in unseen.notes)


def test_shutdown_cancel_without_kv_freed_is_not_blamed() -> None:
    engine = [
        *engine_start(),
        eng(1.0, "cancel", reason="shutdown", state="decoding"),
        eng(1.0, "end", finish_reason=None, error="cancelled", n_generated=3),
        eng(9.0, "log_closed", request_id=None, dropped=0),
    ]
    assert judge_one(engine, None).verdict == "ok"


def test_pause_sent_but_never_received_while_generation_went_on_blames_the_engine() -> None:
    engine = [*engine_start(), *engine_end(3.0)]
    client = [*client_start(), cli(0.5, "pause_sent", queue_fill=0.8), *client_end(3.1)]
    report = judge_one(engine, client)
    assert rules_of(report) == ["pause_not_received"]
    assert report.findings[0].evidence[0]["event"] == "pause_sent"


def test_cancel_sent_but_not_acted_on_blames_the_engine() -> None:
    engine = [*engine_start(), *engine_end(3.0)]
    client = [*client_start(), cli(0.5, "cancel_sent", reason="client", method="frame")]
    assert rules_of(judge_one(engine, client)) == ["cancel_not_acted"]


def test_cancel_acted_on_at_once_is_ok() -> None:
    engine = [
        *engine_start(),
        eng(0.501, "cancel", reason="client", state="decoding"),
        eng(0.501, "end", finish_reason=None, error="cancelled", n_generated=10),
        eng(0.52, "kv_freed", request_id=None, slot=0, kv_tokens=20, kv_used_bytes=0),
    ]
    client = [*client_start(), cli(0.5, "cancel_sent", reason="client", method="frame")]
    report = judge_one(engine, client)
    assert (report.verdict, report.outcome) == ("ok", "cancelled (client)")


# -- client rules -------------------------------------------------------------------------------


def high(at: float, *, pause_enabled: bool = True) -> dict[str, Any]:
    return cli(
        at,
        "watermark_high",
        queue_fill=0.8,
        queue_len=26,
        queue_capacity=32,
        pause_enabled=pause_enabled,
    )


def test_high_watermark_without_pause_within_the_grace_blames_the_client() -> None:
    engine = [*engine_start(), *engine_end(3.0)]
    client = [*client_start(), high(0.5), *client_end(3.1)]
    report = judge_one(engine, client)
    assert (report.verdict, rules_of(report)) == ("client", ["no_pause"])
    assert "within 500 ms" in report.findings[0].message


def test_high_watermark_followed_by_pause_sent_is_ok() -> None:
    engine = [*paused_run(1)]
    client = [*client_start(), high(0.499), cli(0.4995, "pause_sent", queue_fill=0.8)]
    assert judge_one(engine, client).verdict == "ok"


def test_a_late_pause_is_the_clients_fault_unless_the_grace_allows_it() -> None:
    engine = [
        *engine_start(),
        eng(1.201, "pause_received", n_generated=30),
        eng(2.0, "resume_received", n_generated=30),
        *engine_end(3.0),
    ]
    client = [*client_start(), high(0.5), cli(1.2, "pause_sent", queue_fill=0.9)]
    assert judge_one(engine, client).verdict == "client"
    lenient = blame(
        engine,
        client,
        have_engine_log=True,
        have_client_log=True,
        thresholds=Thresholds(grace_s=1.0),
    )
    assert lenient.requests[0].verdict == "ok"


def test_high_watermark_as_the_stream_ends_needs_no_pause() -> None:
    engine = [*engine_start(), *engine_end(0.6)]
    client = [*client_start(), high(0.5), *client_end(0.7)]
    assert judge_one(engine, client).verdict == "ok"


def socket_full(at: float) -> list[dict[str, Any]]:
    ring = {"ring_fill": 1.0, "ring_write": 40, "ring_read": 8, "n_generated": 40}
    return [
        eng(at, "paused", cause="socket_full", **ring),
        eng(at + 1.0, "resumed", cause="socket_full", paused_ms=1000.0, **ring),
    ]


def test_sse_client_that_stopped_reading_filled_the_ring_client() -> None:
    engine = [*engine_start(), *socket_full(1.0), *engine_end(3.0, pauses=1)]
    client = [
        *client_start(),
        high(0.5),
        cli(0.5, "read_paused", queue_fill=0.8),
        cli(1.9, "read_resumed", queue_fill=0.3),
        *client_end(3.1),
    ]
    report = judge_one(engine, client)
    assert (report.verdict, rules_of(report)) == ("client", ["stopped_reading"])
    assert [e["event"] for e in report.findings[0].evidence] == ["read_paused", "paused"]


def test_ring_full_while_the_client_was_reading_is_transport() -> None:
    engine = [*engine_start(), *socket_full(1.0), *engine_end(3.0, pauses=1)]
    report = judge_one(engine, [*client_start(), *client_end(3.1)])
    assert (report.verdict, rules_of(report)) == ("transport", ["ring_full_while_reading"])


def test_ring_full_without_the_client_log_cannot_be_attributed() -> None:
    engine = [*engine_start(), *socket_full(1.0), *engine_end(3.0, pauses=1)]
    report = judge_one(engine, None)
    assert report.verdict == "unknown"
    assert "with the client log missing it cannot tell client from transport" in (
        report.findings[0].message
    )


# -- transport rules ----------------------------------------------------------------------------


def disconnect(at: float) -> list[dict[str, Any]]:
    return [
        eng(at, "cancel", reason="disconnect", state="decoding"),
        eng(at, "end", finish_reason=None, error="cancelled", n_generated=10),
        eng(at + 0.01, "kv_freed", request_id=None, slot=0, kv_tokens=20, kv_used_bytes=0),
    ]


def test_disconnect_nobody_asked_for_is_transport() -> None:
    client = [*client_start(), cli(1.0, "error", code="read_error", message="closed")]
    report = judge_one([*engine_start(), *disconnect(1.0)], client)
    assert (report.verdict, rules_of(report)) == ("transport", ["dropped_connection"])
    assert [e["event"] for e in report.findings[0].evidence] == ["error", "cancel", "end"]


def test_a_resumable_stream_dropped_and_resumed_is_the_network() -> None:
    client = [*client_start(), cli(1.0, "error", code="read_error", message="closed")]
    engine = [
        *engine_start(),
        eng(1.0, "paused", cause="disconnected", n_generated=10),
        eng(1.0, "detached", stream_id="s", last_event=11),
        eng(1.2, "resumed", cause="disconnected", last_event=9, replayed=2, detached_ms=200.0),
        *engine_end(3.0),
    ]
    report = judge_one(engine, client)
    assert (report.verdict, rules_of(report)) == ("network", ["network_drop"])
    assert "1 times (resumed 1 times, 2 events replayed)" in report.findings[0].message
    timed_out = [
        *engine_start(),
        eng(1.0, "detached", stream_id="s", last_event=11),
        eng(31.0, "resume_timeout", stream_id="s", last_event=11, detached_ms=30000.0),
        *disconnect(31.0)[1:],
    ]
    report = judge_one(timed_out, client)
    assert report.verdict == "network" and "resume_timeout" in report.findings[0].message


def test_disconnect_while_the_client_log_goes_on_without_an_error_is_transport() -> None:
    client = [*client_start(), cli(1.2, "end", finish_reason=None, n_chunks=9, n_tokens=9)]
    report = judge_one([*engine_start(), *disconnect(1.0)], client)
    assert (report.verdict, rules_of(report)) == ("transport", ["dropped_connection"])


def test_disconnect_after_the_client_log_stopped_is_unknown() -> None:
    client = [*client_start(), cli(0.4, "resume_sent", queue_fill=0.2)]
    report = judge_one([*engine_start(), *disconnect(1.0)], client)
    assert report.verdict == "unknown"
    assert "client process may have died" in report.findings[0].message
    rendered = render_text(
        blame(
            [*engine_start(), *disconnect(1.0)], client, have_engine_log=True, have_client_log=True
        )
    )
    evidence = [line.split()[3] for line in rendered.splitlines() if line.startswith("      ")]
    assert evidence == ["resume_sent", "cancel", "end"]  # by time, not by rule


def test_disconnect_after_the_client_closed_is_ok() -> None:
    client = [*client_start(), cli(0.999, "cancel_sent", reason="client", method="close")]
    assert judge_one([*engine_start(), *disconnect(1.0)], client).verdict == "ok"


def test_disconnect_seen_only_by_the_engine_is_unknown() -> None:
    assert judge_one([*engine_start(), *disconnect(1.0)], None).verdict == "unknown"


def test_first_token_that_crossed_late_is_transport() -> None:
    client = [
        cli(-0.002, "request_sent", request_id=None, transport="sse", attempt=1, url="u"),
        cli(2.0, "first_token", ttft_ms=2002.0),
        *client_end(3.1),
    ]
    report = judge_one([*engine_start(), *engine_end(3.0)], client)
    assert (report.verdict, rules_of(report)) == ("transport", ["late_first_token"])


# -- statistics and rendering -------------------------------------------------------------------


def test_stats_come_from_engine_pause_lines_when_there_is_no_end() -> None:
    engine = [*engine_start(), *socket_full(1.0), *socket_full(2.5)]
    stats = judge_one(engine, None).stats
    assert (stats.pauses, stats.backpressure_peak, stats.paused_ms) == (2, 1, 2000.0)
    assert stats.source == "engine pause lines"


def test_stats_come_from_the_client_when_there_is_no_engine_log() -> None:
    client = [
        *client_start(),
        cli(0.5, "pause_sent", queue_fill=0.8),
        cli(1.25, "resume_sent", queue_fill=0.3),
        *client_end(2.0),
    ]
    stats = judge_one(None, client).stats
    assert (stats.pauses, stats.paused_ms, stats.source) == (1, 750.0, "client pause lines")


def test_text_rendering_has_a_summary_line_evidence_and_a_total() -> None:
    text = render_text(load_pair("client_no_pause"))
    lines = text.splitlines()
    assert lines[1].split()[:3] == ["chatcmpl-0c0000000000000000000003", "client", "length"]
    assert any("watermark_high" in line and "pause_enabled=false" in line for line in lines)
    totals = "total: 1 requests: engine 0, upstream 0, transport 0, network 0, client 1"
    assert lines[-1].startswith(totals)


def test_evidence_line_shows_offset_source_event_and_fields() -> None:
    line = format_event(eng(1.5, "paused", cause="socket_full", ring_fill=1.0), T0)
    assert line.split()[1:] == ["+1.500s", "engine", "paused", "cause=socket_full", "ring_fill=1.0"]


def test_json_report_keeps_the_evidence_lines_as_logged() -> None:
    document = report_json(load_pair("engine_ignores_pause"))
    (request,) = document["requests"]
    assert request["verdict"] == "engine"
    raw = (DATA / "engine_ignores_pause" / "engine.jsonl").read_text().splitlines()
    assert request["findings"][0]["evidence"][1] == json.loads(raw[4])
    assert document["total"] == {
        "requests": 1,
        "engine": 1,
        "upstream": 0,
        "transport": 0,
        "network": 0,
        "client": 0,
        "unknown": 0,
        "ok": 0,
    }


# -- the CLI ------------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    blame_cli.register(parser.add_subparsers())
    return parser.parse_args(["blame", *argv])


def pair(name: str) -> tuple[str, str]:
    return str(DATA / name / "engine.jsonl"), str(DATA / name / "client.jsonl")


def test_cli_prints_verdicts_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert blame_cli.run(parse(*pair("engine_ignores_pause"))) == 0
    out = capsys.readouterr().out
    assert "engine: tokens_after_pause" in out
    assert "token_while_paused" in out


def test_cli_json_and_request_filter(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(*pair("ok"), "--json", "--request", "chatcmpl-0b")
    assert blame_cli.run(args) == 0
    document = json.loads(capsys.readouterr().out)
    assert [r["request_id"] for r in document["requests"]] == ["chatcmpl-0b0000000000000000000002"]


def test_cli_request_filter_matching_nothing_exits_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert blame_cli.run(parse(*pair("ok"), "--request", "chatcmpl-nope")) == 1
    assert "no request matches" in capsys.readouterr().err


def test_cli_accepts_swapped_logs_options_and_dash(capsys: pytest.CaptureFixture[str]) -> None:
    engine, client = pair("client_no_pause")
    assert blame_cli.run(parse(client, engine)) == 0
    swapped = capsys.readouterr().out
    assert blame_cli.run(parse("--engine-log", engine, "--client-log", client)) == 0
    assert capsys.readouterr().out == swapped
    assert blame_cli.run(parse("-", client)) == 0
    assert "no engine log: cannot tell" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv_of",
    [
        lambda tmp: [str(tmp / "missing.jsonl")],
        lambda tmp: [str(tmp)],
        lambda tmp: [str(tmp / "garbage.jsonl")],
        lambda tmp: [],
        lambda tmp: ["-", "-"],
        lambda tmp: [str(tmp / "garbage.jsonl"), "--engine-log", "x"],
    ],
    ids=["missing", "directory", "not-jsonl", "no-log", "dashes", "twice"],
)
def test_cli_unreadable_input_exits_two(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv_of: Any
) -> None:
    (tmp_path / "garbage.jsonl").write_text("not json\n[1, 2]\n")
    assert blame_cli.run(parse(*argv_of(tmp_path))) == 2
    assert capsys.readouterr().err.startswith("edge-llm blame: ")


def test_cli_reports_skipped_lines_and_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine, client = pair("ok")
    truncated = tmp_path / "engine.jsonl"
    truncated.write_text(Path(engine).read_text() + '{"ts": 1767225611.0, "ev')
    assert blame_cli.run(parse(str(truncated), client)) == 0
    captured = capsys.readouterr()
    assert "skipped 1 lines" in captured.err
    assert "ok 2" in captured.out


def test_log_closed_lines_are_not_requests_but_their_drops_are_noted() -> None:
    client = [
        *client_start(),
        *client_end(1.1),
        {**cli(2.0, "log_closed", request_id=None, dropped=3), "client_request_id": None},
    ]
    report = blame(
        [*engine_start(), *engine_end(1.0)], client, have_engine_log=True, have_client_log=True
    )
    assert [r.request_id for r in report.requests] == [RID]
    assert report.notes == ("the client log dropped 3 lines: evidence may be missing",)


# -- requests relayed to an upstream ---------------------------------------------------------


def relayed(ttft_ms: float, error: str | None = None, **end: Any) -> list[dict[str, Any]]:
    return [
        eng(0.0, "routed", backend="gpu", route="model", candidates=["gpu"], session=None),
        eng(ttft_ms / 1000.0, "first_token", ttft_ms=ttft_ms, backend="gpu"),
        eng(
            9.0,
            "end",
            finish_reason=None if error else "stop",
            error=error,
            n_generated=40,
            ttft_ms=ttft_ms,
            pauses=0,
            paused_ms=0.0,
            backend="gpu",
            **end,
        ),
    ]


def test_a_slow_first_token_from_an_upstream_is_the_upstreams() -> None:
    report = judge_one(relayed(5200.0), client_start() + client_end(9.1))
    assert report.verdict == "upstream"
    assert report.findings[0].rule == "slow_upstream"
    assert "'gpu'" in report.findings[0].message


def test_an_upstream_that_broke_off_is_blamed_and_no_kv_rule_applies() -> None:
    report = judge_one(relayed(80.0, "upstream_error"), client_start() + client_end(9.1))
    assert [f.rule for f in report.findings] == ["upstream_failed"]
    assert report.verdict == "upstream"


def test_a_quick_upstream_stream_is_ok() -> None:
    assert judge_one(relayed(80.0), client_start() + client_end(9.1)).verdict == "ok"
