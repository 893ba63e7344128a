"""The configuration reference in docs/configuration.md is what the config model generates."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edge_llm.cli.main import build_parser
from edge_llm.config.models import ModelEntryConfig
from edge_llm.config.reference import generated_part, render
from edge_llm.config.tree import EngineConfig, flag_overrides, load_config, sections, toml_table
from edge_llm.config.upstream import UpstreamConfig

PAGE = Path(__file__).parents[2] / "docs" / "configuration.md"
REGENERATE = "python -m edge_llm.config.reference --write docs/configuration.md"
CELL = re.compile(r"(?<!\\)\|")  # a cell border: a pipe not escaped as \|


def rows_by_table() -> dict[str, dict[str, str]]:
    """{table: {key: flag cell}} read back from the rendered reference."""
    tables: dict[str, dict[str, str]] = {}
    for part in render().split("### ")[1:]:
        table = part.split("`")[1].strip("[]")
        rows = [CELL.split(line)[1:-1] for line in part.splitlines() if line.startswith("| `")]
        tables[table] = {row[0].strip(" `"): row[3] for row in rows}
    return tables


def toml_literal(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    return f'"{value}"' if isinstance(value, str) else str(value)


def test_the_page_holds_what_the_generator_renders_now() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert generated_part(page), "docs/configuration.md lost its reference markers"
    assert generated_part(page) == render(), f"the reference is stale: run `{REGENERATE}`"


def test_every_key_of_every_table_is_in_the_reference() -> None:
    tables = rows_by_table()
    for name in EngineConfig.model_fields:
        if name == "upstream":
            assert set(tables["upstream.NAME"]) == set(UpstreamConfig.model_fields)
        elif name == "models":
            assert set(tables["models.NAME"]) == set(ModelEntryConfig.model_fields)
        else:
            model = sections()[name]
            assert set(tables[toml_table(name)]) == set(model.model_fields), name


@pytest.mark.parametrize(
    ("section", "key"),
    [(section, key) for section, model in sections().items() for key in model.model_fields],
)
def test_a_key_loads_from_the_table_the_reference_names(
    tmp_path: Path, section: str, key: str
) -> None:
    field = sections()[section].model_fields[key]
    value = field.get_default(call_default_factory=True)
    if value is None or value == []:
        value = "x" if value is None else ["x"]
    if field.examples:  # a value its own validation accepts
        value = field.examples[0]
    path = tmp_path / "engine.toml"
    path.write_text(f"[{toml_table(section)}]\n{key} = {toml_literal(value)}\n", encoding="utf-8")
    config = load_config(path, env={})
    assert getattr(getattr(config, section), key) == value


@pytest.mark.parametrize(
    ("table", "key", "flags"),
    [
        (table, key, flags)
        for table, rows in rows_by_table().items()
        if table not in ("upstream.NAME", "models.NAME")  # NAME=VALUE flags: test_config
        for key, flags in rows.items()
    ],
)
def test_each_flag_the_reference_names_sets_its_key(table: str, key: str, flags: str) -> None:
    parser = build_parser(only="serve")
    for flag in re.findall(r"`(--[\w-]+)`", flags):
        field = next(m for m in sections().values() if key in m.model_fields).model_fields[key]
        value = [] if field.annotation is bool else ["7"]
        args = parser.parse_args(["serve", flag, *value])
        assert key in flag_overrides(args), f"[{table}] {flag} does not set {key}"
