import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { ConfigError, loadClientConfig } from "../dist/index.js";

const seed = JSON.parse(readFileSync(new URL("../../../src/edge_llm/configs/client.json", import.meta.url), "utf8"));
const quiet = { warn: console.warn };
const withSection = (fields) => ({ edge_llm_client: { base_url: "http://h:1", model_id: "m", ...fields } });

test("the seed's JSON loads verbatim, with the Python SDK's defaults for the rest", () => {
  const config = loadClientConfig(seed);
  assert.equal(config.baseUrl, "http://127.0.0.1:8000/v1");
  assert.equal(config.modelId, "SmolLM2-135M-Instruct");
  assert.equal(config.ttftHardTimeoutMs, 10000);
  assert.deepEqual(config.retry, { maxAttempts: 2, backoffMs: 500, retryOn: ["ttft_timeout", "socket_eagain"], jitter: 0.2, maxBackoffMs: 30000 });
  assert.equal(config.renderQueueCapacity, 32);
  assert.equal(config.resumable, true);
  assert.deepEqual(config.notes, []);
});

test("errors name the key", () => {
  const cases = [
    [{ ttft_warn_ms: -1 }, "ttft_warn_ms", /must be >= 0/],
    [{ ttft_hard_timeout_ms: "10" }, "ttft_hard_timeout_ms", /must be an integer/],
    [{ render_queue_high_watermark: 1.5 }, "render_queue_high_watermark", /> 0 and <= 1/],
    [{ render_queue_low_watermark: 0.9 }, "render_queue_low_watermark", /below/],
    [{ retry: { max_attempts: 0 } }, "retry.max_attempts", /between 1 and 20/],
    [{ retry: { retry_on: ["sometimes"] } }, "retry.retry_on", /unknown retry cause/],
    [{ retry: { backof_ms: 1 } }, "retry.backof_ms", /unknown key/],
    [{ colour: "red" }, "colour", /unknown key/],
    [{ base_url: "ftp://x" }, "base_url", /http:\/\/ or https:\/\//],
    [{ stream: "yes" }, "stream", /true or false/],
  ];
  for (const [fields, key, message] of cases) {
    assert.throws(() => loadClientConfig(withSection(fields)), (error) => {
      assert.ok(error instanceof ConfigError);
      assert.equal(error.field, key);
      assert.match(error.message, message);
      assert.match(error.message, new RegExp(`edge_llm_client[.: ]`));
      return true;
    });
  }
  assert.throws(() => loadClientConfig({ edge_llm_client: { base_url: "http://h" } }), /missing required key edge_llm_client.model_id/);
  assert.throws(() => loadClientConfig({ other: {} }), /must be an object with key 'edge_llm_client'/);
  assert.throws(() => loadClientConfig("{not json"), /not valid JSON/);
});

test("base_url and key are repaired and the repairs reported", () => {
  const warnings = [];
  const original = console.warn;
  console.warn = (m) => warnings.push(m);
  try {
    const config = loadClientConfig(withSection({ base_url: " http://h:1/v1/v1/ ", api_key: " Bearer sk-x " }));
    assert.equal(config.baseUrl, "http://h:1/v1");
    assert.equal(config.apiKey, "sk-x");
    assert.equal(config.notes.length, 5);
    assert.equal(warnings.length, 5);
    assert.equal(loadClientConfig(withSection({ base_url: "http://h:1" })).baseUrl, "http://h:1/v1");
    assert.equal(loadClientConfig(withSection({ base_url: "https://h/api/v1" })).baseUrl, "https://h/api/v1");
  } finally {
    console.warn = original;
  }
  void quiet;
});

test("env and overrides win over the JSON, OPENAI_* only as a fallback", () => {
  const env = { EDGE_LLM_BASE_URL: "http://e:2", OPENAI_API_KEY: "sk-openai", OPENAI_MODEL: "other" };
  const config = loadClientConfig(seed, { env, overrides: { max_tokens: 16, model_id: null } });
  assert.equal(config.baseUrl, "http://e:2/v1");
  assert.equal(config.apiKey, "sk-local"); // the JSON gives it: no fallback
  assert.equal(config.modelId, "SmolLM2-135M-Instruct");
  assert.equal(config.maxTokens, 16);
  const defaults = loadClientConfig(undefined, { env });
  assert.equal(defaults.apiKey, "sk-openai");
  assert.equal(defaults.modelId, "other");
});
