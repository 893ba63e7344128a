"""Chat templates: the model's own through jinja, its refusals as 400, the fallbacks."""

from __future__ import annotations

import pytest

from edge_llm.engine.runtime.chat_template import ChatTemplate
from edge_llm.errors import NoChatTemplate, TemplateRefused

USER = [{"role": "user", "content": "hi"}]
REFUSING = (
    "{% for m in messages %}{% if m.role == 'assistant' and loop.first %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user') }}"
    "{% endif %}<{{ m.role }}>{{ m.content }}{% endfor %}"
)


def no_builtin(source: str, messages: object) -> str | None:
    raise AssertionError("the built-in renderer was not expected here")


def test_the_models_template_renders_with_the_generation_prompt() -> None:
    template = ChatTemplate(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}",
        no_builtin,
    )
    assert template.render(USER) == "<user>hi<assistant>"
    assert not template.renders_tools


def test_a_template_that_refuses_the_messages_is_a_400_naming_its_reason() -> None:
    template = ChatTemplate(REFUSING, no_builtin)
    with pytest.raises(TemplateRefused) as refused:
        template.render([{"role": "assistant", "content": "first"}])
    assert refused.value.status == 400 and refused.value.param == "messages"
    assert "roles must alternate" in refused.value.message
    assert template.render(USER) == "<user>hi"


def test_templates_jinja_cannot_run_go_to_the_builtin_then_to_a_transcript() -> None:
    seen: list[str] = []

    def builtin(source: str, messages: object) -> str | None:
        seen.append(source)
        return None

    broken = ChatTemplate("{% for %}", builtin)
    assert broken.render(USER) == "user: hi\nassistant:"
    assert seen == ["{% for %}"]
    tools = ChatTemplate("{% for t in tools or [] %}{{ t.function.name }}{% endfor %}", no_builtin)
    assert tools.renders_tools


def test_a_model_without_a_template_refuses_chat_naming_the_completions_endpoints() -> None:
    with pytest.raises(NoChatTemplate) as refused:
        ChatTemplate(None, no_builtin).render(USER)
    assert (refused.value.status, refused.value.code) == (400, "no_chat_template")
    assert refused.value.param == "messages"
    assert "/v1/completions" in refused.value.message
    assert "/api/generate" in refused.value.message
