"""What a route asks the generation layer for, typed: a :class:`GenerationJob`.

A route parses its dialect's request into one job: the conversation or the prompt,
the token limits, how the request's sampling fields meet a model's defaults, the
JSON its output must be, the priority and session the server resolved for it, and
the chat request an upstream would be sent. The dispatcher
(:mod:`edge_llm.generation.dispatch`) then runs it on a local model or relays it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from edge_llm.errors import InvalidRequest
from edge_llm.protocol.sampling import SamplingDefaults, SamplingParams
from edge_llm.protocol.tools import ToolSetup


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation, rendered by the model's chat template (with its tools);
    ``prefill`` is text the answer continues (a trailing assistant turn)."""

    messages: list[dict[str, Any]]
    tools: ToolSetup | None = None
    prefill: str = ""


@dataclass(frozen=True)
class TextPrompt:
    """A prompt completed as written."""

    text: str


Prompt = ChatPrompt | TextPrompt


class PrioritySource(StrEnum):
    """Who chose a request's priority class (the first given wins, in this order)."""

    BODY = "body"
    HEADER = "header"
    KEY = "key"
    ROUTE = "route"
    DEFAULT = "default"


@dataclass(frozen=True)
class Priority:
    """The class a request runs in (lower first) and who chose it."""

    value: int = 0
    source: PrioritySource = PrioritySource.DEFAULT

    @property
    def set_by_server(self) -> bool:
        """Chosen outside the body (header, API key, route): an upstream learns it
        only if the relayed body says so."""
        return self.source in (PrioritySource.HEADER, PrioritySource.KEY, PrioritySource.ROUTE)


@dataclass(frozen=True)
class JsonOutput:
    """The answer must be JSON valid against ``schema`` (None: any JSON object);
    ``param`` names the request field that asked, for a schema that cannot be enforced."""

    schema: dict[str, Any] | None
    param: str


@dataclass(frozen=True)
class Relay:
    """The request as an upstream gets it: a chat or text completion. ``trace_headers``
    gives the W3C trace context each upstream call carries (read at the call: the
    relay's span exists by then)."""

    path: str
    body: dict[str, Any]
    trace_headers: Callable[[], dict[str, str]] = field(default=dict, compare=False)

    def with_priority(self, priority: Priority) -> Relay:
        """The body carrying a priority the server resolved (header, key, route)
        when the body names none of its own."""
        if not priority.set_by_server or "priority" in self.body:
            return self
        return replace(self, body={**self.body, "priority": priority.value})


def relay_of(path: str, body: Callable[[], dict[str, Any]]) -> Relay | InvalidRequest:
    """The relay of a request, or why it cannot be relayed (raised only if an
    upstream is chosen)."""
    try:
        return Relay(path, body())
    except InvalidRequest as refused:
        return refused


@dataclass(frozen=True)
class GenerationJob:
    """One request, whichever dialect asked and whichever backend answers."""

    model: str | None
    session: str | None
    priority: Priority
    # What the local model is asked, built only when the job runs locally: what a
    # local model cannot take (a tool_choice without tools), an upstream may.
    prompt: Callable[[], Prompt]
    # The request's sampling fields over a model's defaults (known once a model is chosen).
    sampling: Callable[[SamplingDefaults], SamplingParams]
    relay: Relay | InvalidRequest
    max_tokens: int | None = None  # None: the server's default_max_tokens
    context: int | None = None  # the request's own bound on prompt and answer (num_ctx)
    json_output: JsonOutput | None = None
    # Anthropic's endpoint: clients send their own model ids, which run locally
    # unless an upstream lists them.
    any_model_runs_locally: bool = False
    # A heartbeat at each change of the local stream's state too (the client opted in).
    progress: bool = False
    # llama-server's cache_prompt: False computes the whole prompt (no cached cells).
    cache_prompt: bool = True
    # Streamed: a model pulled for it on first use is waited for in the stream (its
    # progress says downloading), not before the answer starts.
    streamed: bool = False
    # The stream's id, when the answer had to have one before the stream existed.
    request_id: str | None = None
    # Its own TTFT time-out on a local model (a background response's): None: the
    # engine's ttft_timeout_ms; 0: none.
    ttft_timeout_s: float | None = None

    def traced(self, trace_headers: Callable[[], dict[str, str]]) -> GenerationJob:
        """The job whose upstream calls carry ``trace_headers``' trace context."""
        if isinstance(self.relay, InvalidRequest):
            return self
        return replace(self, relay=replace(self.relay, trace_headers=trace_headers))

    def relayed(self) -> Relay:
        """What an upstream is sent, or InvalidRequest if the request cannot be relayed."""
        if isinstance(self.relay, InvalidRequest):
            raise self.relay
        return self.relay.with_priority(self.priority)
