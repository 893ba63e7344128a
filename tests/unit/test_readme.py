"""The README's configuration reference names every key the engine accepts."""

from __future__ import annotations

from pathlib import Path

from edge_llm.config import EngineConfig
from edge_llm.upstream.config import UpstreamConfig

README = Path(__file__).parents[2] / "README.md"


def test_every_config_key_is_documented() -> None:
    text = README.read_text(encoding="utf-8")
    config = EngineConfig()
    tables = [name for name in EngineConfig.model_fields if name != "upstream"]
    sections = [type(getattr(config, name)) for name in tables] + [UpstreamConfig]
    keys = [key for section in sections for key in section.model_fields]
    missing = [key for key in keys if f"`{key}`" not in text]
    assert not missing, f"README does not document: {missing}"
