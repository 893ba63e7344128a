"""What ``edge-llm pull`` and ``/api/pull`` accept, and what never reaches the disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_llm.models.sources import HubFile, SourceError, UrlFile, parse_source
from edge_llm.models.store import ModelStore


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("hf.co/bartowski/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M",
         HubFile("bartowski/Qwen2.5-Coder-1.5B-Instruct-GGUF", quant="Q4_K_M")),
        ("bartowski/Qwen2.5-Coder-1.5B-Instruct-GGUF:q4_k_m",
         HubFile("bartowski/Qwen2.5-Coder-1.5B-Instruct-GGUF", quant="Q4_K_M")),
        ("huggingface.co/o/r:IQ2_XXS", HubFile("o/r", quant="IQ2_XXS")),
        ("hf.co/o/r", HubFile("o/r", quant="Q4_K_M")),
        ("hf.co/o/r:latest", HubFile("o/r", quant="Q4_K_M")),
        ("hf.co/o/r/sub/model-Q8_0.gguf", HubFile("o/r", filename="sub/model-Q8_0.gguf")),
    ],
)  # fmt: skip
def test_sources_are_parsed_as_ollama_and_llama_server_spell_them(
    text: str, expected: HubFile
) -> None:
    assert parse_source(text) == expected


def test_a_hub_source_is_stored_under_ollamas_spelling() -> None:
    assert parse_source("o/r:q8_0").name == "hf.co/o/r:Q8_0"
    assert parse_source("hf.co/o/r/m.gguf").name == "hf.co/o/r/m.gguf"


def test_a_url_needs_a_name() -> None:
    assert parse_source("https://example.org/m.gguf", "mine") == UrlFile(
        "https://example.org/m.gguf", "mine"
    )
    with pytest.raises(SourceError, match="--name"):
        parse_source("https://example.org/m.gguf")


@pytest.mark.parametrize(
    "text",
    [
        "hf.co/../../etc:Q4_K_M",
        "hf.co/o/r/../../../x.gguf",
        "hf.co/o/r/./x.gguf",
        "hf.co/o//x.gguf",
        "/etc/passwd",
        "../../x",
        "hf.co/o/r:../../x",
        "hf.co/o/r:Q4%2F..",
        "hf.co/o..o/r:Q4_K_M",
        "hf.co/o/r\\..\\x.gguf",
        "hf.co/o/r/x.bin",
        "file:///etc/passwd",
        "o/r",
        "hf.co/o/r:Q4\nX",
        "hf.co/o/r:Q4\x00",
        "",
    ],
)
def test_traversal_and_tricks_are_refused(text: str) -> None:
    with pytest.raises(SourceError):
        parse_source(text)


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("https://user:pw@example.org/m.gguf", "m"),
        ("https:///m.gguf", "m"),
        ("https://example.org/m.gguf", "../m"),
        ("https://example.org/m.gguf", "/abs"),
        ("https://example.org/m.gguf", "a/../../b"),
        ("https://example.org/m.gguf", "a//b"),
        ("https://example.org/m.gguf", "."),
    ],
)
def test_urls_and_names_are_checked(url: str, name: str) -> None:
    with pytest.raises(SourceError):
        parse_source(url, name)


def test_the_store_maps_a_name_to_one_file_inside_it(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    for name in ("hf.co/o/r:Q4_K_M", "a/b/c", "x:y"):
        path = store._manifest_path(name).resolve()
        assert path.parent == store.manifests.resolve()
        assert "/" not in path.name
