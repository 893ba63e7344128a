"""The README's configuration reference names every key the engine accepts."""

from __future__ import annotations

from pathlib import Path

from edge_llm.config import EngineConfig

README = Path(__file__).parents[2] / "README.md"


def test_every_config_key_is_documented() -> None:
    text = README.read_text(encoding="utf-8")
    config = EngineConfig()
    sections = [type(getattr(config, name)) for name in EngineConfig.model_fields]
    keys = [key for section in sections for key in section.model_fields]
    missing = [key for key in keys if f"`{key}`" not in text]
    assert not missing, f"README does not document: {missing}"
