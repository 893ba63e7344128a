"""The byte-level SSE parser (protocol/sse.py): every edge case in docs/design.md, and
split-invariance by property test."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_llm.protocol.sse import EventTooLarge, SSEEvent, SSEParser


def parse_all(*reads: bytes) -> list[SSEEvent]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for read in reads:
        events.extend(parser.feed(read))
    events.extend(parser.close())
    return events


def test_lf_crlf_and_cr_line_ends_give_the_same_events() -> None:
    expected = [SSEEvent(None, "a"), SSEEvent(None, "b")]
    assert parse_all(b"data: a\n\ndata: b\n\n") == expected
    assert parse_all(b"data: a\r\n\r\ndata: b\r\n\r\n") == expected
    assert parse_all(b"data: a\r\rdata: b\r\r") == expected


def test_cr_at_end_of_read_is_half_of_a_crlf() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    # The LF completes the CRLF; it must not be read as a blank line.
    assert parser.feed(b"\n") == []
    assert parser.feed(b"data: b\r\n\r\n") == [SSEEvent(None, "a\nb")]


def test_lone_cr_then_cr_dispatches() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\r") == [SSEEvent(None, "a")]


def test_utf8_character_split_across_reads() -> None:
    payload = "data: héllo 你好 🙂\n\n".encode()
    cut = payload.index("你".encode()) + 1
    parser = SSEParser()
    assert parser.feed(payload[:cut]) == []
    assert parser.feed(payload[cut:]) == [SSEEvent(None, "héllo 你好 🙂")]


def test_invalid_utf8_becomes_replacement_character() -> None:
    assert parse_all(b"data: a\xffb\n\n") == [SSEEvent(None, "a\ufffdb")]


def test_comments_are_counted_not_dispatched() -> None:
    parser = SSEParser()
    assert parser.feed(b": ping\n\n:\n\ndata: x\n\n") == [SSEEvent(None, "x")]
    assert parser.comments == 2


def test_data_with_and_without_space_and_multiline_join() -> None:
    assert parse_all(b"data:a\ndata: b\ndata:  c\n\n") == [SSEEvent(None, "a\nb\n c")]


def test_empty_data_line_is_an_event_with_empty_data() -> None:
    assert parse_all(b"data\n\n") == [SSEEvent(None, "")]
    assert parse_all(b"data:\ndata:\n\n") == [SSEEvent(None, "\n")]


def test_event_id_and_retry_fields() -> None:
    parser = SSEParser()
    events = parser.feed(b"event: delta\nid: 7\nretry: 1500\ndata: x\n\ndata: y\n\n")
    assert events == [SSEEvent("delta", "x", "7"), SSEEvent(None, "y", "7")]
    assert parser.retry_ms == 1500


def test_event_without_data_is_not_dispatched() -> None:
    assert parse_all(b"event: x\n\ndata: y\n\n") == [SSEEvent(None, "y")]


def test_no_final_blank_line_flushes_on_close() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: [DONE]") == []
    assert parser.close() == [SSEEvent(None, "[DONE]")]


def test_leading_bom_is_dropped() -> None:
    assert parse_all(b"\xef\xbb\xbfdata: x\n\n") == [SSEEvent(None, "x")]


def test_several_events_in_one_read_and_one_event_over_many_reads() -> None:
    assert parse_all(b"data: 1\n\ndata: 2\n\ndata: 3\n\n") == [
        SSEEvent(None, "1"),
        SSEEvent(None, "2"),
        SSEEvent(None, "3"),
    ]
    reads = [bytes([b]) for b in b"data: split\n\n"]
    assert parse_all(*reads) == [SSEEvent(None, "split")]


def test_line_too_long_raises() -> None:
    parser = SSEParser(max_line_bytes=16)
    parser.feed(b"data: 0123456")
    with pytest.raises(EventTooLarge):
        parser.feed(b"789abcdef")


def test_event_too_large_raises() -> None:
    parser = SSEParser(max_event_bytes=10)
    with pytest.raises(EventTooLarge) as info:
        parser.feed(b"data: 12345\ndata: 67890\n")
    assert info.value.code == "event_too_large"


def test_unicode_line_separators_are_not_line_ends() -> None:
    # str.splitlines() would split on U+2028 and U+0085; SSE must not.
    text = "a\u2028b\x85c"
    assert parse_all(f"data: {text}\n\n".encode()) == [SSEEvent(None, text)]


# --- property: any split of a valid stream gives the same events ----------------------

field_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"),
    max_size=12,
)
line_end = st.sampled_from([b"\n", b"\r\n", b"\r"])


@st.composite
def sse_stream(draw: st.DrawFn) -> tuple[bytes, list[SSEEvent]]:
    """A stream of events with random line ends, comments and data lines."""
    out = bytearray()
    expected: list[SSEEvent] = []
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            out += b": ping" + draw(line_end)
        lines = draw(st.lists(field_text, min_size=1, max_size=3))
        end = b""
        for value in lines:
            sep = b": " if draw(st.booleans()) or value.startswith(" ") else b":"
            end = draw(line_end)
            out += b"data" + sep + value.encode() + end
        # A CR followed by an LF would be one CRLF, not a blank line.
        out += b"\r" if end == b"\r" else draw(line_end)
        expected.append(SSEEvent(None, "\n".join(lines)))
    return bytes(out), expected


@settings(max_examples=200)
@given(stream=sse_stream(), data=st.data())
def test_any_split_gives_the_same_events(
    stream: tuple[bytes, list[SSEEvent]], data: st.DataObject
) -> None:
    raw, expected = stream
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=8)))
    reads = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert parse_all(*reads) == expected
    assert parse_all(raw) == expected
