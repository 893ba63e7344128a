"""The playground's HTTP side over a fake backend: what `/` serves, when it serves
nothing, and how a browser authenticates its WebSocket."""

from __future__ import annotations

import argparse
import asyncio
import base64
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from edge_llm.config.tree import add_config_flags, flag_overrides, load_config

ClientFactory = Callable[..., Any]
START = {"type": "start", "request": {"messages": [{"role": "user", "content": "hi"}]}}


def key_subprotocol(key: str) -> str:
    return "edge-llm.key." + base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


async def test_the_page_and_its_assets_are_served_with_a_strict_policy(client_of) -> None:
    client = await client_of()
    page = await client.get("/")
    assert page.status == 200
    assert page.content_type == "text/html"
    html = await page.text()
    assert '<script src="/playground/app.js"' in html
    assert "http://" not in html and "https://" not in html  # nothing from other origins
    policy = page.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    script = await client.get("/playground/app.js")
    assert script.content_type == "text/javascript"
    code = await script.text()
    assert "/debug/streams" in code and "StreamClient = class" in code  # the page, on the SDK
    style = await client.get("/playground/style.css")
    assert style.content_type == "text/css"
    missing = await client.get("/playground/../config.py")
    assert missing.status == 404
    assert (await client.get("/playground/nothing.js")).status == 404


async def test_no_playground_serves_nothing_at_the_root(client_of) -> None:
    client = await client_of(playground=False)
    response = await client.get("/")
    assert response.status == 404
    assert (await response.json())["error"]["code"] == "not_found"
    assert (await client.get("/playground/app.js")).status == 404


def test_the_no_playground_flag_turns_it_off() -> None:
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    assert load_config(None, env={}).server.playground is True
    flags = flag_overrides(parser.parse_args(["--no-playground"]))
    assert load_config(None, env={}, overrides=flags).server.playground is False
    assert load_config(None, env={"EDGE_LLM_PLAYGROUND": "false"}).server.playground is False


async def test_with_a_key_the_page_is_open_but_everything_it_calls_is_not(client_of) -> None:
    client = await client_of(api_key=["sk-play"])
    assert (await client.get("/")).status == 200
    assert (await client.get("/playground/app.js")).status == 200
    assert (await client.get("/debug/streams")).status == 401
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await client.ws_connect("/v1/stream", protocols=("edge-llm",))
    assert refused.value.status == 401


@pytest.mark.parametrize(
    "offered",
    [
        ("edge-llm", key_subprotocol("sk-wrong")),
        ("edge-llm", "edge-llm.key.%%%not-base64%%%"),
        ("edge-llm", "edge-llm.key.__8"),  # valid base64url, not UTF-8
    ],
)
async def test_a_wrong_or_malformed_subprotocol_key_is_401(client_of, offered) -> None:
    client = await client_of(api_key=["sk-play"])
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await client.ws_connect("/v1/stream", protocols=offered)
    assert refused.value.status == 401


async def test_a_browser_sends_the_key_as_a_subprotocol_and_streams(client_of) -> None:
    client = await client_of(api_key=["sk-play", "clé/+="])
    for key in ("sk-play", "clé/+="):
        ws = await client.ws_connect("/v1/stream", protocols=("edge-llm", key_subprotocol(key)))
        assert ws.protocol == "edge-llm"  # the key itself is never echoed
        await ws.send_json(START)
        kinds = []
        while not kinds or kinds[-1] not in ("done", "error"):
            kinds.append((await asyncio.wait_for(ws.receive_json(), 30))["type"])
        assert kinds[0] == "started" and kinds[-1] == "done"
        await ws.close()


async def test_a_websocket_from_another_site_is_refused(client_of) -> None:
    client = await client_of()
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await client.ws_connect("/v1/stream", headers={"Origin": "https://evil.example"})
    assert refused.value.status == 403
    own = f"http://{client.host}:{client.port}"
    ws = await client.ws_connect("/v1/stream", headers={"Origin": own})
    await ws.close()
    ws = await client.ws_connect("/v1/stream")  # not a browser: no Origin
    await ws.close()


async def test_configured_origins_may_open_the_websocket(client_of) -> None:
    client = await client_of(cors_allow_origin=["https://app.example"])
    ws = await client.ws_connect("/v1/stream", headers={"Origin": "https://app.example"})
    await ws.close()
    with pytest.raises(aiohttp.WSServerHandshakeError):
        await client.ws_connect("/v1/stream", headers={"Origin": "null"})
