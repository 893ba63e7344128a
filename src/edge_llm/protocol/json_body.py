"""Decoding a request body or WebSocket frame: the one place JSON enters (no I/O).

Python's ``json`` module accepts more than JSON and fails badly on some inputs,
so every endpoint and every WebSocket frame is decoded here, and each hostile
class becomes an :class:`InvalidRequest` (400 ``invalid_request``):

- nesting deeper than :data:`MAX_DEPTH`: refused by a linear scan of the text
  *before* parsing (``json`` recurses once per level: ``RecursionError``);
- a lone UTF-16 surrogate escape (``"\\ud800"``): it decodes into a ``str``
  that cannot be encoded later (``UnicodeEncodeError`` in the tokenizer);
- ``NaN``, ``Infinity``, ``-Infinity`` (not JSON), numbers beyond a double
  (``1e999``) and integers longer than :data:`MAX_INT_DIGITS` digits (Python
  refuses to convert more than 4,300 mid-parse);
- bytes that are not UTF-8, and anything that is not JSON.

Values are checked after parsing without recursion, so the error names the
field (``messages.0.content``) in ``param``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from edge_llm.errors import InvalidRequest

MAX_DEPTH = 64
MAX_INT_DIGITS = 40
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_SURROGATE = re.compile("[\ud800-\udfff]")
# A lone surrogate comes from an escape \uD800-\uDFFF (or, in a str, is already there).
_MAY_HOLD_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")
_MAX_SHOWN_KEY = 64


@dataclass(frozen=True)
class _Refused:
    """Stands in for a number that was parsed but cannot be accepted."""

    literal: str
    reason: str


def decode_json(raw: bytes | str, *, what: str = "body", max_depth: int = MAX_DEPTH) -> Any:
    """The decoded document, or :class:`InvalidRequest` saying what is wrong and
    where (``what`` names the whole document: a body, a frame)."""
    text = _utf8(raw, what) if isinstance(raw, bytes) else raw
    check_depth(text, max_depth)
    numbers = _Numbers()
    try:
        document = json.loads(
            text,
            parse_float=numbers.parse_float,
            parse_int=numbers.parse_int,
            parse_constant=numbers.parse_constant,
        )
    except ValueError as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc}") from exc
    if numbers.refused or (_MAY_HOLD_SURROGATE.search(text) and not _encodable(document)):
        _find_refused(document, what)  # the slow walk, only for a body that will be refused
    return document


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"{what} is not valid UTF-8 (byte {exc.start})") from exc


def _encodable(document: Any) -> bool:
    """Whether every string and key is valid Unicode (C speed, no recursion
    deeper than the depth already checked)."""
    try:
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_depth(text: str, max_depth: int) -> None:
    """Refuse nesting deeper than ``max_depth`` in time linear in the text:
    strings are cut out (brackets inside them do not count), then the depth is
    the running sum of +1 per opening and -1 per closing bracket."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if brackets.count("[") + brackets.count("{") <= max_depth:
        return
    if max(accumulate(map(_DEPTH_STEP.__getitem__, brackets))) > max_depth:
        raise InvalidRequest(f"JSON nested deeper than {max_depth} levels")


class _Numbers:
    """Parse hooks that turn unacceptable numbers into :class:`_Refused`."""

    def __init__(self) -> None:
        self.refused = False

    def parse_float(self, literal: str) -> float | _Refused:
        value = float(literal)
        if math.isfinite(value):
            return value
        return self._refuse(literal, "number too large for a 64-bit float")

    def parse_int(self, literal: str) -> int | _Refused:
        digits = len(literal.lstrip("-"))
        if digits <= MAX_INT_DIGITS:
            return int(literal)
        return self._refuse(literal[:12] + "…", f"integer with {digits} digits")

    def parse_constant(self, literal: str) -> _Refused:
        return self._refuse(literal, "NaN and Infinity are not JSON numbers")

    def _refuse(self, literal: str, reason: str) -> _Refused:
        self.refused = True
        return _Refused(literal, reason)


def _find_refused(document: Any, what: str) -> None:
    """Walk the document (with a stack, not recursion) to the first refused
    number or string or key holding a lone surrogate, and raise naming it."""
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _Refused):
            raise _invalid(path, what, f"{value.reason} ({value.literal})")
        if isinstance(value, str):
            _check_string(value, "string", path, what)
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_string(key, "key", path, what)
                stack.append((_join(path, key), item))
        elif isinstance(value, list):
            stack.extend((_join(path, str(i)), item) for i, item in enumerate(value))


def _check_string(text: str, kind: str, path: str, what: str) -> None:
    found = _SURROGATE.search(text)
    if found is not None:
        problem = f"{kind} holds a lone UTF-16 surrogate \\u{ord(found.group()):04x}"
        raise _invalid(path, what, problem + ", which is not a character")


def _join(path: str, key: str) -> str:
    if len(key) > _MAX_SHOWN_KEY:
        key = key[:_MAX_SHOWN_KEY] + "…"
    key = _SURROGATE.sub("\ufffd", key)
    return f"{path}.{key}" if path else key


def _invalid(path: str, what: str, problem: str) -> InvalidRequest:
    """``path`` names the field (the ``param``); empty: the whole document."""
    return InvalidRequest(f"{path or what}: {problem}", param=path or None)
