"""Request validation: any JSON gives a request or an InvalidRequest naming the field."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_llm.errors import InvalidRequest
from edge_llm.protocol.openai import ChatCompletionRequest, CompletionRequest, parse_request
from edge_llm.protocol.sampling import SamplingDefaults

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)
FIELDS = st.sampled_from(
    [
        "messages",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "stream",
        "n",
        "user",
        "model",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "response_format",
    ]
)
VALID = {"messages": [{"role": "user", "content": "hi"}]}


# Generating these bodies is slow on a loaded machine; the test itself is fast.
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(FIELDS, JSON, max_size=5))
def test_any_body_is_parsed_or_rejected_with_a_named_field(body: dict) -> None:
    try:
        request = parse_request(ChatCompletionRequest, body)
    except InvalidRequest as exc:
        assert exc.status == 400
        assert exc.message
        return
    assert request.messages


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(FIELDS.filter(lambda f: f != "messages"), JSON)
def test_one_bad_field_is_the_one_named(field: str, value: object) -> None:
    try:
        parse_request(ChatCompletionRequest, {**VALID, field: value})
    except InvalidRequest as exc:
        assert exc.param is not None and exc.param.split(".")[0] == field


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, 2.5])
def test_non_finite_or_out_of_range_temperature_is_refused(value: float) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(ChatCompletionRequest, {**VALID, "temperature": value})
    assert info.value.param == "temperature"


def test_unknown_field_is_named() -> None:
    with pytest.raises(InvalidRequest, match="unknown field") as info:
        parse_request(ChatCompletionRequest, {**VALID, "frobnicate": 1})
    assert info.value.param == "frobnicate"


def test_string_numbers_are_not_coerced() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(ChatCompletionRequest, {**VALID, "max_tokens": "12"})
    assert info.value.param == "max_tokens"


def test_text_parts_and_developer_role_map_onto_the_template() -> None:
    body = {
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ],
        "stop": "x",
        "temperature": 0,
    }
    request = parse_request(ChatCompletionRequest, body)
    assert request.chat_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "ab"},
    ]
    assert request.sampling(SamplingDefaults()).stop == ("x",)
    assert request.sampling(SamplingDefaults()).greedy


def test_completion_takes_exactly_one_prompt() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(CompletionRequest, {"prompt": ["a", "b"]})
    assert info.value.param == "prompt"


def test_sampling_fields_reach_the_sampling_params() -> None:
    request = parse_request(
        ChatCompletionRequest,
        {
            **VALID,
            "presence_penalty": -2,
            "frequency_penalty": 1.5,
            "logit_bias": {"42": -100, "7": 3.5},
            "logprobs": True,
            "top_logprobs": 3,
        },
    )
    sampling = request.sampling(SamplingDefaults())
    assert sampling.presence_penalty == -2.0
    assert sampling.frequency_penalty == 1.5
    assert sampling.logit_bias == ((42, -100.0), (7, 3.5))
    assert sampling.n_logprobs == 3
    assert not sampling.plain_greedy


def test_logprobs_without_top_logprobs_asks_for_the_chosen_token_only() -> None:
    request = parse_request(ChatCompletionRequest, {**VALID, "logprobs": True})
    assert request.sampling(SamplingDefaults()).n_logprobs == 0
    plain = parse_request(ChatCompletionRequest, VALID)
    assert plain.sampling(SamplingDefaults()).n_logprobs is None
    completion = parse_request(CompletionRequest, {"prompt": "x", "logprobs": 2})
    assert completion.sampling(SamplingDefaults()).n_logprobs == 2


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("presence_penalty", 2.5),
        ("frequency_penalty", -2.01),
        ("logit_bias", {"abc": 1}),
        ("logit_bias", {"-3": 1}),
        ("logit_bias", {"5": 101}),
        ("top_logprobs", 21),
    ],
)
def test_out_of_range_sampling_fields_are_named(field: str, value: object) -> None:
    body = {**VALID, "logprobs": True, field: value}
    with pytest.raises(InvalidRequest) as info:
        parse_request(ChatCompletionRequest, body)
    assert info.value.param is not None and info.value.param.startswith(field)


def test_top_logprobs_needs_logprobs() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(ChatCompletionRequest, {**VALID, "top_logprobs": 2})
    assert info.value.param == "top_logprobs"


def test_response_format_kinds() -> None:
    def parsed(response_format: object) -> ChatCompletionRequest:
        return parse_request(ChatCompletionRequest, {**VALID, "response_format": response_format})

    assert not parsed({"type": "text"}).wants_json
    json_object = parsed({"type": "json_object"})
    assert json_object.wants_json and json_object.output_schema is None
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    spec = {"name": "thing", "schema": schema, "strict": True}
    with_schema = parsed({"type": "json_schema", "json_schema": spec})
    assert with_schema.wants_json and with_schema.output_schema == schema
    with pytest.raises(InvalidRequest) as info:
        parsed({"type": "json_schema", "json_schema": {"schema": schema}})  # no name
    assert info.value.param is not None and info.value.param.startswith("response_format")
    with pytest.raises(InvalidRequest):
        parsed({"type": "yaml"})
