"""Fuzzing against the real engine: no input may cause a 5xx.

Schemathesis generates bodies from the served OpenAPI document (driven through
hypothesis directly: its pytest plugin does not support pytest 9 yet); the
hostile-input properties of ``tests/unit/test_hostile_inputs.py`` run here too,
with fewer examples, on every POST route and on WebSocket frames.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import EngineProcess, start_engine
from hostile import (
    BASE_BODIES,
    NORMAL_CHAT,
    HostileRequest,
    RawWebSocket,
    check_reply,
    check_ws_frame,
    finish_ws_stream,
    hostile_frames,
    hostile_requests,
    post_raw,
    served_post_paths,
)

pytestmark = pytest.mark.e2e

EXAMPLES_PER_OPERATION = 40
HOSTILE_EXAMPLES = 25
QUICK = settings(
    max_examples=HOSTILE_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def capped_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """One engine for the module. At most 64 prompt and 4 answer tokens keep
    fuzzing fast; no TTFT timeout: on a loaded machine a 504 says nothing about the input."""
    engine = start_engine(
        tmp_path_factory.mktemp("fuzz"),
        "--max-tokens-cap",
        "4",
        "--default-max-tokens",
        "4",
        "--ttft-timeout-ms",
        "0",
        "--max-prompt-tokens",
        "64",
    )
    yield engine
    engine.stop()


@pytest.mark.timeout(900)  # some 200 requests: minutes on a loaded 2-core machine
def test_no_input_produces_a_server_error(capped_engine: EngineProcess) -> None:
    schema = schemathesis.openapi.from_url(capped_engine.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 5
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def call(case: schemathesis.Case) -> None:
            # Generous: a long fuzzed prompt prefills slowly on a loaded machine.
            response = case.call(timeout=300)
            what = f"{case.method} {case.path} {case.body!r}"
            assert response.status_code < 500, f"{what}: {response.text[:300]}"
            if response.status_code >= 400:
                assert "error" in response.json()

        call()


@pytest.mark.timeout(600)
@given(data=st.data())
@QUICK
def test_no_hostile_body_gets_a_5xx_from_the_real_engine(
    capped_engine: EngineProcess, data: st.DataObject
) -> None:
    path = data.draw(st.sampled_from(served_post_paths()), label="path")
    request = data.draw(hostile_requests(BASE_BODIES.get(path, {})), label="request")
    check_reply(path, post_raw(capped_engine.url, path, request))


@pytest.mark.timeout(600)
@given(frame=hostile_frames())
@QUICK
def test_no_hostile_frame_breaks_the_real_engine(
    capped_engine: EngineProcess, frame: bytes
) -> None:
    check_ws_frame(capped_engine.url, RawWebSocket(capped_engine.url), frame, then_stream=False)


def test_the_engine_serves_normally_after_the_fuzzing(capped_engine: EngineProcess) -> None:
    body = HostileRequest(json.dumps(NORMAL_CHAT).encode(), "application/json")
    reply = post_raw(capped_engine.url, "/v1/chat/completions", body)
    assert reply.status == 200
    assert json.loads(reply.body)["choices"][0]["message"]["content"]
    ws = RawWebSocket(capped_engine.url)
    try:
        ws.send_json({"type": "start", "request": NORMAL_CHAT})
        assert finish_ws_stream(ws)["type"] == "done"
    finally:
        ws.close()
    assert capped_engine.debug_streams()["kv_used_bytes"] == 0
    assert capped_engine.proc.poll() is None
