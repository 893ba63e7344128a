"""Function tools without I/O: what the template sees and how answers become calls."""

from __future__ import annotations

import itertools
import json

import pytest

from edge_llm.errors import InvalidRequest
from edge_llm.protocol.tools import (
    ArgumentsOut,
    CallStarted,
    FunctionTool,
    OutputEvent,
    TextOut,
    ToolChoice,
    ToolOutputParser,
    ToolSetup,
    parse_calls,
    template_messages,
)

WEATHER = FunctionTool(
    "get_weather",
    "Weather of a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TIME = FunctionTool("get_time")
CALL = '{"name": "get_weather", "arguments": {"city": "Paris \\"{}\\""}}'


def parser_for(choice: ToolChoice, tools: tuple[FunctionTool, ...] = (WEATHER, TIME)):
    counter = itertools.count()
    return ToolOutputParser(ToolSetup(tools, choice), lambda: f"call_{next(counter)}")


def feed_chars(parser: ToolOutputParser, text: str) -> list[OutputEvent]:
    events = [e for ch in text for e in parser.feed(ch)]
    return events + parser.finish()


def test_forced_call_streams_its_arguments_as_generated() -> None:
    parser = parser_for(ToolChoice("required"))
    events = feed_chars(parser, CALL + "\n")
    assert events[0] == CallStarted(0, "call_0", "get_weather")
    pieces = [e.text for e in events[1:] if isinstance(e, ArgumentsOut)]
    assert len(pieces) == len(events) - 1 > 5  # piece by piece, nothing else
    assert "".join(pieces) == '{"city": "Paris \\"{}\\""}'
    assert json.loads("".join(pieces)) == {"city": 'Paris "{}"'}
    assert parser.calls[0].arguments == "".join(pieces)
    assert parser.text == ""


def test_forced_call_cut_short_keeps_what_was_generated() -> None:
    parser = parser_for(ToolChoice("required", "get_weather"))
    feed_chars(parser, CALL[:40])
    assert parser.calls[0].name == "get_weather"
    assert parser.calls[0].arguments == CALL[len('{"name": "get_weather", "arguments": ') : 40]


def test_auto_text_streams_at_once() -> None:
    parser = parser_for(ToolChoice("auto"))
    assert parser.feed("  ") == []  # could still become a call
    assert parser.feed("Hello") == [TextOut("  Hello")]
    assert parser.feed(" {") == [TextOut(" {")]
    assert parser.finish() == []
    assert parser.calls == []


@pytest.mark.parametrize(
    "answer",
    [
        CALL,
        f"[{CALL}]",
        '{"tool_calls": [' + CALL + "]}",
        '{"name": "get_weather", "parameters": {"city": "Paris \\"{}\\""}}',
        f"<tool_call>\n{CALL}\n</tool_call>",
    ],
)
def test_auto_recognises_the_call_forms(answer: str) -> None:
    parser = parser_for(ToolChoice("auto"))
    events = feed_chars(parser, answer)
    assert events == [
        CallStarted(0, "call_0", "get_weather"),
        ArgumentsOut(0, json.dumps({"city": 'Paris "{}"'})),
    ]


def test_auto_json_that_is_no_call_is_text() -> None:
    for answer in ('{"name": "unknown_tool", "arguments": {}}', '{"answer": 4}', "{broken"):
        parser = parser_for(ToolChoice("auto"))
        assert feed_chars(parser, answer) == [TextOut(answer)]
        assert parser.calls == []


def test_text_streams_until_a_tool_call_block_opens() -> None:
    parser = parser_for(ToolChoice("auto"))
    events = feed_chars(parser, f"Let me check. <tool_call>{CALL}</tool_call>")
    texts = [e.text for e in events if isinstance(e, TextOut)]
    assert "".join(texts) == "Let me check. "
    assert len(texts) > 5  # streamed, not held to the end
    assert isinstance(events[-2], CallStarted) and isinstance(events[-1], ArgumentsOut)
    parser = parser_for(ToolChoice("auto"))
    assert feed_chars(parser, "a <tool_") == [TextOut("a"), TextOut(" "), TextOut("<tool_")]


def test_hermes_blocks_keep_the_text_around_them() -> None:
    text = f"Let me check.\n<tool_call>{CALL}</tool_call>"
    parsed = parse_calls(text, frozenset({"get_weather"}))
    assert parsed == ("Let me check.", [("get_weather", json.dumps({"city": 'Paris "{}"'}))])


def test_no_tools_or_none_passes_text_through() -> None:
    for setup in (None, ToolSetup((WEATHER,), ToolChoice("none"))):
        parser = ToolOutputParser(setup, lambda: "x")
        assert parser.feed(CALL) == [TextOut(CALL)]
        assert parser.finish() == []


def test_forced_schema_composes_the_offered_functions() -> None:
    one = ToolSetup((WEATHER, TIME), ToolChoice("required", "get_time")).forced_schema()
    assert one is not None
    assert one["properties"]["name"] == {"const": "get_time"}
    both = ToolSetup((WEATHER, TIME), ToolChoice("required")).forced_schema()
    assert both is not None
    assert [s["properties"]["name"]["const"] for s in both["anyOf"]] == ["get_weather", "get_time"]
    assert both["anyOf"][0]["properties"]["arguments"] == WEATHER.parameters
    assert ToolSetup((WEATHER,), ToolChoice("auto")).forced_schema() is None


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ((WEATHER,), ToolChoice("required", "nope"), "tool_choice"),
        ((), ToolChoice("required"), "tool_choice"),
        ((WEATHER, WEATHER), ToolChoice("auto"), "tools"),
    ],
)
def test_inconsistent_tools_are_refused(tools, choice, param) -> None:
    with pytest.raises(InvalidRequest) as info:
        ToolSetup(tools, choice)
    assert info.value.param == param


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and the time?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": "{}"},
            },
            {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": "noon"},
]


def test_history_without_template_tools_is_plain_text() -> None:
    setup = ToolSetup((WEATHER, TIME), ToolChoice("auto"))
    turns, tools = template_messages(HISTORY, setup, template_has_tools=False)
    assert tools is None
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "user"]
    assert turns[0]["content"].startswith("Be brief.\n\nYou can call these tools: ")
    assert '"name": "get_weather"' in turns[0]["content"]
    assert turns[2]["content"].splitlines() == [
        '{"name": "get_weather", "arguments": {}}',
        '{"name": "get_time", "arguments": {}}',
    ]
    assert turns[3]["content"] == "Result of get_weather: sunny\nResult of get_time: noon"


def test_history_for_a_template_with_tools_is_kept() -> None:
    setup = ToolSetup((WEATHER,), ToolChoice("auto"))
    turns, tools = template_messages(HISTORY, setup, template_has_tools=True)
    assert tools == [WEATHER.openai_dict()]
    assert turns[3] == HISTORY[3]
    assert turns[2]["tool_calls"][0]["function"]["arguments"] == {}  # parsed for the template


def test_tool_choice_none_hides_the_tools() -> None:
    setup = ToolSetup((WEATHER,), ToolChoice("none"))
    turns, tools = template_messages(HISTORY[:2], setup, template_has_tools=False)
    assert (turns, tools) == (HISTORY[:2], None)
    assert template_messages(HISTORY[:2], setup, template_has_tools=True)[1] is None
