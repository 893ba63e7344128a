"""Runs the checks in order; a check that cannot run after an earlier failure is skipped.

Order: base URL, reachable (DNS/TCP, direct), proxy variables, API key
characters, key accepted, model served, (for an edge-llm engine: its upstreams,
KV cache and memory ledger), streaming, chunk format, TTFT. The
direct checks use a session with ``trust_env=False`` so a dead proxy is
diagnosed by the proxy check instead of breaking every other one.
"""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp

from edge_llm.client.address import setting_to_change
from edge_llm.doctor import api_checks, kv, net, proxy, static_checks, upstreams
from edge_llm.doctor.probe import StreamProbe
from edge_llm.doctor.result import CheckResult, Status, failed, skipped
from edge_llm.doctor.settings import DoctorSettings

NETWORK_CHECKS = ("reachable", "proxy", "auth", "model", "stream", "chunks", "ttft")
API_CHECKS = ("auth", "model", "stream", "chunks", "ttft")


async def run_checks(settings: DoctorSettings, env: Mapping[str, str]) -> list[CheckResult]:
    verdict = static_checks.check_base_url(settings.base_url.value)
    results = [verdict.result]
    key_result = static_checks.check_api_key(settings.api_key.value)
    if verdict.url is None:
        results.append(key_result)
        return results + [skipped(name, "no usable base URL") for name in NETWORK_CHECKS]
    base_url = verdict.url
    setting = setting_to_change(settings.base_url.source)
    reach = await net.check_reachable(base_url, settings.timeout_s, setting)
    results += [reach, await proxy.check_proxy(base_url, env, settings.timeout_s), key_result]
    if reach.status is Status.FAIL:
        return results + [skipped(name, "the server is not reachable") for name in API_CHECKS]
    return results + await _api_checks(settings, base_url)


async def _api_checks(settings: DoctorSettings, base_url: str) -> list[CheckResult]:
    # A slow answer that keeps sending bytes (tokens, heartbeats) may take longer
    # than one timeout; silence may not.
    timeout = aiohttp.ClientTimeout(
        total=3 * settings.timeout_s, sock_connect=settings.timeout_s, sock_read=settings.timeout_s
    )
    async with aiohttp.ClientSession(trust_env=False, timeout=timeout) as session:
        try:
            auth = await api_checks.check_auth(session, base_url, settings.api_key.value)
        except api_checks.HTTP_ERRORS as exc:
            summary = f"GET {base_url}/models failed: {api_checks.describe_error(exc)}"
            failure = failed("auth", summary, "see the server log")
            return [failure] + [skipped(n, "no answer to GET /models") for n in API_CHECKS[1:]]
        models = api_checks.diagnose_models(auth.models, settings.model.value, base_url)
        results = [auth.result, models.result]
        for engine_check in (upstreams.check_upstreams, kv.check_kv, kv.check_memory):
            found = await engine_check(session, base_url, auth.key)
            if found is not None:
                results.append(found)
        if auth.result.status is Status.FAIL:
            return results + [skipped(n, "the key is not accepted") for n in API_CHECKS[2:]]
        return results + await _stream_checks(session, settings, base_url, auth.key, models.model)


async def _stream_checks(
    session: aiohttp.ClientSession,
    settings: DoctorSettings,
    base_url: str,
    key: str,
    model: str | None,
) -> list[CheckResult]:
    probe = await api_checks.run_stream_probe(session, base_url, key, model)
    if not isinstance(probe, StreamProbe):
        return [probe, skipped("chunks", "no stream"), skipped("ttft", "no stream")]
    stream = _with_model_note(api_checks.diagnose_stream(probe), model, settings.model.value)
    results = [stream, api_checks.diagnose_chunks(probe)]
    if stream.status is Status.FAIL:
        return [*results, skipped("ttft", "streaming does not work")]
    ttft = await api_checks.check_ttft(
        session,
        base_url,
        key,
        model,
        short_ttft_ms=probe.tally.ttft_ms,
        warn_ms=settings.ttft_warn_ms,
        words=settings.long_prompt_words,
    )
    return [*results, ttft]


def _with_model_note(result: CheckResult, used: str | None, wanted: str) -> CheckResult:
    if used == wanted or used is None or not wanted:  # not wanted: none was set
        return result
    summary = f"{result.summary} [with model {used!r} instead of {wanted!r}]"
    return CheckResult(result.name, result.status, summary, result.fix, result.details)
