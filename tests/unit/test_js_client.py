"""The JavaScript client (clients/js): its own unit tests (Node's runner), the playground
bundle committed in the package, and one seed JSON read alike by both SDKs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edge_llm.client import ConfigError, load_client_config
from edge_llm.client.config import ClientConfig
from js_client import PACKAGE, ROOT, check, node_flags, run

SEED = ROOT / "src" / "edge_llm" / "configs" / "client.json"
# Loads what stdin holds with the built package; prints the config in the JSON's names.
LOAD = """
import { loadClientConfig } from "./dist/index.js";
const snake = (o) => Object.fromEntries(Object.entries(o).map(([k, v]) => [
  k.replace(/[A-Z]/g, (c) => "_" + c.toLowerCase()),
  v && typeof v === "object" && !Array.isArray(v) ? snake(v) : v,
]));
const load = (json) => {
  try {
    const { notes, ...config } = loadClientConfig(json);
    return { config: snake(config) };
  } catch (error) {
    return { field: error.field, message: error.message };
  }
};
let input = "";
for await (const part of process.stdin) input += part;
console.log(JSON.stringify(JSON.parse(input).map(load)));
"""


def js_load(*jsons: object) -> list[dict[str, Any]]:
    """What the JS client's loadClientConfig makes of each JSON (one node process)."""
    result = run("node", "--input-type=module", "-e", LOAD, stdin_text=json.dumps(jsons))
    return list(json.loads(check(result)))


def test_the_js_unit_tests_pass() -> None:
    """`npm test`: builds the package, then Node's test runner (render queue, SSE cases,
    retry timing on a fake clock, WS/SSE flow control with scripted transports, size)."""
    output = check(run("npm", "test", "--silent"))
    assert "# fail 0" in output
    assert "@edge-llm/client:" in output  # the size test ran and said the size


def test_the_committed_playground_bundle_is_current() -> None:
    check(run("node", "scripts/bundle.mjs", "--check"))
    bundle = (ROOT / "src" / "edge_llm" / "server" / "playground" / "app.js").read_text("utf-8")
    assert "new WebSocket" not in bundle  # the page opens sockets through the SDK only


def test_the_seed_json_drives_both_sdks_alike() -> None:
    seed = json.loads(SEED.read_text("utf-8"))
    js = js_load(seed)[0]["config"]
    python = load_client_config(SEED).model_dump(mode="json")
    python["retry"]["retry_on"] = list(python["retry"]["retry_on"])
    assert js == python
    assert set(js) == set(ClientConfig.model_fields)


BAD = [
    {"ttft_warn_ms": -1},
    {"ttft_hard_timeout_ms": "10"},
    {"render_queue_high_watermark": 1.5},
    {"render_queue_low_watermark": 0.9},
    {"retry": {"max_attempts": 0}},
    {"retry": {"retry_on": ["sometimes"]}},
    {"retry": {"backof_ms": 1}},
    {"colour": "red"},
    {"base_url": "ftp://x"},
    {"stream": "yes"},
    {"model_id": ""},
    {"render_queue_capacity": 1},
]


def test_a_bad_key_is_named_by_both_sdks(tmp_path: Path) -> None:
    sections = [{"base_url": "http://h:1", "model_id": "m", **fields} for fields in BAD]
    answers = js_load(*({"edge_llm_client": section} for section in sections))
    for fields, section, js in zip(BAD, sections, answers, strict=True):
        path = tmp_path / "client.json"
        path.write_text(json.dumps({"edge_llm_client": section}), "utf-8")
        with pytest.raises(ConfigError) as python:
            load_client_config(path, env={})
        assert "field" in js, (fields, js)
        key = next(iter(fields))
        if python.value.field is None:  # a rule across keys: the Python SDK names it in words
            assert key in str(python.value)
            assert js["field"] == key
        else:
            assert js["field"] == python.value.field, (js, python.value)
        assert key in js["message"]


def test_the_package_exports_only_built_files() -> None:
    manifest = json.loads((PACKAGE / "package.json").read_text("utf-8"))
    assert manifest["files"] == ["dist"]
    assert manifest["type"] == "module"
    assert not manifest.get("dependencies"), "no runtime dependencies"
    assert set(manifest["devDependencies"]) == {"typescript", "esbuild"}
    assert node_flags() in ([], ["--experimental-websocket"])
