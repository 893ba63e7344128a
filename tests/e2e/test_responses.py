"""POST /v1/responses with the real model, through the official openai SDK unchanged."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from support import STORY, RawSseClient, openai_sdk, served_model, wait_until

pytestmark = pytest.mark.e2e

QUESTION = "Name the capital of France."


def test_text_create_and_stream_agree(engine_server: Any) -> None:
    model = served_model(engine_server)
    with openai_sdk(engine_server) as client:
        whole = client.responses.create(
            model=model, input=QUESTION, temperature=0, max_output_tokens=24
        )
        with client.responses.stream(
            model=model, input=QUESTION, temperature=0, max_output_tokens=24
        ) as stream:
            events = list(stream)
            final = stream.get_final_response()
    assert whole.status == "completed"
    assert "Paris" in whole.output_text
    assert whole.usage is not None and whole.usage.input_tokens > 0
    assert whole.usage.output_tokens > 0
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == final.output_text == whole.output_text
    numbers = [event.sequence_number for event in events]
    assert numbers == list(range(len(events)))


def test_max_output_tokens_makes_it_incomplete(engine_server: Any) -> None:
    with openai_sdk(engine_server) as client:
        response = client.responses.create(input=STORY, temperature=0, max_output_tokens=5)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 5


def test_previous_response_id_continues_the_stored_conversation(engine_server: Any) -> None:
    with openai_sdk(engine_server) as client:
        first = client.responses.create(
            input="My name is Ada.", instructions="Be brief.", temperature=0, max_output_tokens=16
        )
        second = client.responses.create(
            input="What is my name?",
            previous_response_id=first.id,
            temperature=0,
            max_output_tokens=16,
        )
        alone = client.responses.create(
            input="What is my name?", temperature=0, max_output_tokens=16, store=False
        )
        with pytest.raises(openai.NotFoundError) as missing:
            client.responses.create(input="x", previous_response_id=alone.id)
    assert first.usage is not None and second.usage is not None and alone.usage is not None
    # The earlier turns (question and answer) are in the second prompt; the first's
    # instructions are not carried over.
    carried = second.usage.input_tokens - alone.usage.input_tokens
    assert carried >= first.usage.output_tokens + 4
    error = missing.value.body
    assert isinstance(error, dict)
    assert error["param"] == "previous_response_id"


async def test_stalled_reader_pauses_and_disconnect_frees_kv(engine_server: Any) -> None:
    body = {"input": STORY, "max_output_tokens": 400, "temperature": 0, "stream": True}
    slow = RawSseClient(engine_server.url, body, path="/v1/responses")
    try:
        stream_id = slow.request_id()
        stalled = await wait_until(
            lambda: (s := engine_server.stream(stream_id))["state"] == "paused" and s,
            timeout=240,  # some 130 tokens fill the buffers: minutes on a loaded machine
            what="the unread Responses stream to pause",
        )
        assert stalled["pause_cause"] == "socket_full"
    finally:
        slow.close()
    ended = await wait_until(
        lambda: (s := engine_server.stream(stream_id))["state"] == "cancelled" and s,
        what="the abandoned stream to be cancelled",
    )
    assert ended["cancel_reason"] == "disconnect"
    # Nothing was generated from the pause to the disconnect, however long it lasted.
    assert ended["n_generated"] == stalled["n_generated"] > 0
    await wait_until(
        lambda: engine_server.debug_streams()["kv_used_bytes"] == 0, what="its KV freed"
    )


def test_same_session_supersedes_a_running_response(engine_server: Any) -> None:
    ask = {"input": STORY, "temperature": 0, "max_output_tokens": 200, "user": "e2e-responses"}
    with openai_sdk(engine_server) as client:
        with client.responses.stream(model=served_model(engine_server), **ask) as stream:
            events = iter(stream)
            while next(events).type != "response.output_text.delta":
                pass
            newer = client.responses.create(**{**ask, "max_output_tokens": 1})
            rest = [event.type for event in events]
    assert newer.status == "incomplete"  # it ran: one token
    assert rest[-2:] == ["error", "response.failed"]
