"""The one JSON decoder of bodies and frames: hostile classes become 400s naming the field."""

from __future__ import annotations

import json

import pytest

from edge_llm.errors import InvalidRequest
from edge_llm.protocol import json_body
from edge_llm.protocol.json_body import MAX_DEPTH, check_depth, decode_json
from edge_llm.protocol.ws import StreamProtocol


def refusal(raw: bytes | str) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        decode_json(raw)
    return caught.value


@pytest.mark.parametrize(
    ("raw", "param", "words"),
    [
        (rb'{"messages": [{"content": "a\ud800"}]}', "messages.0.content", "surrogate \\ud800"),
        (rb'{"stop": ["\udc00"]}', "stop.0", "surrogate \\udc00"),
        (rb'{"m": {"\ud800": 1}}', "m", "key holds a lone"),
        (rb'{"temperature": 1e999}', "temperature", "too large"),
        (rb'{"t": [-1E400]}', "t.0", "too large"),
        (rb'{"top_p": NaN}', "top_p", "NaN and Infinity"),
        (rb'{"top_p": -Infinity}', "top_p", "NaN and Infinity"),
        (b'{"seed": ' + b"9" * 5000 + b"}", "seed", "5000 digits"),
    ],
)
def test_hostile_values_are_refused_naming_the_field(raw: bytes, param: str, words: str) -> None:
    error = refusal(raw)
    assert error.status == 400
    assert error.code == "invalid_request"
    assert error.param == param
    assert words in error.message


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"\xff\xfe{}", "not valid UTF-8 (byte 0)"),
        (b'{"a": "\xc3"}', "not valid UTF-8 (byte 7)"),
        (rb'{"a": "\x"}', "Invalid \\escape"),
        (rb'{"a": "\u12"}', "Invalid \\uXXXX escape"),
        (b'{"a": ', "not valid JSON"),
        (b"", "not valid JSON"),
        (b'"\\ud800"', "body: string holds a lone"),
    ],
)
def test_malformed_bodies_are_refused(raw: bytes, words: str) -> None:
    error = refusal(raw)
    assert words in error.message
    assert error.param is None


class NoParser:
    """Stands in for the ``json`` module: a body refused by the depth scan never gets here."""

    @staticmethod
    def loads(*_: object, **__: object) -> object:
        raise AssertionError("the body reached the JSON parser")


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deep_nesting_is_refused_before_parsing(
    opener: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = (opener * 200_000).encode()  # json.loads alone raises RecursionError
    monkeypatch.setattr(json_body, "json", NoParser)
    error = refusal(raw)
    assert f"nested deeper than {MAX_DEPTH} levels" in error.message


def test_the_depth_bound_is_exact_and_ignores_brackets_in_strings() -> None:
    at_bound = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    check_depth(at_bound, MAX_DEPTH)
    assert json.loads(json.dumps(decode_json(at_bound))) is not None
    with pytest.raises(InvalidRequest):
        check_depth("[" + at_bound + "]", MAX_DEPTH)
    in_strings = json.dumps({"a": "[" * 1000, "b": ['\\"[[[' * 100, "{" * 500]})
    check_depth(in_strings, MAX_DEPTH)
    wide = json.dumps([[1, {"a": [2]}]] * 10_000)  # many brackets, shallow
    assert len(decode_json(wide)) == 10_000


def test_valid_json_is_untouched() -> None:
    raw = rb'{"a": "\ud83d\ude00 \\ud800", "b": 1e-999, "c": -0, '
    raw += rb'"d": [1.5e300, 12345678901234567890]}'
    assert decode_json(raw) == {
        "a": "\U0001f600 \\ud800",
        "b": 0.0,
        "c": 0,
        "d": [1.5e300, 12345678901234567890],
    }


def test_a_long_key_is_shortened_in_the_error() -> None:
    key = "k" * 100_000
    error = refusal(json.dumps({key: [float("inf")]}).replace("Infinity", "1e999"))
    assert error.param is not None
    assert len(error.param) < 100


def test_websocket_frames_use_the_same_decoder() -> None:
    protocol = StreamProtocol()
    for text in ("[" * 100_000, '{"type": "start", "request": {"user": "\\udfff"}}'):
        assert protocol.receive(text) == []
        (frame,) = protocol.frames_to_send()
        assert frame["type"] == "error"
        assert frame["code"] == "invalid_frame"
    assert "request.user" in frame["message"]
    assert frame["param"] == "request.user"
    assert protocol.receive('{"type": "pause"}') == []
    assert protocol.frames_to_send()[0]["code"] == "no_active_stream"  # still usable
