"""Detokenization and stop strings across token boundaries."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_llm.engine.streams.text import IncrementalDetokenizer, StopMatcher
from edge_llm.engine.streams.token_ring import RingOverflow, TokenRing


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@given(st.text(max_size=40), st.lists(st.integers(min_value=0), max_size=10))
def test_any_byte_split_decodes_to_the_same_text(text: str, cuts: list[int]) -> None:
    detokenizer = IncrementalDetokenizer()
    pieces = [detokenizer.push(part) for part in split(text.encode(), cuts)]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + detokenizer.flush() == text


def test_chinese_split_across_tokens_never_emits_half_a_character() -> None:
    detokenizer = IncrementalDetokenizer()
    data = "背压".encode()
    assert detokenizer.push(data[:2]) == ""
    assert detokenizer.push(data[2:4]) == "背"
    assert detokenizer.push(data[4:]) == "压"


@given(
    st.text(alphabet="abcXY", max_size=30),
    st.lists(st.integers(min_value=0), max_size=8),
    st.sampled_from(["XY", "cab", "Y"]),
)
def test_stop_string_found_whatever_the_token_split(text: str, cuts: list[int], stop: str) -> None:
    matcher = StopMatcher([stop])
    out, hit = [], False
    for part in split(text.encode(), cuts):
        emitted, hit = matcher.push(part.decode())
        out.append(emitted)
        if hit:
            break
    if not hit:
        out.append(matcher.flush())
    expected = text.split(stop, maxsplit=1)[0] if stop in text else text
    assert "".join(out) == expected
    assert hit == (stop in text)


def test_ring_refuses_to_overflow_and_counts_cursors() -> None:
    ring = TokenRing(2)
    ring.push("a")
    ring.push("b")
    assert ring.is_full()
    with pytest.raises(RingOverflow):
        ring.push("c")
    assert ring.peek(5) == ["a", "b"]
    ring.commit(1)
    assert ring.fill() == 0.5
    assert (ring.write_cursor, ring.read_cursor) == (2, 1)


def test_the_earliest_stop_string_is_the_one_reported() -> None:
    matcher = StopMatcher(["t12", "1 t1"])
    emitted, hit = matcher.push("t11 t12 ")
    assert hit
    assert emitted == "t1"
    assert matcher.matched == "1 t1"
