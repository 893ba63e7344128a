"""A newcomer's likeliest mistakes get one clear line, not a traceback or silence:
a flag typo, a misspelt request field, a base URL without /v1, a prompt limit the
KV cache cannot hold, a port already taken."""

from __future__ import annotations

import argparse
import os
import socket
from types import SimpleNamespace
from typing import Any

import pytest

from edge_llm.cli.main import build_parser, main
from edge_llm.cli.port_holder import listening_inodes, port_holder
from edge_llm.cli.serve import prompt_limit_warning
from edge_llm.config.tree import load_config
from edge_llm.errors import InvalidRequest
from edge_llm.protocol.openai import ChatCompletionRequest, parse_request

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}


def parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser under it."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(parsers(sub))
    return found


def test_no_command_accepts_an_abbreviated_flag() -> None:
    every = parsers(build_parser())
    assert len(every) >= 9  # edge-llm and its subcommands
    assert [p.prog for p in every if p.allow_abbrev] == []


def test_a_truncated_flag_is_refused_not_taken_for_the_longer_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["serve", "--max-kv-cache", "128"])
    assert refused.value.code == 2
    assert "unrecognized arguments: --max-kv-cache 128" in capsys.readouterr().err
    args = build_parser("serve").parse_args(["serve", "--max-kv-cache-mb", "128"])
    assert args.max_kv_cache_mb == 128


@pytest.mark.parametrize(
    ("body", "field", "suggestion"),
    [
        ({**CHAT, "max_token": 5}, "max_token", "max_tokens"),
        ({**CHAT, "temprature": 0.5}, "temprature", "temperature"),
        ({**CHAT, "stream_option": {}}, "stream_option", "stream_options"),
        ({"messages": [{"role": "user", "contnet": "hi"}]}, "messages.0.contnet", "content"),
    ],
)
def test_an_unknown_field_names_the_field_it_resembles(
    body: dict[str, Any], field: str, suggestion: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_request(ChatCompletionRequest, body)
    assert refused.value.param == field
    assert refused.value.message == f"{field}: unknown field (did you mean `{suggestion}`?)"


def test_an_unknown_field_like_no_other_gets_no_guess() -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_request(ChatCompletionRequest, {**CHAT, "banana": 1})
    assert refused.value.message == "banana: unknown field"


async def test_a_path_without_v1_is_told_where_the_route_is(client_of: Any) -> None:
    client = await client_of()
    response = await client.post("/chat/completions", json=CHAT)
    assert response.status == 404
    message = (await response.json())["error"]["message"]
    assert message == (
        "no route for POST /chat/completions; did you mean /v1/chat/completions? "
        "(an OpenAI base URL ends in /v1)"
    )
    elsewhere = await client.post("/nowhere", json=CHAT)
    assert (await elsewhere.json())["error"]["message"] == "no route for POST /nowhere"


def kv(sequence_tokens: int, per_slot: bool) -> Any:
    return SimpleNamespace(sequence_tokens=sequence_tokens, per_slot=per_slot)


def test_a_prompt_limit_beyond_one_slots_kv_share_warns_at_start() -> None:
    config = load_config(None, env={}, overrides={"max_prompt_tokens": 4096})
    warning = prompt_limit_warning(config, kv(2816, per_slot=True))
    assert warning is not None
    assert warning.startswith("edge-llm: warning: max_prompt_tokens 4096 does not fit one ")
    assert "(2816 tokens, prompt and answer together)" in warning
    assert "raise max_kv_cache_mb, lower max_sequences, or lower max_prompt_tokens" in warning
    pool = prompt_limit_warning(config, kv(2048, per_slot=False))
    assert pool is not None and "the whole KV cache (2048 tokens" in pool


def test_the_default_prompt_limit_fits_and_gives_no_warning() -> None:
    config = load_config(None, env={})
    assert prompt_limit_warning(config, kv(2816, per_slot=True)) is None
    assert prompt_limit_warning(config, kv(512, per_slot=True)) is not None  # no room to answer


def test_the_process_holding_a_port_is_named() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        assert port_holder(port) is None  # bound, not listening
        held.listen()
        assert listening_inodes(port)
        holder = port_holder(port)
    assert holder is not None and holder.endswith(f"(pid {os.getpid()})")
    assert "python" in holder or "pytest" in holder
