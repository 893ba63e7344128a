"""bench targets (``NAME=URL[,key=..,model=..]``) and prompt sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge_llm.bench.prompts import (
    LONG_PROMPT_VARIANTS,
    PromptError,
    builtin_prompts,
    load_jsonl,
    long_text,
)
from edge_llm.bench.targets import Target, TargetError, check_unique, normalize_root, parse_target


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000",
        "http://127.0.0.1:8000/",
        "http://127.0.0.1:8000/v1",
        "http://127.0.0.1:8000/v1/",
        "  http://127.0.0.1:8000/v1  ",
    ],
)
def test_base_url_with_or_without_v1(url: str) -> None:
    target = parse_target(f"a={url}")
    assert target.root == "http://127.0.0.1:8000"
    assert target.base_url == "http://127.0.0.1:8000/v1"
    assert target.chat_url == "http://127.0.0.1:8000/v1/chat/completions"


def test_prefix_path_is_kept() -> None:
    assert normalize_root("https://api.example.com/openai/v1") == "https://api.example.com/openai"


def test_key_and_model_options() -> None:
    target = parse_target("llama=http://h:8080/v1,key=sk-1,model=smol")
    assert (target.name, target.key, target.model) == ("llama", "sk-1", "smol")
    assert target.headers() == {"Authorization": "Bearer sk-1"}


def test_key_from_environment_and_never_exported() -> None:
    target = parse_target("a=http://h,key=env:MY_KEY", env={"MY_KEY": " sk-env \n"})
    assert target.key == "sk-env"
    assert "sk-env" not in json.dumps(target.describe())
    assert target.describe()["key_set"] is True


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("http://h:1", "NAME=URL"),
        ("a=", "NAME=URL"),
        ("a=ftp://h", "http"),
        ("a=http://h,colour=red", "unknown target option"),
        ("a=http://h,key=1,key=2", "given twice"),
        ("a=http://h?x=1", "query"),
        ("a=http://h,key=env:MISSING_VAR", "unset"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(TargetError, match=message):
        parse_target(spec, env={})


def test_duplicate_names_rejected() -> None:
    with pytest.raises(TargetError, match="two targets"):
        check_unique([Target("a", "http://h"), Target("a", "http://g")])


def test_builtin_sets() -> None:
    short, long, mixed = (builtin_prompts(name) for name in ("short", "long", "mixed"))
    assert all(len(p.messages[0]["content"]) < 200 for p in short)
    assert len(long) == LONG_PROMPT_VARIANTS
    assert len({p.messages[0]["content"] for p in long}) == len(long)  # no shared prompt
    assert [p.id for p in mixed[:2]] == [short[0].id, long[0].id]
    with pytest.raises(PromptError, match="unknown prompt set"):
        builtin_prompts("huge")


def test_long_prompts_differ_from_the_first_line() -> None:
    first, second = long_text(0), long_text(1)
    assert first.split("\n")[0] != second.split("\n")[0]
    # About 1,000 tokens at ~4.9 characters per token of this text (measured with
    # SmolLM2's tokenizer: 971 tokens).
    assert 4000 < len(first) < 6000


def test_jsonl_prompts(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"prompt": "hi", "id": "x", "max_tokens": 5}\n'
        "\n# a comment\n"
        '{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}\n',
        encoding="utf-8",
    )
    first, second = load_jsonl(path)
    assert (first.id, first.max_tokens, first.body_messages()) == (
        "x",
        5,
        [{"role": "user", "content": "hi"}],
    )
    assert second.id == "line-4"
    assert [m["role"] for m in second.messages] == ["system", "user"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "line 1: not JSON"),
        ("[1]", "line 1: expected a JSON object"),
        ('{"x": 1}', "line 1: needs"),
        ('{"messages": [{"role": "user"}]}', "string role and content"),
        ('{"prompt": "p", "max_tokens": 0}', "max_tokens"),
    ],
)
def test_jsonl_errors_name_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(PromptError, match=message):
        load_jsonl(path)


def test_missing_or_empty_prompt_file(tmp_path: Path) -> None:
    with pytest.raises(PromptError, match="cannot read"):
        load_jsonl(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(PromptError, match="no prompts"):
        load_jsonl(empty)
