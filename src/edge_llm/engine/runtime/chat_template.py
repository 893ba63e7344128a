"""A model's chat template, rendered as llama-server ``--jinja`` renders it: the
template shipped in the GGUF (its default system prompt included) through a sandboxed
jinja, and llama.cpp's built-in renderer for templates jinja cannot run (a plain
transcript when neither can). A model without a template (a base model) gets no chat:
:class:`NoChatTemplate` (400) names the completions endpoints instead."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import jinja2
import jinja2.sandbox

from edge_llm.errors import NoChatTemplate, TemplateRefused

Messages = Sequence[dict[str, Any]]
BuiltinRenderer = Callable[[str, Messages], "str | None"]
_PROBE_TOOL = "edge_llm_probe_tool"


class ChatTemplate:
    def __init__(self, source: str | None, builtin: BuiltinRenderer) -> None:
        """``builtin(source, messages)``: llama.cpp's renderer, None when it does not
        know the template."""
        self.source = source
        self._builtin = builtin
        self._jinja = _compile(source) if source else None
        self.renders_tools = self._jinja is not None and _renders_tools(self._jinja)

    def render(self, messages: Messages, tools: Sequence[dict[str, Any]] | None = None) -> str:
        """The prompt, ending with the assistant's turn. Raises
        :class:`TemplateRefused` (400) when the template refuses the messages,
        :class:`NoChatTemplate` (400) when the model has none."""
        if self.source is None:
            raise NoChatTemplate()
        if self._jinja is not None:
            rendered = _render(self._jinja, messages, tools)
            if rendered is not None:
                return rendered
        rendered = self._builtin(self.source, messages)
        return rendered if rendered is not None else _plain_transcript(messages)


def _compile(source: str) -> jinja2.Template | None:
    """Compiled once: None when jinja cannot parse it."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    # As transformers renders templates: plain JSON (jinja's own tojson escapes HTML).
    env.filters["tojson"] = _tojson
    try:
        return env.from_string(source)
    except jinja2.TemplateError:
        return None


def _tojson(value: object, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _renders_tools(template: jinja2.Template) -> bool:
    """Does the template show ``tools`` to the model? (llama.cpp probes the same way.)"""
    probe = {"type": "function", "function": {"name": _PROBE_TOOL, "parameters": {}}}
    try:
        rendered = _render(template, [{"role": "user", "content": "x"}], [probe])
    except TemplateRefused:
        return False
    return rendered is not None and _PROBE_TOOL in rendered


def _render(
    template: jinja2.Template, messages: Messages, tools: Sequence[dict[str, Any]] | None = None
) -> str | None:
    def raise_exception(message: str) -> None:
        raise TemplateRefused(message)

    try:
        return template.render(
            messages=list(messages),
            tools=list(tools) if tools else None,
            add_generation_prompt=True,
            bos_token="",
            eos_token="",
            raise_exception=raise_exception,
        )
    except jinja2.TemplateError:
        return None


def _plain_transcript(messages: Messages) -> str:
    """For a template neither jinja nor llama.cpp can render."""
    lines = [f"{m['role']}: {m.get('content') or ''}" for m in messages]
    return "\n".join([*lines, "assistant:"])
