"""One way to reach the server: the shared resolution, and the one-line error of
every client command when nothing listens at the address."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from edge_llm.bench.targets import TargetError, targets_from_args
from edge_llm.cli.main import build_parser, main
from edge_llm.client.address import (
    ServerAddress,
    connect_failure,
    pick_setting,
    resolve_address,
    setting_to_change,
)
from edge_llm.client.config import load_client
from edge_llm.client.errors import ConfigError

from helpers import free_port

ADDRESS_VARIABLES = (
    "EDGE_LLM_BASE_URL",
    "EDGE_LLM_API_KEY",
    "EDGE_LLM_MODEL",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_MODEL",
)


@pytest.fixture(autouse=True)
def no_address_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ADDRESS_VARIABLES:
        monkeypatch.delenv(name, raising=False)


# -- resolution ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        "http://127.0.0.1:9000",
        "http://127.0.0.1:9000/",
        "http://127.0.0.1:9000/v1",
        " http://127.0.0.1:9000/v1/ ",
        "http://127.0.0.1:9000/v1/v1",
    ],
)
def test_base_url_is_normalised_with_or_without_v1(raw: str) -> None:
    address = resolve_address(base_url=raw, env={})
    assert address.base_url == "http://127.0.0.1:9000/v1"
    assert address.root == "http://127.0.0.1:9000"


def test_a_prefix_is_kept() -> None:
    assert resolve_address(base_url="https://h/api/v1/", env={}).root == "https://h/api"


def test_defaults() -> None:
    address = resolve_address(env={})
    assert address == ServerAddress("http://127.0.0.1:8000/v1", "sk-local", "default", "default")
    assert address.headers() == {"Authorization": "Bearer sk-local"}


def test_precedence_flag_env_file_openai() -> None:
    env = {
        "EDGE_LLM_BASE_URL": "http://env:1",
        "OPENAI_BASE_URL": "http://openai:1",
        "OPENAI_API_KEY": "sk-openai",
    }
    file = {"base_url": "http://file:1", "api_key": "sk-file"}
    flagged = resolve_address(base_url="http://flag:1", env=env, section=file)
    assert (flagged.base_url, flagged.base_url_source) == ("http://flag:1/v1", "--base-url")
    from_env = resolve_address(env=env, section=file, file_label="c.json")
    assert (from_env.base_url, from_env.base_url_source) == ("http://env:1/v1", "EDGE_LLM_BASE_URL")
    assert (from_env.api_key, from_env.api_key_source) == ("sk-file", "c.json")
    only_openai = resolve_address(env=env)
    assert only_openai.api_key_source == "OPENAI_API_KEY"
    assert pick_setting("model_id", None, {"OPENAI_MODEL": "m"}) is not None


def test_key_whitespace_and_bearer_are_removed_and_noted() -> None:
    address = resolve_address(api_key=" Bearer sk-1\n", env={})
    assert address.api_key == "sk-1"
    assert any("whitespace" in note and "--api-key" in note for note in address.notes)
    assert any("Bearer" in note for note in address.notes)


def test_a_bad_url_names_where_it_came_from() -> None:
    with pytest.raises(ConfigError, match=r"got 'localhost:8000' \(from EDGE_LLM_BASE_URL\)"):
        resolve_address(env={"EDGE_LLM_BASE_URL": "localhost:8000"})


def test_the_client_config_resolves_the_same_way(tmp_path: Path) -> None:
    path = tmp_path / "client.json"
    path.write_text(json.dumps({"edge_llm_client": {"base_url": "http://f:1/", "model_id": "m"}}))
    config, address = load_client(path, env={"EDGE_LLM_API_KEY": " sk-env "})
    assert config.base_url == address.base_url == "http://f:1/v1"
    assert config.api_key == address.api_key == "sk-env"
    assert address.base_url_source == f"client config {path}"
    assert address.api_key_source == "EDGE_LLM_API_KEY"
    assert setting_to_change(address.base_url_source).startswith(
        f"base_url in client config {path}"
    )


def test_the_setting_to_change_follows_the_source() -> None:
    assert setting_to_change("default") == "--base-url or EDGE_LLM_BASE_URL"
    assert setting_to_change("--base-url") == "--base-url or EDGE_LLM_BASE_URL"
    assert setting_to_change("EDGE_LLM_BASE_URL") == "EDGE_LLM_BASE_URL (or --base-url)"


def test_connect_failures_in_words() -> None:
    refused = ConnectionRefusedError(111, "Connection refused")
    wrapped = OSError("outer")
    wrapped.__cause__ = refused
    assert connect_failure(wrapped) == "connection refused: nothing listens there"
    assert connect_failure(socket.gaierror(-2, "Name or service not known")) == (
        "host name not found"
    )
    assert connect_failure(TimeoutError()) == "no answer in time"


# -- bench and storm targets ---------------------------------------------------------


def bench_args(*argv: str) -> object:
    return build_parser().parse_args(["bench", *argv])


def test_bench_without_target_uses_the_shared_default() -> None:
    env = {"EDGE_LLM_BASE_URL": "http://h:9/v1/", "EDGE_LLM_API_KEY": "sk-e"}
    [target] = targets_from_args(bench_args(), env)  # type: ignore[arg-type]
    assert (target.name, target.base_url, target.key) == ("edge-llm", "http://h:9/v1", "sk-e")
    assert target.setting == "EDGE_LLM_BASE_URL (or --base-url)"


def test_bench_targets_and_base_url_do_not_mix() -> None:
    args = bench_args("--target", "a=http://h:1", "--base-url", "http://h:2")
    with pytest.raises(TargetError, match="--base-url and --api-key name one server"):
        targets_from_args(args, {})  # type: ignore[arg-type]


# -- one line when nothing listens ---------------------------------------------------


def one_line_error(capsys: pytest.CaptureFixture[str], url: str, setting: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert f"cannot reach the server at {url} (connection refused" in lines[0]
    assert setting in lines[0]
    for raw in ("Traceback", "urlopen", "Errno", "Connect call failed"):
        assert raw not in err
    return lines[0]


@pytest.mark.parametrize(
    "argv",
    [
        ("chat", "hi"),
        ("top", "--once"),
        ("top",),
        ("config", "codex"),
        ("bench", "--requests", "1", "--warmup", "0"),
        ("storm", "--users", "1", "--duration", "1"),
    ],
    ids=["chat", "top-once", "top-live", "config", "bench", "storm"],
)
def test_unreachable_server_is_one_line(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    monkeypatch.setenv("EDGE_LLM_BASE_URL", url)
    assert main(list(argv)) == 1
    line = one_line_error(capsys, url, "EDGE_LLM_BASE_URL (or --base-url)")
    assert line.startswith(f"edge-llm {argv[0]}: ")


def test_unreachable_with_the_flag_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    assert main(["top", "--once", "--base-url", url]) == 1
    one_line_error(capsys, url, "--base-url or EDGE_LLM_BASE_URL")


def test_unreachable_bench_target_names_its_target(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    argv = ["bench", "--target", f"far={url}", "--requests", "1", "--warmup", "0"]
    assert main(argv) == 1
    one_line_error(capsys, url + "/v1", "--target far=URL")


def test_doctor_names_the_url_and_the_setting(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    monkeypatch.setenv("EDGE_LLM_BASE_URL", url)
    assert main(["doctor", "--json", "--timeout", "5"]) == 1
    report = json.loads(capsys.readouterr().out)
    reach = next(check for check in report["checks"] if check["name"] == "reachable")
    assert reach["status"] == "fail"
    assert reach["summary"].startswith(f"{url}: connection to 127.0.0.1:")
    assert "EDGE_LLM_BASE_URL (or --base-url)" in reach["fix"]
