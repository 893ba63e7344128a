"""Device memory pressure with the real process: a floor above what the machine has
refuses every request with 503 memory_pressure; a floor under it serves normally."""

from __future__ import annotations

import aiohttp
import pytest

from conftest import EngineFactory
from support import chat_body

pytestmark = pytest.mark.e2e

MORE_THAN_ANY_MACHINE_MB = 1 << 30  # a petabyte


async def post(url: str) -> tuple[int, dict[str, object], dict[str, str]]:
    body = chat_body("Name the capital of France.", max_tokens=8, stream=False)
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            return response.status, await response.json(), dict(response.headers)


async def test_a_floor_above_the_machine_refuses_and_one_below_serves(
    engine_factory: EngineFactory,
) -> None:
    short = engine_factory("--min-available-mb", str(MORE_THAN_ANY_MACHINE_MB))
    status, body, headers = await post(short.url)
    assert status == 503 and int(headers["Retry-After"]) >= 1
    error = body["error"]
    assert isinstance(error, dict) and error["code"] == "memory_pressure"
    debug = short.debug_streams()
    assert debug["memory_pressure"] is True and debug["memory_available_bytes"] > 0
    assert short.metric("edge_llm_admission_rejections_total", reason="memory_pressure") == 1
    roomy = engine_factory("--min-available-mb", "1")
    status, body, _ = await post(roomy.url)
    assert status == 200, body
    assert roomy.debug_streams()["memory_pressure"] is False
