"""The playground page (`GET /`) in a real headless Chromium against the real model.

Playwright drives Debian's Chromium (installed by `make browser`, part of `make
test`). Every wait is on a page condition with a generous deadline, never a fixed
sleep. Each test leaves a screenshot in test-artifacts/playground/;
EDGE_LLM_DOCS_SCREENSHOT=1 also refreshes docs/playground.png (the README's picture).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from edge_llm.observability.units import mib

from conftest import EngineFactory, EngineProcess, start_engine
from support import STORY

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ROOT = Path(__file__).parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "playground"
README_SCREENSHOT = ROOT / "docs" / "playground.png"
CHROMIUM = os.environ.get("EDGE_LLM_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
TIMEOUT_MS = 300_000  # a page condition; decode ran at 0.2 tok/s under load here
FRANCE = "Name the capital of France."
expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} not found: `make browser` installs Debian's Chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def exact_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """An engine whose greedy text is a function of the request alone (``deterministic``),
    for the tests that compare a paused or resumed stream's text with an uninterrupted
    answer: the default mode may break a near-tie another way under another thread
    count or batch shape (seen on the loaded 2-core machine: a 160-token story that
    diverged 60 tokens after a drop)."""
    engine = start_engine(
        tmp_path_factory.mktemp("exact-engine"), "--deterministic", "--max-pause-ms", "600000"
    )
    yield engine
    engine.stop()


@pytest.fixture
def page(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 700})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    page_errors: list[str] = []
    page.on("pageerror", lambda error: page_errors.append(str(error)))
    yield page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=ARTIFACTS / f"{request.node.name}.png", full_page=True)
    context.close()
    assert not page_errors, f"uncaught errors in the page: {page_errors}"


def open_playground(page: Page, engine: EngineProcess) -> None:
    page.goto(engine.url + "/")
    expect(page.locator("body")).to_have_attribute("data-ready", "true")
    expect(page.locator("#model")).to_contain_text("SmolLM2")


def pane_of(page: Page, index: int) -> Locator:
    return page.locator(f'.pane[data-pane="{index}"]')


def role(pane: Locator, name: str) -> Locator:
    return pane.locator(f'[data-role="{name}"]')


def send(pane: Locator, prompt: str, *, max_tokens: int, speed: str = "instant") -> None:
    role(pane, "prompt").fill(prompt)
    role(pane, "max-tokens").fill(str(max_tokens))
    role(pane, "temperature").fill("0")
    role(pane, "render-speed").select_option(speed)
    role(pane, "send").click()


def wait_received(page: Page, index: int, at_least: int) -> None:
    page.wait_for_function(
        "([i, n]) => Number(document.querySelector(`.pane[data-pane='${i}']`)"
        ".dataset.received || 0) >= n",
        arg=[index, at_least],
        timeout=TIMEOUT_MS,
    )


def stream_id_of(pane: Locator) -> str:
    expect(pane).to_have_attribute("data-stream-id", re.compile(r"chatcmpl-\w+"))
    value = pane.get_attribute("data-stream-id")
    assert value
    return value


def row_of(page: Page, stream_id: str) -> Locator:
    return page.locator(f'#streams tr[data-stream-id="{stream_id}"]')


def wait_panel_polls(page: Page, more: int) -> None:
    """Let the live panel poll /debug/streams ``more`` more times (an observable
    interval of at least ``more`` × 500 ms, not a sleep)."""
    now = int(page.locator("body").get_attribute("data-streams-polls") or 0)
    page.wait_for_function(
        "n => Number(document.body.dataset.streamsPolls || 0) >= n",
        arg=now + more,
        timeout=TIMEOUT_MS,
    )


def uninterrupted_answer(engine: EngineProcess, prompt: str, max_tokens: int) -> str:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    request = urllib.request.Request(
        engine.base_url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return str(answer["choices"][0]["message"]["content"])


def test_a_prompt_streams_tokens_into_the_pane(page: Page, exact_engine: EngineProcess) -> None:
    open_playground(page, exact_engine)
    pane = pane_of(page, 0)
    send(pane, FRANCE, max_tokens=24)
    expect(role(pane, "output")).not_to_be_empty()
    expect(pane).to_have_attribute("data-complete", "true")
    stream_id = stream_id_of(pane)
    expect(role(pane, "output")).to_have_text(uninterrupted_answer(exact_engine, FRANCE, 24))
    expect(role(pane, "stats")).to_contain_text("TTFT")
    expect(row_of(page, stream_id)).to_have_attribute("data-state", "done")


def test_pause_stops_tokens_and_resume_completes_the_same_text(
    page: Page, exact_engine: EngineProcess
) -> None:
    open_playground(page, exact_engine)
    pane = pane_of(page, 0)
    send(pane, STORY, max_tokens=24)
    wait_received(page, 0, 2)
    role(pane, "pause").click()
    expect(pane).to_have_attribute("data-state", "paused")
    stream_id = stream_id_of(pane)
    row = row_of(page, stream_id)
    expect(row).to_have_attribute("data-state", "paused")
    expect(row).to_have_attribute("data-pause-cause", "client")
    generated = exact_engine.stream(stream_id)["n_generated"]
    wait_received(page, 0, generated)  # what the engine made before pausing arrives
    wait_panel_polls(page, 3)
    assert exact_engine.stream(stream_id)["n_generated"] == generated
    assert int(pane.get_attribute("data-received") or 0) == generated
    assert exact_engine.stream(stream_id)["tokens_while_paused"] <= 1

    role(pane, "resume").click()
    expect(pane).to_have_attribute("data-complete", "true")
    assert generated < 24
    expect(role(pane, "output")).to_have_text(uninterrupted_answer(exact_engine, STORY, 24))
    expect(role(pane, "stats")).to_contain_text("pauses 1")


def test_drop_the_connection_detaches_and_the_stream_comes_back(
    page: Page, exact_engine: EngineProcess
) -> None:
    open_playground(page, exact_engine)
    pane = pane_of(page, 0)
    send(pane, STORY, max_tokens=160)
    wait_received(page, 0, 2)
    stream_id = stream_id_of(pane)
    role(pane, "drop").click()
    expect(pane).to_have_attribute("data-drops", "1")
    expect(pane).to_have_attribute("data-complete", "true")
    expect(role(pane, "output")).to_have_text(uninterrupted_answer(exact_engine, STORY, 160))
    expect(role(pane, "log")).to_contain_text("connection dropped: the stream is detached")
    expect(role(pane, "log")).to_contain_text("paused (disconnected)")
    assert exact_engine.events_of("detached", stream_id)
    resumed = exact_engine.events_of("resumed", stream_id)
    assert [line["cause"] for line in resumed] == ["disconnected"]


def test_a_paused_stream_stays_paused_through_a_drop(
    page: Page, exact_engine: EngineProcess
) -> None:
    """Paused by the user, then dropped: the server starts the new socket unpaused, so
    the page pauses it again at once; the user's resume then completes the text."""
    open_playground(page, exact_engine)
    pane = pane_of(page, 0)
    send(pane, STORY, max_tokens=48)
    wait_received(page, 0, 2)
    role(pane, "pause").click()
    stream_id = stream_id_of(pane)
    expect(row_of(page, stream_id)).to_have_attribute("data-pause-cause", "client")
    role(pane, "drop").click()
    expect(pane).to_have_attribute("data-drops", "1")
    log = role(pane, "log")
    # The log shows the newest line first: the pause sent after the resume comes first.
    expect(log).to_contain_text(re.compile(r"> pause[\s\S]*> resume after frame \d+"))
    expect(pane).not_to_have_attribute("data-complete", "true")
    role(pane, "resume").click()
    expect(pane).to_have_attribute("data-complete", "true")
    expect(role(pane, "output")).to_have_text(uninterrupted_answer(exact_engine, STORY, 48))
    expect(log).not_to_contain_text("not_paused")


def test_cancel_frees_the_streams_kv(page: Page, engine_server: EngineProcess) -> None:
    open_playground(page, engine_server)
    pane = pane_of(page, 0)
    send(pane, STORY, max_tokens=400)
    wait_received(page, 0, 3)
    stream_id = stream_id_of(pane)
    page.wait_for_function(  # the panel sees this stream's KV cursor
        "id => Number(document.querySelector(`#streams tr[data-stream-id='${id}'] td:nth-child(5)`)"
        "?.textContent || 0) > 0",
        arg=stream_id,
        timeout=TIMEOUT_MS,
    )
    kv_before = int(page.locator("#kv-text").get_attribute("data-kv-used") or 0)
    assert kv_before > 0
    role(pane, "cancel").click()
    expect(pane).to_have_attribute("data-state", "cancelled")
    page.wait_for_function(
        "before => Number(document.querySelector('#kv-text').dataset.kvUsed) < before",
        arg=kv_before,
        timeout=TIMEOUT_MS,
    )
    row = row_of(page, stream_id)
    expect(row).to_have_attribute("data-state", "cancelled")
    expect(row.locator("td").nth(4)).to_have_text("0")
    expect(row.locator("td").last).to_have_text("client")
    # The user's own Cancel is logged as a cancel, not as an error.
    expect(role(pane, "log")).to_contain_text("cancelled (client)")
    expect(role(pane, "log")).not_to_contain_text("error")


def test_the_kv_capacity_reads_as_in_top_and_the_banner(
    page: Page, engine_server: EngineProcess
) -> None:
    open_playground(page, engine_server)
    kv_text = page.locator("#kv-text")
    expect(kv_text).not_to_have_attribute("data-kv-budget", "")
    capacity = engine_server.debug_streams()["kv_budget_bytes"]
    assert kv_text.get_attribute("data-kv-budget") == str(capacity)
    expect(kv_text).to_have_text(re.compile(rf" / {re.escape(mib(capacity))} MiB$"))
    banner = next(line for line in engine_server.output if " on http://" in line)
    assert f"KV capacity {mib(capacity)} MiB" in banner


def test_a_slow_renderer_pauses_the_stream_by_itself(
    page: Page, engine_server: EngineProcess
) -> None:
    open_playground(page, engine_server)
    pane = pane_of(page, 0)
    send(pane, STORY, max_tokens=40, speed="0")  # stalled: slower than any engine
    stream_id = stream_id_of(pane)
    expect(pane).to_have_attribute("data-paused-by", "queue")
    row = row_of(page, stream_id)
    expect(row).to_have_attribute("data-state", "paused")
    expect(row).to_have_attribute("data-pause-cause", "client")
    expect(row.locator('[data-col="state"]')).to_have_text("paused (client)")
    role(pane, "render-speed").select_option("instant")  # the renderer catches up: RESUME
    expect(pane).to_have_attribute("data-complete", "true")
    expect(role(pane, "log")).to_contain_text("render queue at high watermark: PAUSE")
    expect(role(pane, "log")).to_contain_text("render queue at low watermark: RESUME")
    expect(page.locator("#t-pauses")).to_contain_text("client")


def test_regenerate_supersedes_the_running_stream(page: Page, engine_server: EngineProcess) -> None:
    open_playground(page, engine_server)
    pane = pane_of(page, 0)
    send(pane, STORY, max_tokens=300)
    wait_received(page, 0, 2)
    first = stream_id_of(pane)
    role(pane, "regenerate").click()
    expect(pane).not_to_have_attribute("data-stream-id", first)
    second = stream_id_of(pane)
    expect(role(pane, "log")).to_contain_text("superseded")
    expect(row_of(page, first).locator("td").last).to_have_text("superseded")
    session = role(pane, "session").input_value()
    assert engine_server.stream(second)["session"] == session
    role(pane, "cancel").click()
    expect(pane).to_have_attribute("data-state", "cancelled")


def test_two_panes_side_by_side(page: Page, engine_server: EngineProcess) -> None:
    """One slow renderer paused alone while the other pane streams on; this
    test's screenshot is the README's."""
    open_playground(page, engine_server)
    slow, fast = pane_of(page, 0), pane_of(page, 1)
    send(slow, STORY, max_tokens=200, speed="0")
    send(fast, "Write a poem about the sea.", max_tokens=200)
    slow_id, fast_id = stream_id_of(slow), stream_id_of(fast)
    expect(row_of(page, slow_id)).to_have_attribute("data-state", "paused")
    wait_received(page, 1, 12)
    expect(row_of(page, fast_id)).to_have_attribute("data-state", "decoding")
    wait_panel_polls(page, 1)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=ARTIFACTS / "two-panes.png", full_page=True)
    if os.environ.get("EDGE_LLM_DOCS_SCREENSHOT") == "1":
        shutil.copyfile(ARTIFACTS / "two-panes.png", README_SCREENSHOT)
    role(slow, "cancel").click()
    expect(slow).to_have_attribute("data-state", "cancelled")
    # The fast pane may have finished its answer meanwhile, its Cancel then disabled:
    # force skips the wait for an enabled button, and a disabled one ignores the click.
    role(fast, "cancel").click(force=True)
    expect(fast).to_have_attribute("data-state", re.compile(r"^(cancelled|done)$"))


def test_with_an_api_key_the_page_asks_for_it(page: Page, engine_factory: EngineFactory) -> None:
    engine = engine_factory("--api-key", "sk-play")
    page.goto(engine.url + "/")
    dialog = page.locator("#key-dialog")
    expect(dialog).to_be_visible()
    page.locator("#key-input").fill("sk-wrong")
    page.locator("#key-form button").click()
    expect(page.locator("#key-error")).to_have_text("That key was refused.")
    page.locator("#key-input").fill("sk-play")
    page.locator("#key-form button").click()
    expect(page.locator("body")).to_have_attribute("data-ready", "true")
    pane = pane_of(page, 0)
    send(pane, FRANCE, max_tokens=12)
    expect(pane).to_have_attribute("data-complete", "true")  # the WebSocket got the key
    expect(role(pane, "output")).not_to_be_empty()
    stream_id = stream_id_of(pane)
    expect(row_of(page, stream_id)).to_have_attribute("data-state", "done")
