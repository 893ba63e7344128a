"""``edge-llm config``: snippets per tool, and merging into files under tmp_path only."""

from __future__ import annotations

import argparse
import json
import stat
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from edge_llm.cli import config_cmd

from helpers import free_port

TARGET = config_cmd.Target("http://127.0.0.1:8000", "sk-test", "SmolLM2-135M-Instruct")


@pytest.fixture(autouse=True)
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Never read or write the real home directory."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("EDGE_LLM_API_KEY", "EDGE_LLM_BASE_URL", "CLAUDE_CONFIG_DIR", "CODEX_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def run_config(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    config_cmd.register(parser.add_subparsers())
    return config_cmd.run(parser.parse_args(["config", *argv]))


def offline(*argv: str) -> list[str]:
    """Arguments that need no engine: a closed port and an explicit model."""
    return [*argv, "--base-url", f"http://127.0.0.1:{free_port()}", "--model", "m-1"]


# -- URLs and values ---------------------------------------------------------------


def test_claude_code_uses_the_root_url() -> None:
    env = config_cmd.claude_code_settings(TARGET)["env"]
    assert env == {
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:8000",
        "ANTHROPIC_API_KEY": "sk-test",
        "ANTHROPIC_MODEL": "SmolLM2-135M-Instruct",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "SmolLM2-135M-Instruct",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


def test_cline_uses_v1() -> None:
    settings = config_cmd.cline_settings(TARGET)
    assert settings["openAiBaseUrl"] == "http://127.0.0.1:8000/v1"
    assert settings["openAiApiKey"] == "sk-test"
    assert settings["actModeOpenAiModelId"] == "SmolLM2-135M-Instruct"


def test_codex_snippet_is_valid_toml() -> None:
    document = tomllib.loads(config_cmd.codex_snippet(TARGET))
    assert document["model"] == "SmolLM2-135M-Instruct"
    assert document["model_provider"] == "edge-llm"
    provider = document["model_providers"]["edge-llm"]
    assert provider["base_url"] == "http://127.0.0.1:8000/v1"
    assert provider["env_key"] == "EDGE_LLM_API_KEY"
    assert provider["wire_api"] == "responses"  # Codex refuses "chat" since early 2026


def test_openai_exports_are_shell_quoted() -> None:
    target = config_cmd.Target("http://h:1", "sk-a b'c", "m")
    text = config_cmd.exports_text(target)
    assert "export OPENAI_BASE_URL=http://h:1/v1\n" in text
    assert "export OPENAI_API_KEY='sk-a b'\"'\"'c'\n" in text


# -- printing ----------------------------------------------------------------------


def test_prints_the_snippet_without_writing(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_config("claude-code", *offline("--api-key", "sk-x")) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["env"]["ANTHROPIC_API_KEY"] == "sk-x"
    assert "settings.json" in err
    assert '--bare --tools ""' in err  # what fits a small model's context


def test_an_engine_that_is_down_is_one_line_when_the_model_is_needed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    assert run_config("openai-env", "--base-url", url) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert f"cannot reach the server at {url} (connection refused" in err
    assert "or pass --model" in err
    assert "urlopen" not in err and "Errno" not in err


def test_the_base_url_comes_from_the_environment(
    models_server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGE_LLM_BASE_URL", f" {models_server}/v1/ ")
    assert run_config("claude-code") == 0
    env = json.loads(capsys.readouterr().out)["env"]
    assert env["ANTHROPIC_BASE_URL"] == models_server
    assert env["ANTHROPIC_MODEL"] == "served-model"
    assert env["ANTHROPIC_API_KEY"] == "sk-local"


class _Models(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"object": "list", "data": [{"id": "served-model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def models_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def test_model_comes_from_the_engine(
    models_server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGE_LLM_API_KEY", "sk-env")
    assert run_config("cline", "--base-url", models_server + "/v1/") == 0
    settings = json.loads(capsys.readouterr().out)
    assert settings["actModeOpenAiModelId"] == "served-model"
    assert settings["openAiApiKey"] == "sk-env"
    assert settings["openAiBaseUrl"] == models_server + "/v1"


def test_bad_base_url_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_config("codex", "--base-url", "ftp://x") == 2
    assert "must be an http:// or https:// URL, got 'ftp://x' (from --base-url)" in (
        capsys.readouterr().err
    )


# -- writing -----------------------------------------------------------------------


def test_claude_code_merge_keeps_other_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "settings.json"
    original = {"permissions": {"allow": ["Bash"]}, "env": {"FOO": "1", "ANTHROPIC_MODEL": "old"}}
    path.write_text(json.dumps(original, indent=2) + "\n", encoding="utf-8")
    assert run_config("claude-code", *offline("--write", "--path", str(path))) == 0
    merged = json.loads(path.read_text(encoding="utf-8"))
    assert merged["permissions"] == {"allow": ["Bash"]}
    assert merged["env"]["FOO"] == "1"
    assert merged["env"]["ANTHROPIC_MODEL"] == "m-1"
    assert merged["env"]["ANTHROPIC_BASE_URL"].startswith("http://127.0.0.1:")
    assert json.loads((tmp_path / "settings.json.bak").read_text(encoding="utf-8")) == original
    out = capsys.readouterr().out
    assert '-    "ANTHROPIC_MODEL": "old"' in out
    assert "wrote" in out


def test_new_file_is_private_and_second_write_is_a_no_op(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "new" / "settings.json"
    argv = offline("--write", "--path", str(path))
    assert run_config("claude-code", *argv) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not (tmp_path / "new" / "settings.json.bak").exists()
    before = path.read_text(encoding="utf-8")
    capsys.readouterr()
    assert run_config("claude-code", *argv) == 0
    assert "already up to date" in capsys.readouterr().out
    assert path.read_text(encoding="utf-8") == before


def test_invalid_json_is_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "settings.json"
    path.write_text("{not json", encoding="utf-8")
    assert run_config("claude-code", *offline("--write", "--path", str(path))) == 1
    assert path.read_text(encoding="utf-8") == "{not json"
    assert "not valid JSON" in capsys.readouterr().err


def test_env_that_is_not_an_object_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"env": ["x"]}', encoding="utf-8")
    assert run_config("claude-code", *offline("--write", "--path", str(path))) == 1
    assert path.read_text(encoding="utf-8") == '{"env": ["x"]}'


def test_default_paths_follow_the_tools_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "claude"))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex"))
    assert run_config("claude-code", *offline("--write")) == 0
    assert run_config("codex", *offline("--write")) == 0
    assert (tmp_path / "claude" / "settings.json").exists()
    assert (tmp_path / "codex" / "config.toml").exists()


def test_tools_without_a_standard_file_need_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_config("cline", *offline("--write")) == 2
    assert "--path" in capsys.readouterr().err


CODEX_CONFIG = """\
# my codex settings
model = "gpt-5"
approval_policy = "on-request"

[model_providers.ollama]
name = "Ollama"
base_url = "http://localhost:11434/v1"

[model_providers.edge-llm]
name = "edge-llm"
base_url = "http://old:1/v1"
env_key = "EDGE_LLM_API_KEY"

# profiles below
[profiles.fast]
model = "o4-mini"
"""


def test_codex_merge_replaces_only_its_keys(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(CODEX_CONFIG, encoding="utf-8")
    assert run_config("codex", *offline("--write", "--path", str(path))) == 0
    text = path.read_text(encoding="utf-8")
    document = tomllib.loads(text)
    assert document["model"] == "m-1"
    assert document["model_provider"] == "edge-llm"
    assert document["approval_policy"] == "on-request"
    assert document["model_providers"]["ollama"]["base_url"] == "http://localhost:11434/v1"
    assert document["model_providers"]["edge-llm"]["wire_api"] == "responses"
    assert "old:1" not in text
    assert document["profiles"]["fast"]["model"] == "o4-mini"
    assert "# my codex settings" in text
    assert "# profiles below" in text
    assert (tmp_path / "config.toml.bak").read_text(encoding="utf-8") == CODEX_CONFIG
    assert config_cmd.merge_codex(text, TARGET) == config_cmd.merge_codex(
        config_cmd.merge_codex(text, TARGET), TARGET
    )


def test_codex_table_is_replaced_in_place() -> None:
    merged = config_cmd.merge_codex(CODEX_CONFIG, TARGET)
    assert merged.index("[model_providers.edge-llm]") < merged.index("# profiles below")
    assert merged.startswith("# my codex settings\nmodel = ")


def test_backup_keeps_the_files_permissions(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text("{}", encoding="utf-8")
    path.chmod(0o600)
    assert run_config("claude-code", *offline("--write", "--path", str(path))) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "settings.json.bak").stat().st_mode) == 0o600


def test_codex_merge_refuses_an_inline_provider_table(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    inline = 'model_providers = { other = { name = "x" } }\n'
    path.write_text(inline, encoding="utf-8")
    assert run_config("codex", *offline("--write", "--path", str(path))) == 1
    assert path.read_text(encoding="utf-8") == inline


def test_codex_merge_refuses_invalid_toml(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("model = \n", encoding="utf-8")
    assert run_config("codex", *offline("--write", "--path", str(path))) == 1
    assert path.read_text(encoding="utf-8") == "model = \n"


def test_openai_env_merge(tmp_path: Path) -> None:
    path = tmp_path / "openai.env"
    path.write_text("# env\nOPENAI_API_KEY=old\nexport OTHER=1\n", encoding="utf-8")
    assert run_config("openai-env", *offline("--write", "--path", str(path), "--api-key", "k")) == 0
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[:3] == ["# env", "export OPENAI_API_KEY=k", "export OTHER=1"]
    assert lines[3].startswith("export OPENAI_BASE_URL=http://127.0.0.1:")
    assert lines[4] == "export OPENAI_MODEL=m-1"
