"""Every event name the code writes is a member of :class:`Event`.

The call sites are found in the source: calls of ``events(...)``, ``emit(...)`` or
``log_event(...)`` (the sinks' names everywhere), whose first argument is the
event's name. That argument must be an ``Event`` member (the engine's two time-out
events go through a variable of that type: mypy checks the sinks' signature);
``tests/e2e/test_blame_top_engine.py`` checks every name in the logs a real engine
and client wrote.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import edge_llm
from edge_llm.observability.events import Event

SOURCE = Path(edge_llm.__file__).parent
SINK_NAMES = {"events", "emit", "log_event"}


@dataclass(frozen=True)
class CallSite:
    where: str
    name: ast.expr

    @property
    def literal(self) -> str | None:
        value = self.name.value if isinstance(self.name, ast.Constant) else None
        return value if isinstance(value, str) else None

    @property
    def member(self) -> str | None:
        """``X`` of ``Event.X``, else None."""
        node = self.name
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return node.attr if node.value.id == "Event" else None
        return None


def call_sites() -> Iterator[CallSite]:
    for path in sorted(SOURCE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in SINK_NAMES:
                yield CallSite(f"{path.relative_to(SOURCE)}:{node.lineno}", node.args[0])


def test_the_scan_finds_the_emitters() -> None:
    places = {site.where.split("/")[0] for site in call_sites()}
    assert {"engine", "server", "upstream", "client"} <= places


def test_every_emitted_literal_names_an_event() -> None:
    unknown = [
        f"{site.where}: {site.literal!r}"
        for site in call_sites()
        if site.literal is not None and site.literal not in set(Event)
    ]
    assert not unknown, "event names missing from Event:\n" + "\n".join(unknown)


def test_every_member_used_exists() -> None:
    missing = [
        f"{site.where}: Event.{site.member}"
        for site in call_sites()
        if site.member is not None and site.member not in Event.__members__
    ]
    assert not missing


def test_names_are_event_members() -> None:
    plain = [f"{site.where}: {site.literal!r}" for site in call_sites() if site.literal is not None]
    assert not plain, "use the Event member instead of a string:\n" + "\n".join(plain)
