"""The doctor's pure parts: URL and key checks, proxy rules, error classes, stream tallies."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from edge_llm.client.errors import ConfigError
from edge_llm.doctor import api_checks, net, proxy, settings, static_checks
from edge_llm.doctor.probe import Reply, StreamProbe, StreamTally
from edge_llm.doctor.result import Status, exit_code, failed, passed, skipped, warned
from edge_llm.protocol.sse import SSEParser

# -- base URL ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "status", "canonical"),
    [
        ("http://127.0.0.1:8000/v1", Status.PASS, "http://127.0.0.1:8000/v1"),
        ("https://example.com/api/v1", Status.PASS, "https://example.com/api/v1"),
        ("http://127.0.0.1:8000/v1/", Status.FAIL, "http://127.0.0.1:8000/v1"),
        ("http://127.0.0.1:8000/v1/v1", Status.FAIL, "http://127.0.0.1:8000/v1"),
        (" http://127.0.0.1:8000/v1", Status.FAIL, "http://127.0.0.1:8000/v1"),
        ("http://127.0.0.1:8000/", Status.FAIL, "http://127.0.0.1:8000/v1"),
        ("http://127.0.0.1:8000", Status.WARN, "http://127.0.0.1:8000/v1"),
        ("127.0.0.1:8000/v1", Status.FAIL, None),
        ("ftp://host/v1", Status.FAIL, None),
        ("http://host/v1?x=1", Status.FAIL, None),
    ],
)
def test_base_url(raw: str, status: Status, canonical: str | None) -> None:
    verdict = static_checks.check_base_url(raw)
    assert verdict.result.status is status
    assert verdict.url == canonical
    if status is not Status.PASS:
        assert verdict.result.fix


def test_base_url_names_each_problem() -> None:
    result = static_checks.check_base_url("http://h:1/v1/v1/").result
    assert "trailing slash" in result.summary
    assert "doubled /v1" in result.summary
    assert result.fix == "set the base URL to http://h:1/v1"


# -- API key -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (" sk-abc", "leading/trailing whitespace"),
        ("sk-abc\n", "leading/trailing whitespace"),
        ("sk-a bc", "whitespace inside"),
        ('"sk-abc"', "quote characters"),
        ("Bearer sk-abc", "'Bearer ' prefix"),
        ("sk-ab\u00e7", "non-ASCII"),
    ],
)
def test_bad_keys_are_named(raw: str, problem: str) -> None:
    result = static_checks.check_api_key(raw)
    assert result.status is Status.FAIL
    assert problem in result.summary
    assert raw.strip() not in result.summary  # never printed whole


def test_good_and_empty_keys() -> None:
    assert static_checks.check_api_key("sk-abcdef123").status is Status.PASS
    assert static_checks.check_api_key("").status is Status.WARN


@pytest.mark.parametrize(
    ("raw", "clean"),
    [(" sk-a ", "sk-a"), ("'sk-a'", "sk-a"), ("Bearer sk-a", "sk-a"), ("sk-\na", "sk-a")],
)
def test_clean_key(raw: str, clean: str) -> None:
    assert static_checks.clean_key(raw) == clean


def test_mask_key_hides_the_middle() -> None:
    assert static_checks.mask_key("sk-1234567890") == "sk-…90 (13 chars)"
    assert "secret" not in static_checks.mask_key("secret")


# -- proxy variables ---------------------------------------------------------------


def test_lower_case_proxy_variable_wins() -> None:
    env = {"HTTP_PROXY": "http://upper:1", "http_proxy": "http://lower:1"}
    choice = proxy.proxy_for("http://127.0.0.1:8000/v1", env)
    assert choice == proxy.ProxyChoice("http_proxy", "http://lower:1")


def test_proxy_by_scheme_then_all_proxy() -> None:
    env = {"HTTPS_PROXY": "http://p:1", "ALL_PROXY": "socks5://s:1"}
    assert proxy.proxy_for("https://h/v1", env) == proxy.ProxyChoice("HTTPS_PROXY", "http://p:1")
    assert proxy.proxy_for("http://h/v1", env) == proxy.ProxyChoice("ALL_PROXY", "socks5://s:1")
    assert proxy.proxy_for("http://h/v1", {}) is None


@pytest.mark.parametrize(
    ("no_proxy", "exempt"),
    [
        ("127.0.0.1,localhost", True),
        ("localhost", False),
        ("*", True),
        ("127.0.0.0/8", True),
        ("10.0.0.0/8", False),
        ("127.0.0.1:8000", True),
        ("127.0.0.1:9000", False),
    ],
)
def test_no_proxy_rules(no_proxy: str, exempt: bool) -> None:
    found = proxy.bypass_variable("http://127.0.0.1:8000/v1", {"NO_PROXY": no_proxy})
    assert (found == "NO_PROXY") is exempt


def test_no_proxy_domain_suffix() -> None:
    assert proxy.bypass_variable("http://box.lan:8000/v1", {"no_proxy": ".lan"}) == "no_proxy"
    assert proxy.bypass_variable("http://boxlan:8000/v1", {"no_proxy": ".lan"}) is None


def test_bypass_fix_says_bypass_not_add() -> None:
    fix = proxy.bypass_fix("http://127.0.0.1:8000/v1", {"HTTPS_PROXY": "http://127.0.0.1:9"})
    assert "NO_PROXY=127.0.0.1,localhost" in fix
    assert "unset HTTPS_PROXY" in fix
    assert "do not add a proxy" in fix


def test_proxy_variables_lists_both_cases() -> None:
    env = {"https_proxy": "a", "NO_PROXY": "b", "PATH": "/bin", "HTTP_PROXY": ""}
    assert proxy.proxy_variables(env) == {"https_proxy": "a", "NO_PROXY": "b"}


# -- connection failures -----------------------------------------------------------


def test_classify_connection_failures() -> None:
    where = net.Endpoint("127.0.0.1", 9)
    dns = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert net.classify(dns, where, 5).kind == "dns"
    assert net.classify(ConnectionRefusedError(111, "refused"), where, 5).kind == "refused"
    timeout = net.classify(TimeoutError(), where, 5)
    assert timeout.kind == "timeout"
    assert "5 s" in timeout.message


def test_endpoint_default_ports() -> None:
    assert net.endpoint_of("http://proxy") == net.Endpoint("proxy", 80)
    assert net.endpoint_of("socks5://127.0.0.1") == net.Endpoint("127.0.0.1", 1080)
    assert net.endpoint_of("127.0.0.1:7890") == net.Endpoint("127.0.0.1", 7890)
    assert net.endpoint_of("http://h:notaport") is None


# -- stream tallies and their diagnosis --------------------------------------------


def chunk(content: str | None = None, **extra: object) -> bytes:
    obj: dict[str, object] = {"id": "c1", "object": "chat.completion.chunk"}
    if content is not None:
        obj["choices"] = [{"index": 0, "delta": {"content": content}, "finish_reason": None}]
    obj.update(extra)
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def tally_of(raw: bytes) -> StreamTally:
    tally = StreamTally(started=0.0)
    parser = SSEParser()
    for event in parser.feed(raw) + parser.close():
        tally.add(event, 1.0)
    return tally


def probe_of(raw: bytes, content_type: str = "text/event-stream", status: int = 200) -> StreamProbe:
    return StreamProbe(Reply(status, content_type, raw[:65536]), tally_of(raw), truncated=False)


DONE = b"data: [DONE]\n\n"


def test_tally_counts_content_and_done() -> None:
    tally = tally_of(b": ping\n\n" + chunk("") + chunk("Hi") + chunk(" there") + DONE)
    assert (tally.n_events, tally.n_content, tally.done) == (4, 2, True)
    assert tally.ttft_ms == 1000.0


def test_tally_flags_non_json_and_missing_choices() -> None:
    tally = tally_of(chunk("a") + b"data: hello\n\n" + chunk(None) + chunk(None, choices=[]) + DONE)
    assert tally.n_non_json == 1
    assert tally.samples == ["hello"]
    assert tally.n_no_choices_key == 1
    assert tally.n_empty_choices == 1


def test_tally_keeps_the_stream_error() -> None:
    tally = tally_of(chunk("a") + b'data: {"error": {"message": "boom", "code": "x"}}\n\n')
    assert tally.error == "boom"


def test_diagnose_good_stream() -> None:
    probe = probe_of(chunk("Hi") + DONE)
    assert api_checks.diagnose_stream(probe).status is Status.PASS
    assert api_checks.diagnose_chunks(probe).status is Status.PASS


def test_diagnose_ignored_stream() -> None:
    body = json.dumps({"object": "chat.completion", "choices": [{"message": {"content": "x"}}]})
    result = api_checks.diagnose_stream(probe_of(body.encode(), "application/json"))
    assert result.status is Status.FAIL
    assert "ignored" in result.summary
    assert "stream" in (result.fix or "")


def test_diagnose_wrong_content_type() -> None:
    result = api_checks.diagnose_stream(probe_of(chunk("Hi") + DONE, "text/plain"))
    assert result.status is Status.FAIL
    assert "'text/plain'" in result.summary


def test_diagnose_no_chunks_and_no_done() -> None:
    assert "no content chunk" in api_checks.diagnose_stream(probe_of(b": ping\n\n")).summary
    no_done = api_checks.diagnose_stream(probe_of(chunk("Hi")))
    assert no_done.status is Status.FAIL
    assert "[DONE]" in no_done.summary


def test_diagnose_http_error_names_the_server_message() -> None:
    body = b'{"error": {"message": "model x not served", "code": "model_not_found"}}'
    result = api_checks.diagnose_stream(probe_of(body, "application/json", status=404))
    assert "HTTP 404: model x not served" in result.summary


def test_diagnose_chunks_levels() -> None:
    non_json = api_checks.diagnose_chunks(probe_of(chunk("a") + b"data: oops\n\n" + DONE))
    assert non_json.status is Status.FAIL
    assert "reading 'choices'" in non_json.summary
    missing = api_checks.diagnose_chunks(probe_of(chunk("a") + chunk(None) + DONE))
    assert missing.status is Status.FAIL
    assert "no 'choices'" in missing.summary
    empty = api_checks.diagnose_chunks(probe_of(chunk("a") + chunk(None, choices=[]) + DONE))
    assert empty.status is Status.WARN


def test_closest_model() -> None:
    ids = ["SmolLM2-135M-Instruct", "gemma-3-270m"]
    assert api_checks.closest_model("smollm2-135m-instruct", ids) == "SmolLM2-135M-Instruct"
    assert api_checks.closest_model("SmolLM2-135M", ids) == "SmolLM2-135M-Instruct"
    assert api_checks.closest_model("zzzz", ids) is None


def test_models_lists_valid_ids_and_closest() -> None:
    body = json.dumps({"data": [{"id": "SmolLM2-135M-Instruct"}, {"id": "other"}]}).encode()
    outcome = api_checks.diagnose_models(Reply(200, "application/json", body), "smollm2", "U")
    assert outcome.result.status is Status.FAIL
    assert "valid ids: SmolLM2-135M-Instruct, other" in outcome.result.summary
    assert outcome.model == "SmolLM2-135M-Instruct"


def test_models_404_points_at_the_base_url() -> None:
    outcome = api_checks.diagnose_models(Reply(404, "text/plain", b"Not Found"), "m", "http://h")
    assert outcome.result.status is Status.FAIL
    assert "/v1" in (outcome.result.fix or "")


def test_long_prompt_grows_with_words() -> None:
    assert len(api_checks.long_prompt(300).split()) > len(api_checks.long_prompt(30).split())


# -- settings ----------------------------------------------------------------------


def write_config(path: Path, **fields: object) -> str:
    section = {"base_url": "http://file:1/v1", "model_id": "file-model", **fields}
    path.write_text(json.dumps({"edge_llm_client": section}), encoding="utf-8")
    return str(path)


def test_settings_precedence(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.json", api_key="sk-file", ttft_warn_ms=1500)
    env = {"EDGE_LLM_MODEL": "env-model", "OPENAI_API_KEY": "sk-openai"}
    resolved = settings.resolve({"base_url": "http://flag:1/v1"}, config, env)
    assert resolved.base_url == settings.Setting("http://flag:1/v1", "--base-url")
    assert resolved.model == settings.Setting("env-model", "EDGE_LLM_MODEL")
    assert resolved.api_key == settings.Setting("sk-file", config)
    assert resolved.ttft_warn_ms == 1500


def test_settings_openai_fallback_and_defaults() -> None:
    env = {"OPENAI_BASE_URL": "http://o:1/v1", "OPENAI_MODEL": "gpt-x"}
    resolved = settings.resolve({}, None, env)
    assert resolved.base_url.source == "OPENAI_BASE_URL"
    assert resolved.model == settings.Setting("gpt-x", "OPENAI_MODEL")
    assert resolved.api_key.source == "default"
    assert resolved.ttft_warn_ms == 3000


def test_settings_keep_raw_values(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.json", base_url="http://h:1/v1/ ", api_key=" sk-x ")
    resolved = settings.resolve({}, config, {})
    assert resolved.base_url.value == "http://h:1/v1/ "
    assert resolved.api_key.value == " sk-x "


def test_settings_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{", encoding="utf-8")
    with pytest.raises(ConfigError):
        settings.resolve({}, str(bad), {})
    with pytest.raises(ConfigError):
        settings.resolve({}, write_config(tmp_path / "c.json", ttft_warn_ms="x"), {})


# -- results -----------------------------------------------------------------------


def test_warnings_and_skips_do_not_fail() -> None:
    ok = [passed("a", "s"), warned("b", "s", "f"), skipped("c", "r")]
    assert exit_code(ok) == 0
    assert exit_code([*ok, failed("d", "s", "f")]) == 1
