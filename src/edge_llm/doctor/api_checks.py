"""Checks that talk to the API: key accepted, model served, streaming, chunks, TTFT.

The diagnosis functions (``diagnose_*``) are pure: they read a :class:`Reply` or
:class:`StreamProbe` and return results. The ``check_*`` coroutines do the
requests with a session that ignores proxy variables.
"""

from __future__ import annotations

import difflib
import secrets
from dataclasses import dataclass
from typing import Any

import aiohttp

from edge_llm.doctor.probe import Reply, StreamProbe, StreamTally, get, probe_stream
from edge_llm.doctor.result import CheckResult, failed, passed, skipped, warned
from edge_llm.doctor.static_checks import clean_key, mask_key

MAX_LISTED_IDS = 20
SHORT_PROMPT = "Say hello in one short sentence."
_FILLER = (
    "The device streams tokens to a local client, which renders them as they arrive "
    "while the engine keeps the cache within its budget. "
)
HTTP_ERRORS = (aiohttp.ClientError, TimeoutError, OSError, ValueError)


def describe_error(exc: BaseException) -> str:
    """A request that raised, in words."""
    if isinstance(exc, TimeoutError):
        return "no answer in time (the server is busy or stuck; --timeout raises the limit)"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server closed the connection without an answer"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return f"the response body was cut off ({exc})"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect: {exc.os_error.strerror or exc.os_error!r}"
    return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class AuthOutcome:
    result: CheckResult
    models: Reply | None  # GET /models with the working key, for the model check
    key: str  # the key the next requests send


async def check_auth(session: aiohttp.ClientSession, base_url: str, raw_key: str) -> AuthOutcome:
    """Does the server accept the key? Tells a wrong key from one spoiled by whitespace."""
    key = clean_key(raw_key)
    url = base_url + "/models"
    reply = await get(session, url, key)
    if reply.status in (401, 403):
        return AuthOutcome(_rejected(reply, key), reply, key)
    if not 200 <= reply.status < 300:
        summary = f"cannot tell whether the key is accepted: GET {url} answered HTTP {reply.status}"
        return AuthOutcome(warned("auth", summary, "see the model check below"), reply, key)
    if key != raw_key and _sendable(raw_key):
        as_typed = await get(session, url, raw_key)
        if as_typed.status in (401, 403):
            summary = (
                f"the key as typed is rejected (HTTP {as_typed.status}) but accepted without "
                "its whitespace/quotes: the stray characters cause the 401"
            )
            fix = f"remove them from the key: use {mask_key(key)}"
            return AuthOutcome(failed("auth", summary, fix), reply, key)
    return AuthOutcome(await _accepted(session, url, key), reply, key)


def _rejected(reply: Reply, key: str) -> CheckResult:
    message = reply.error_message()
    if not key:
        summary = f"the server requires an API key (HTTP {reply.status}: {message})"
        fix = "pass --api-key KEY (or set EDGE_LLM_API_KEY) to the key the server was started with"
        return failed("auth", summary, fix, status=reply.status)
    summary = f"wrong key: the server rejects {mask_key(key)} (HTTP {reply.status}: {message})"
    fix = (
        "use the key the server was started with (edge-llm serve --api-key); the key was "
        "already tried without whitespace and quotes, so it is the key itself"
    )
    return failed("auth", summary, fix, status=reply.status)


async def _accepted(session: aiohttp.ClientSession, url: str, key: str) -> CheckResult:
    if not key:
        return passed("auth", "the server needs no API key")
    keyless = await get(session, url, "")
    if 200 <= keyless.status < 300:
        return passed("auth", "the server answers; it checks no key (started without --api-key)")
    return passed("auth", f"the server accepts the key {mask_key(key)}")


def _sendable(key: str) -> bool:
    return key.isascii() and "\r" not in key and "\n" not in key


# -- model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelOutcome:
    result: CheckResult
    model: str | None  # the id the stream checks use


def diagnose_models(reply: Reply | None, wanted: str, base_url: str) -> ModelOutcome:
    """Is ``wanted`` among the ids of ``GET /models``? Else list them and the closest.
    With no model set (``""``), the first listed one is what the stream checks use."""
    if reply is None or reply.status in (401, 403):
        return ModelOutcome(skipped("model", "the server did not accept the key"), wanted)
    if reply.status != 200:
        summary = f"GET {base_url}/models answered HTTP {reply.status}: {reply.error_message()}"
        fix = "the base URL must be the API root that has /models and /chat/completions (…/v1)"
        return ModelOutcome(failed("model", summary, fix, status=reply.status), wanted)
    ids = model_ids(reply.json())
    if ids is None:
        summary = f"GET {base_url}/models did not return an OpenAI model list"
        fix = "point the base URL at an OpenAI-compatible server (…/v1)"
        return ModelOutcome(failed("model", summary, fix), wanted)
    if not wanted and ids:
        summary = (
            f"no model set: requests name none, which edge-llm answers with its default "
            f"model (other servers may need --model); served: {_listed(ids)}"
        )
        return ModelOutcome(passed("model", summary, ids=ids[:100]), ids[0])
    if wanted in ids:
        return ModelOutcome(passed("model", f"model {wanted!r} is served", ids=ids[:100]), wanted)
    return ModelOutcome(_unknown_model(wanted, ids), _replacement(wanted, ids))


def model_ids(body: Any) -> list[str] | None:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    return [
        item["id"] for item in data if isinstance(item, dict) and isinstance(item.get("id"), str)
    ]


def closest_model(wanted: str, ids: list[str]) -> str | None:
    lowered = {i.lower(): i for i in ids}
    if wanted.lower() in lowered:
        return lowered[wanted.lower()]
    matches = difflib.get_close_matches(wanted.lower(), list(lowered), n=1, cutoff=0.4)
    return lowered[matches[0]] if matches else None


def _replacement(wanted: str, ids: list[str]) -> str | None:
    return closest_model(wanted, ids) or (ids[0] if ids else None)


def _unknown_model(wanted: str, ids: list[str]) -> CheckResult:
    if not ids:
        return failed("model", "the server lists no models", "load a model on the server")
    closest = closest_model(wanted, ids)
    summary = f"model {wanted!r} is not served; valid ids: {_listed(ids)}"
    if closest:
        summary += f"; closest: {closest!r}"
    fix = f"use --model {closest or ids[0]} (model_id in the client JSON, EDGE_LLM_MODEL)"
    return failed("model", summary, fix, ids=ids[:100], closest=closest)


def _listed(ids: list[str]) -> str:
    listed = ", ".join(ids[:MAX_LISTED_IDS])
    if len(ids) > MAX_LISTED_IDS:
        listed += f", … ({len(ids) - MAX_LISTED_IDS} more)"
    return listed


# -- streaming -----------------------------------------------------------------------


def stream_body(
    model: str | None, prompt: str, max_tokens: int, *, usage: bool = False
) -> dict[str, Any]:
    """A greedy streaming request that no prompt cache can answer: its first
    message starts with a tag new to this request, so a repeated run of the doctor
    measures the same thing as the first (only the chat template's fixed opening,
    a few tokens, can be shared). ``usage`` asks for the final usage chunk."""
    system = f"{secrets.token_hex(4)}: a doctor's probe. You are a helpful assistant."
    body: dict[str, Any] = {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": prompt}],
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if usage:
        body["stream_options"] = {"include_usage": True}
    if model is not None:
        body["model"] = model
    return body


async def run_stream_probe(
    session: aiohttp.ClientSession, base_url: str, key: str, model: str | None
) -> StreamProbe | CheckResult:
    try:
        return await probe_stream(
            session, base_url + "/chat/completions", key, stream_body(model, SHORT_PROMPT, 16)
        )
    except HTTP_ERRORS as exc:
        summary = f"streaming request failed: {describe_error(exc)}"
        return failed("stream", summary, "check the server log; the request did not complete")


def diagnose_stream(probe: StreamProbe) -> CheckResult:
    """HTTP 200, text/event-stream, at least one content chunk, then [DONE]."""
    reply, tally = probe.reply, probe.tally
    if reply.status != 200:
        return _stream_http_error(reply)
    if not probe.is_event_stream:
        return _wrong_content_type(probe)
    if tally.error is not None and not tally.n_content:
        summary = f"HTTP 200 stream carried an error and no content: {tally.error}"
        return failed("stream", summary, "see the server's message above and its log")
    if not tally.n_content:
        summary = f"HTTP 200 text/event-stream but no content chunk ({tally.n_events} events)"
        fix = (
            "the server accepted the stream but sent no text: check the model id, the "
            "prompt template and the server log; curl -N shows the raw events"
        )
        return failed("stream", summary, fix, events=tally.n_events)
    if not tally.done:
        summary = f"{tally.n_content} content chunks but no 'data: [DONE]' at the end"
        fix = "the server must end the stream with data: [DONE]; clients waiting for it hang"
        return failed("stream", summary, fix, truncated=probe.truncated)
    ttft = tally.ttft_ms or 0.0
    chunks = f"{tally.n_content} content chunk" + ("s" if tally.n_content != 1 else "")
    summary = f"text/event-stream: {chunks} and [DONE] (TTFT {ttft:.0f} ms)"
    return passed("stream", summary, content_chunks=tally.n_content, ttft_ms=round(ttft, 1))


def _stream_http_error(reply: Reply) -> CheckResult:
    message, code = reply.error_message(), reply.error_code()
    summary = f"streaming chat completion answered HTTP {reply.status}: {message}"
    if code == "model_not_found" or reply.status == 404:
        fix = "use a model id the server lists (see the model check)"
    elif reply.status in (401, 403):
        fix = "use the key the server was started with"
    else:
        fix = "fix what the server's message names, or see its log"
    return failed("stream", summary, fix, status=reply.status, code=code)


def _wrong_content_type(probe: StreamProbe) -> CheckResult:
    content_type = probe.reply.content_type or "(none)"
    body = probe.reply.json()
    if isinstance(body, dict) and "choices" in body:
        summary = (
            f'HTTP 200 but no chunks: the server ignored "stream": true and sent one '
            f"JSON body (Content-Type {content_type})"
        )
        fix = (
            "use an endpoint that streams, or set stream: false in the client; if your own "
            'requests get 200 with no chunks, check that they send "stream": true'
        )
        return failed("stream", summary, fix, content_type=content_type)
    summary = (
        f"HTTP 200 with Content-Type {content_type!r}, not text/event-stream "
        f"({probe.tally.n_content} content chunks in the body): SSE clients see no stream"
    )
    fix = "the server (or a proxy in between) must send Content-Type: text/event-stream"
    return failed("stream", summary, fix, content_type=content_type)


def diagnose_chunks(probe: StreamProbe) -> CheckResult:
    """Every data line is JSON with ``choices`` (or the final [DONE])."""
    tally = probe.tally
    if probe.reply.status != 200 or not tally.n_events:
        return skipped("chunks", "no events to inspect")
    if tally.n_non_json:
        summary = (
            f"{tally.n_non_json} data: lines are not JSON (e.g. {tally.samples[0]!r}): code "
            "that parses every data: line fails (JSON.parse throws, or the chunk is undefined: "
            "\"Cannot read properties of undefined (reading 'choices')\")"
        )
        fix = (
            "the server must send only JSON objects and the final [DONE] as data:; client "
            "code must skip [DONE], comments and lines that do not parse"
        )
        return failed("chunks", summary, fix, samples=tally.samples)
    if tally.n_no_choices_key:
        summary = (
            f"{tally.n_no_choices_key} chunks have no 'choices' field: naive "
            'chunk.choices[0] parsing fails ("Cannot read properties of undefined")'
        )
        fix = "client code must check that choices exists and is not empty before choices[0]"
        return failed("chunks", summary, fix, chunks_without_choices=tally.n_no_choices_key)
    if tally.n_empty_choices:
        summary = f"{tally.n_empty_choices} chunks have empty 'choices' (e.g. a usage chunk)"
        fix = "client code must check that choices is not empty before choices[0]"
        return warned("chunks", summary, fix, chunks_empty_choices=tally.n_empty_choices)
    return passed("chunks", f"{tally.n_events} events: every chunk is JSON with 'choices'")


# -- time to first token -------------------------------------------------------------


def long_prompt(words: int) -> str:
    filler_words = _FILLER.split()
    text = " ".join(filler_words[i % len(filler_words)] for i in range(words))
    return f"Summarise these notes in one sentence.\n\n{text}"


async def check_ttft(
    session: aiohttp.ClientSession,
    base_url: str,
    key: str,
    model: str | None,
    *,
    short_ttft_ms: float | None,
    warn_ms: int,
    words: int,
) -> CheckResult:
    """TTFT of a long prompt no cache holds (the short one comes from the stream
    check), then of the same request again: what the server's prompt cache saves
    is reported apart from the prefill it measured."""
    url = base_url + "/chat/completions"
    measured = await _long_probe(session, url, key, model, words)
    if isinstance(measured, CheckResult):
        return measured
    probe, body, words = measured
    if probe.reply.status != 200 or probe.tally.ttft_ms is None:
        summary = f"a {words}-word prompt got no first token (HTTP {probe.reply.status}: " + (
            f"{probe.reply.error_message()})"
        )
        return warned("ttft", summary, "long prompts fail here: shorten them", words=words)
    try:
        repeat: StreamProbe | None = await probe_stream(session, url, key, body)
    except HTTP_ERRORS:
        repeat = None  # the measurement stands; only the cache figure is missing
    figures = PrefillFigures(words, short_ttft_ms, probe.tally, repeat.tally if repeat else None)
    return judge_ttft(figures, warn_ms)


async def _long_probe(
    session: aiohttp.ClientSession, url: str, key: str, model: str | None, words: int
) -> tuple[StreamProbe, dict[str, Any], int] | CheckResult:
    """One long prompt; if the server says it is too long, once more at 80 % of its limit.
    Returns the probe, the request body sent and its word count."""
    try:
        body = stream_body(model, long_prompt(words), 1, usage=True)
        probe = await probe_stream(session, url, key, body)
        smaller = _fitting_words(probe, words)
        if smaller is None:
            return probe, body, words
        body = stream_body(model, long_prompt(smaller), 1, usage=True)
        return await probe_stream(session, url, key, body), body, smaller
    except HTTP_ERRORS as exc:
        summary = f"long-prompt request failed: {describe_error(exc)}"
        return warned("ttft", summary, "see the server log")


def _fitting_words(probe: StreamProbe, words: int) -> int | None:
    error = probe.reply.json()
    detail = error.get("error") if isinstance(error, dict) else None
    if probe.reply.status != 400 or not isinstance(detail, dict):
        return None
    n_prompt, limit = detail.get("n_prompt_tokens"), detail.get("max_prompt_tokens")
    if not isinstance(n_prompt, int) or not isinstance(limit, int) or n_prompt <= 0:
        return None
    return max(1, int(words * 0.8 * limit / n_prompt))


@dataclass(frozen=True)
class PrefillFigures:
    """What the TTFT check measured: a long prompt new to the server, then the same again."""

    words: int
    short_ttft_ms: float | None
    long: StreamTally  # the prefill measured (its ttft_ms is set)
    repeat: StreamTally | None  # the same request again: a prompt-cache hit if there is a cache


def judge_ttft(figures: PrefillFigures, warn_ms: int) -> CheckResult:
    long_ms = figures.long.ttft_ms or 0.0
    short = "?" if figures.short_ttft_ms is None else f"{figures.short_ttft_ms:.0f}"
    summary = (
        f"TTFT {short} ms for a short prompt, {long_ms:.0f} ms for a {figures.words}-word "
        f"prompt{_cache_note(figures.long)}"
    )
    details = {
        "short_ttft_ms": figures.short_ttft_ms,
        "long_ttft_ms": round(long_ms, 1),
        "words": figures.words,
        "long_prompt_tokens": figures.long.prompt_tokens,
        "long_cached_tokens": figures.long.cached_tokens,
        "repeat_ttft_ms": _rounded(figures.repeat.ttft_ms if figures.repeat else None),
        "repeat_cached_tokens": figures.repeat.cached_tokens if figures.repeat else None,
    }
    if warn_ms and long_ms > warn_ms:
        fix = (
            "prefill time grows with the prompt: shorten prompts (system prompt, history), "
            "lower max_prompt_tokens, or raise ttft_warn_ms if this device is expected to be slow"
        )
        summary += f": above ttft_warn_ms ({warn_ms} ms){_repeat_note(figures.repeat)}"
        return warned("ttft", summary, fix, **details)
    summary += f" (ttft_warn_ms {warn_ms}){_repeat_note(figures.repeat)}"
    return passed("ttft", summary, **details)


def _cache_note(tally: StreamTally) -> str:
    if tally.prompt_tokens is None:
        return ""
    if tally.cached_tokens is None:
        return f" ({tally.prompt_tokens} prompt tokens)"
    return f" ({tally.prompt_tokens} prompt tokens, {tally.cached_tokens} from the prompt cache)"


def _repeat_note(repeat: StreamTally | None) -> str:
    if repeat is None or repeat.ttft_ms is None:
        return ""
    cached = (
        "" if repeat.cached_tokens is None else f" ({repeat.cached_tokens} tokens from the cache)"
    )
    return f"; the same request again: {repeat.ttft_ms:.0f} ms{cached}"


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
