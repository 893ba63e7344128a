/**
 * The client configuration: the seed's `edge_llm_client` JSON, read with the Python
 * SDK's keys, defaults and validation (`edge_llm.client.config`), so one file
 * drives both SDKs. Errors name the key: `edge_llm_client.retry.max_attempts: ...`.
 *
 * Precedence, lowest first: defaults (the seed's values), the JSON, `env`
 * (`EDGE_LLM_BASE_URL` / `_API_KEY` / `_MODEL`; `OPENAI_*` only when neither the JSON
 * nor an `EDGE_LLM_*` variable gives the value), `overrides` (the JSON's key names).
 */
import { ConfigError } from "./errors.js";

export const TOP_LEVEL_KEY = "edge_llm_client";
export const DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1";
export const DEFAULT_API_KEY = "sk-local";
export const RETRYABLE_CAUSES: ReadonlySet<string> = new Set([
  "ttft_timeout", "socket_eagain", "connect_error", "overloaded", "dead_connection",
  "read_error", "server_error", "http_status", "queue_full", "kv_budget_exceeded",
  "engine_unavailable", "backend_error",
]);

export interface RetryConfig {
  maxAttempts: number;
  backoffMs: number;
  retryOn: readonly string[];
  jitter: number;
  maxBackoffMs: number;
}

export interface ClientConfig {
  baseUrl: string;
  apiKey: string;
  modelId: string | null;
  stream: boolean;
  ttftWarnMs: number;
  ttftHardTimeoutMs: number;
  chunkIntervalMs: number;
  renderQueueHighWatermark: number;
  renderQueueLowWatermark: number;
  maxPromptTokens: number;
  /** Read and checked; platform sockets (fetch, WebSocket) cannot set their buffers. */
  socketSendBufferBytes: number;
  retry: RetryConfig;
  renderQueueCapacity: number;
  heartbeatIntervalMs: number;
  deadAfterHeartbeats: number;
  requireHeartbeat: boolean;
  connectTimeoutMs: number;
  maxTokens: number | null;
  temperature: number | null;
  trustEnv: boolean;
  resumable: boolean;
  resumeAttempts: number;
  /** Repairs made to what the user wrote (whitespace, slash, `/v1`), one line each. */
  notes: readonly string[];
}

type Check = (value: unknown) => string | null; // an error message, or null

const int = (min: number, max = Infinity): Check => (v) =>
  typeof v !== "number" || !Number.isInteger(v)
    ? "must be an integer"
    : v < min || v > max
      ? `must be ${max === Infinity ? `>= ${min}` : `between ${min} and ${max}`}`
      : null;
const num = (ok: (v: number) => boolean, bound: string): Check => (v) =>
  typeof v !== "number" || !Number.isFinite(v) ? "must be a number" : ok(v) ? null : `must be ${bound}`;
const bool: Check = (v) => (typeof v === "boolean" ? null : "must be true or false");
const str: Check = (v) => (typeof v === "string" ? null : "must be a string");
const orNull = (check: Check): Check => (v) => (v === null ? null : check(v));
const causes: Check = (v) => {
  if (!Array.isArray(v) || v.some((c) => typeof c !== "string")) return "must be a list of strings";
  const unknown = v.filter((c) => !RETRYABLE_CAUSES.has(c));
  return unknown.length
    ? `unknown retry cause(s) ${JSON.stringify(unknown)}; known: ${[...RETRYABLE_CAUSES].sort().join(", ")}`
    : null;
};

// key: [default, check, camelCase name]
const RETRY_KEYS: Record<string, [unknown, Check, keyof RetryConfig]> = {
  max_attempts: [2, int(1, 20), "maxAttempts"],
  backoff_ms: [500, int(0), "backoffMs"],
  retry_on: [["ttft_timeout", "socket_eagain"], causes, "retryOn"],
  jitter: [0.2, num((v) => v >= 0 && v <= 1, "between 0 and 1"), "jitter"],
  max_backoff_ms: [30000, int(0), "maxBackoffMs"],
};

const KEYS: Record<string, [unknown, Check, keyof ClientConfig]> = {
  base_url: [DEFAULT_BASE_URL, str, "baseUrl"],
  api_key: [DEFAULT_API_KEY, str, "apiKey"],
  model_id: [null, orNull((v) => str(v) ?? ((v as string).length ? null : "must not be empty")), "modelId"],
  stream: [true, bool, "stream"],
  ttft_warn_ms: [3000, int(0), "ttftWarnMs"],
  ttft_hard_timeout_ms: [10000, int(0), "ttftHardTimeoutMs"],
  chunk_interval_ms: [50, int(0), "chunkIntervalMs"],
  render_queue_high_watermark: [0.8, num((v) => v > 0 && v <= 1, "> 0 and <= 1"), "renderQueueHighWatermark"],
  render_queue_low_watermark: [0.3, num((v) => v >= 0 && v < 1, ">= 0 and < 1"), "renderQueueLowWatermark"],
  max_prompt_tokens: [512, int(1), "maxPromptTokens"],
  socket_send_buffer_bytes: [4096, int(0), "socketSendBufferBytes"],
  render_queue_capacity: [32, int(2, 65536), "renderQueueCapacity"],
  heartbeat_interval_ms: [1000, int(1), "heartbeatIntervalMs"],
  dead_after_heartbeats: [3, int(1), "deadAfterHeartbeats"],
  require_heartbeat: [false, bool, "requireHeartbeat"],
  connect_timeout_ms: [10000, int(1), "connectTimeoutMs"],
  max_tokens: [null, orNull(int(1)), "maxTokens"],
  temperature: [null, orNull(num((v) => v >= 0, ">= 0")), "temperature"],
  trust_env: [false, bool, "trustEnv"],
  resumable: [true, bool, "resumable"],
  resume_attempts: [5, int(0, 100), "resumeAttempts"],
};

const ENV = {
  base_url: ["EDGE_LLM_BASE_URL", "OPENAI_BASE_URL"],
  api_key: ["EDGE_LLM_API_KEY", "OPENAI_API_KEY"],
  model_id: ["EDGE_LLM_MODEL", "OPENAI_MODEL"],
} as const;

export interface LoadOptions {
  /** Environment variables (Node: `process.env`); none are read unless given. */
  env?: Record<string, string | undefined>;
  /** Values that win over the JSON, by its key names (`null`/`undefined`: ignored). */
  overrides?: Record<string, unknown>;
}

/**
 * The configuration from the seed's JSON (`{"edge_llm_client": {...}}`, which must
 * hold `base_url` and `model_id`), or the defaults when `json` is undefined.
 * Throws ConfigError naming the key. Repairs are in `notes` (and a console warning).
 */
export function loadClientConfig(json?: unknown, options: LoadOptions = {}): ClientConfig {
  const section = json === undefined ? {} : readSection(json);
  const values: Record<string, unknown> = { ...section };
  applyEnv(values, section, options.env ?? {});
  for (const [key, value] of Object.entries(options.overrides ?? {})) {
    if (value !== null && value !== undefined) values[key] = value;
  }
  const config = build(values);
  for (const note of config.notes) console.warn(`edge-llm client config: ${note}`);
  return config;
}

function readSection(json: unknown): Record<string, unknown> {
  const root = typeof json === "string" ? parseJson(json) : json;
  const section = isPlainObject(root) ? root[TOP_LEVEL_KEY] : undefined;
  if (!isPlainObject(section)) {
    throw new ConfigError(`client config must be an object with key '${TOP_LEVEL_KEY}'`, TOP_LEVEL_KEY);
  }
  for (const key of ["base_url", "model_id"]) {
    if (!(key in section)) {
      throw new ConfigError(`client config: missing required key ${TOP_LEVEL_KEY}.${key}`, key);
    }
  }
  return section;
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new ConfigError(`client config is not valid JSON: ${(error as Error).message}`);
  }
}

function applyEnv(values: Record<string, unknown>, section: Record<string, unknown>, env: LoadOptions["env"] & object): void {
  for (const [key, [override, fallback]] of Object.entries(ENV)) {
    if (env[override]) values[key] = env[override];
    else if (!(key in section) && env[fallback]) values[key] = env[fallback];
  }
}

function build(values: Record<string, unknown>): ClientConfig {
  const out: Record<string, unknown> = {};
  for (const key of Object.keys(values)) {
    if (!(key in KEYS) && key !== "retry") fail(key, "unknown key", values[key]);
  }
  for (const [key, [fallback, check, name]] of Object.entries(KEYS)) {
    const value = key in values ? values[key] : fallback;
    const problem = check(value);
    if (problem) fail(key, problem, value);
    out[name] = value;
  }
  out.retry = buildRetry(values.retry ?? {});
  const notes: string[] = [];
  out.baseUrl = normaliseBaseUrl(out.baseUrl as string, notes);
  out.apiKey = normaliseApiKey(out.apiKey as string, notes);
  out.notes = notes;
  const config = out as unknown as ClientConfig;
  if (config.renderQueueLowWatermark >= config.renderQueueHighWatermark) {
    throw new ConfigError(
      `${TOP_LEVEL_KEY}: render_queue_low_watermark must be below render_queue_high_watermark`,
      "render_queue_low_watermark",
    );
  }
  return config;
}

function buildRetry(retry: unknown): RetryConfig {
  if (!isPlainObject(retry)) fail("retry", "must be an object", retry);
  const out: Record<string, unknown> = {};
  for (const key of Object.keys(retry)) if (!(key in RETRY_KEYS)) fail(`retry.${key}`, "unknown key", retry[key]);
  for (const [key, [fallback, check, name]] of Object.entries(RETRY_KEYS)) {
    const value = key in retry ? retry[key] : fallback;
    const problem = check(value);
    if (problem) fail(`retry.${key}`, problem, value);
    out[name] = Array.isArray(value) ? [...value] : value;
  }
  return out as unknown as RetryConfig;
}

function fail(key: string, problem: string, got: unknown): never {
  throw new ConfigError(`client config: ${TOP_LEVEL_KEY}.${key}: ${problem} (got ${JSON.stringify(got)})`, key);
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/** The canonical base URL (ending in `/v1` unless it has another path); repairs go to `notes`. */
export function normaliseBaseUrl(url: string, notes: string[] = []): string {
  const stripped = url.trim();
  if (stripped !== url) notes.push("base_url had surrounding whitespace; trimmed");
  const match = /^(https?):\/\/([^/?#]+)([^?#]*)$/.exec(stripped);
  if (!match) {
    const why = /[?#]/.test(stripped) && /^https?:\/\//.test(stripped)
      ? "must not have a query or fragment" : "must be an http:// or https:// URL";
    throw new ConfigError(`client config: ${TOP_LEVEL_KEY}.base_url ${why}, got ${JSON.stringify(url)}`, "base_url");
  }
  let path = match[3];
  if (path.endsWith("/") && path.replace(/\/+/g, "")) notes.push("base_url had a trailing slash; removed");
  path = path.replace(/\/+$/, "");
  if (path.endsWith("/v1/v1")) {
    notes.push("base_url had a doubled /v1; collapsed to one");
    while (path.endsWith("/v1/v1")) path = path.slice(0, -3);
  }
  return `${match[1]}://${match[2]}${path || "/v1"}`;
}

/** The key without stray whitespace or a pasted `Bearer ` prefix. */
export function normaliseApiKey(key: string, notes: string[] = []): string {
  let trimmed = key.trim();
  if (trimmed !== key) notes.push("api_key had leading/trailing whitespace; trimmed");
  if (trimmed.toLowerCase().startsWith("bearer ")) {
    notes.push("api_key started with 'Bearer '; removed (the client adds it)");
    trimmed = trimmed.slice(7).trim();
  }
  return trimmed;
}
