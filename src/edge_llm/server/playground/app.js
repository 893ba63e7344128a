// Built by `npm run bundle` in clients/js from clients/js/playground/app.js and the
// @edge-llm/client sources: do not edit (a test checks that this file is current).
"use strict";
(() => {
  // src/errors.ts
  var ClientError = class extends Error {
    code = "client_error";
    /** The code the server gave, when the error came from the server. */
    get serverCode() {
      return null;
    }
    constructor(message) {
      super(message);
      this.name = new.target.name;
    }
  };
  var ConfigError = class extends ClientError {
    constructor(message, field = null) {
      super(message);
      this.field = field;
    }
    code = "config_error";
  };
  var TransportError = class extends ClientError {
    code = "transport_error";
  };
  var ConnectError = class extends TransportError {
    code = "connect_error";
  };
  var ReadError = class extends TransportError {
    code = "read_error";
  };
  var StreamTimeoutError = class extends TransportError {
    constructor(message, elapsedMs) {
      super(message);
      this.elapsedMs = elapsedMs;
    }
    code = "timeout";
  };
  var TtftTimeoutError = class extends StreamTimeoutError {
    code = "ttft_timeout";
  };
  var DeadConnectionError = class extends StreamTimeoutError {
    code = "dead_connection";
  };
  var HTTPStatusError = class extends ClientError {
    constructor(message, status, server = null, error = {}) {
      super(message);
      this.status = status;
      this.server = server;
      this.error = error;
    }
    code = "http_status";
    get serverCode() {
      return this.server;
    }
  };
  var OverloadedError = class extends HTTPStatusError {
    constructor(message, serverCode = null, error = {}, retryAfterMs2 = null) {
      super(message, 503, serverCode, error);
      this.retryAfterMs = retryAfterMs2;
    }
    code = "overloaded";
  };
  var ServerStreamError = class _ServerStreamError extends ClientError {
    constructor(message, server, error = {}) {
      super(message);
      this.server = server;
      this.error = error;
    }
    code = "server_error";
    get serverCode() {
      return this.server;
    }
    /** From the value of an `"error"` key or a WebSocket `error` frame. */
    static fromPayload(payload) {
      if (payload !== null && typeof payload === "object") {
        const body = payload;
        const code = body.code ?? body.type;
        const message = String(body.message || "server error");
        return new _ServerStreamError(message, code == null ? null : String(code), body);
      }
      return new _ServerStreamError(String(payload), null, { message: String(payload) });
    }
  };
  var ProtocolError = class extends ClientError {
    code = "protocol_error";
  };
  var NotStreamingError = class extends ProtocolError {
    code = "not_streaming";
  };
  var MalformedChunkError = class extends ProtocolError {
    code = "malformed_chunk";
  };
  var EventTooLargeError = class extends ProtocolError {
    code = "event_too_large";
  };

  // src/config.ts
  var TOP_LEVEL_KEY = "edge_llm_client";
  var DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1";
  var DEFAULT_API_KEY = "sk-local";
  var RETRYABLE_CAUSES = /* @__PURE__ */ new Set([
    "ttft_timeout",
    "socket_eagain",
    "connect_error",
    "overloaded",
    "dead_connection",
    "read_error",
    "server_error",
    "http_status",
    "queue_full",
    "kv_budget_exceeded",
    "engine_unavailable",
    "backend_error"
  ]);
  var int = (min, max = Infinity) => (v) => typeof v !== "number" || !Number.isInteger(v) ? "must be an integer" : v < min || v > max ? `must be ${max === Infinity ? `>= ${min}` : `between ${min} and ${max}`}` : null;
  var num = (ok, bound) => (v) => typeof v !== "number" || !Number.isFinite(v) ? "must be a number" : ok(v) ? null : `must be ${bound}`;
  var bool = (v) => typeof v === "boolean" ? null : "must be true or false";
  var str = (v) => typeof v === "string" ? null : "must be a string";
  var orNull = (check) => (v) => v === null ? null : check(v);
  var causes = (v) => {
    if (!Array.isArray(v) || v.some((c) => typeof c !== "string")) return "must be a list of strings";
    const unknown = v.filter((c) => !RETRYABLE_CAUSES.has(c));
    return unknown.length ? `unknown retry cause(s) ${JSON.stringify(unknown)}; known: ${[...RETRYABLE_CAUSES].sort().join(", ")}` : null;
  };
  var RETRY_KEYS = {
    max_attempts: [2, int(1, 20), "maxAttempts"],
    backoff_ms: [500, int(0), "backoffMs"],
    retry_on: [["ttft_timeout", "socket_eagain"], causes, "retryOn"],
    jitter: [0.2, num((v) => v >= 0 && v <= 1, "between 0 and 1"), "jitter"],
    max_backoff_ms: [3e4, int(0), "maxBackoffMs"]
  };
  var KEYS = {
    base_url: [DEFAULT_BASE_URL, str, "baseUrl"],
    api_key: [DEFAULT_API_KEY, str, "apiKey"],
    model_id: [null, orNull((v) => str(v) ?? (v.length ? null : "must not be empty")), "modelId"],
    stream: [true, bool, "stream"],
    ttft_warn_ms: [3e3, int(0), "ttftWarnMs"],
    ttft_hard_timeout_ms: [1e4, int(0), "ttftHardTimeoutMs"],
    chunk_interval_ms: [50, int(0), "chunkIntervalMs"],
    render_queue_high_watermark: [0.8, num((v) => v > 0 && v <= 1, "> 0 and <= 1"), "renderQueueHighWatermark"],
    render_queue_low_watermark: [0.3, num((v) => v >= 0 && v < 1, ">= 0 and < 1"), "renderQueueLowWatermark"],
    max_prompt_tokens: [512, int(1), "maxPromptTokens"],
    socket_send_buffer_bytes: [4096, int(0), "socketSendBufferBytes"],
    render_queue_capacity: [32, int(2, 65536), "renderQueueCapacity"],
    heartbeat_interval_ms: [1e3, int(1), "heartbeatIntervalMs"],
    dead_after_heartbeats: [3, int(1), "deadAfterHeartbeats"],
    require_heartbeat: [false, bool, "requireHeartbeat"],
    connect_timeout_ms: [1e4, int(1), "connectTimeoutMs"],
    max_tokens: [null, orNull(int(1)), "maxTokens"],
    temperature: [null, orNull(num((v) => v >= 0, ">= 0")), "temperature"],
    trust_env: [false, bool, "trustEnv"],
    resumable: [true, bool, "resumable"],
    resume_attempts: [5, int(0, 100), "resumeAttempts"]
  };
  var ENV = {
    base_url: ["EDGE_LLM_BASE_URL", "OPENAI_BASE_URL"],
    api_key: ["EDGE_LLM_API_KEY", "OPENAI_API_KEY"],
    model_id: ["EDGE_LLM_MODEL", "OPENAI_MODEL"]
  };
  function loadClientConfig(json, options = {}) {
    const section = json === void 0 ? {} : readSection(json);
    const values = { ...section };
    applyEnv(values, section, options.env ?? {});
    for (const [key, value] of Object.entries(options.overrides ?? {})) {
      if (value !== null && value !== void 0) values[key] = value;
    }
    const config = build(values);
    for (const note of config.notes) console.warn(`edge-llm client config: ${note}`);
    return config;
  }
  function readSection(json) {
    const root = typeof json === "string" ? parseJson(json) : json;
    const section = isPlainObject(root) ? root[TOP_LEVEL_KEY] : void 0;
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
  function parseJson(text) {
    try {
      return JSON.parse(text);
    } catch (error) {
      throw new ConfigError(`client config is not valid JSON: ${error.message}`);
    }
  }
  function applyEnv(values, section, env) {
    for (const [key, [override, fallback]] of Object.entries(ENV)) {
      if (env[override]) values[key] = env[override];
      else if (!(key in section) && env[fallback]) values[key] = env[fallback];
    }
  }
  function build(values) {
    const out = {};
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
    const notes = [];
    out.baseUrl = normaliseBaseUrl(out.baseUrl, notes);
    out.apiKey = normaliseApiKey(out.apiKey, notes);
    out.notes = notes;
    const config = out;
    if (config.renderQueueLowWatermark >= config.renderQueueHighWatermark) {
      throw new ConfigError(
        `${TOP_LEVEL_KEY}: render_queue_low_watermark must be below render_queue_high_watermark`,
        "render_queue_low_watermark"
      );
    }
    return config;
  }
  function buildRetry(retry) {
    if (!isPlainObject(retry)) fail("retry", "must be an object", retry);
    const out = {};
    for (const key of Object.keys(retry)) if (!(key in RETRY_KEYS)) fail(`retry.${key}`, "unknown key", retry[key]);
    for (const [key, [fallback, check, name]] of Object.entries(RETRY_KEYS)) {
      const value = key in retry ? retry[key] : fallback;
      const problem = check(value);
      if (problem) fail(`retry.${key}`, problem, value);
      out[name] = Array.isArray(value) ? [...value] : value;
    }
    return out;
  }
  function fail(key, problem, got) {
    throw new ConfigError(`client config: ${TOP_LEVEL_KEY}.${key}: ${problem} (got ${JSON.stringify(got)})`, key);
  }
  function isPlainObject(value) {
    return value !== null && typeof value === "object" && !Array.isArray(value);
  }
  function normaliseBaseUrl(url, notes = []) {
    const stripped = url.trim();
    if (stripped !== url) notes.push("base_url had surrounding whitespace; trimmed");
    const match = /^(https?):\/\/([^/?#]+)([^?#]*)$/.exec(stripped);
    if (!match) {
      const why = /[?#]/.test(stripped) && /^https?:\/\//.test(stripped) ? "must not have a query or fragment" : "must be an http:// or https:// URL";
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
  function normaliseApiKey(key, notes = []) {
    let trimmed = key.trim();
    if (trimmed !== key) notes.push("api_key had leading/trailing whitespace; trimmed");
    if (trimmed.toLowerCase().startsWith("bearer ")) {
      notes.push("api_key started with 'Bearer '; removed (the client adds it)");
      trimmed = trimmed.slice(7).trim();
    }
    return trimmed;
  }

  // src/clock.ts
  var systemClock = {
    now: () => performance.now(),
    setTimeout: (fn, ms2) => setTimeout(fn, ms2),
    clearTimeout: (handle) => clearTimeout(handle)
  };
  function sleep(clock, ms2, signal) {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      const onAbort = () => {
        clock.clearTimeout(handle);
        reject(signal?.reason);
      };
      const handle = clock.setTimeout(() => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      }, ms2);
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  // src/retry.ts
  var RetryPolicy = class {
    /** `random` returns [0, 1) (Math.random unless a test fixes it). */
    constructor(config, random = Math.random) {
      this.config = config;
      this.random = random;
    }
    causeOf(error) {
      if (error instanceof HTTPStatusError && error.status >= 400 && error.status < 500) return null;
      for (const code of [error.code, error.serverCode]) {
        if (code !== null && this.config.retryOn.includes(code)) return code;
      }
      return null;
    }
    /** After attempt `attempt` (1-based) failed with `error`: the retry, or null. */
    decide(error, attempt, delivered) {
      if (delivered || attempt >= this.config.maxAttempts) return null;
      const cause = this.causeOf(error);
      if (cause === null) return null;
      return { nextAttempt: attempt + 1, delayMs: this.backoffMs(attempt, error), cause };
    }
    backoffMs(attempt, error) {
      const { backoffMs, jitter, maxBackoffMs } = this.config;
      let delay = backoffMs * 2 ** (attempt - 1) * (1 + jitter * (2 * this.random() - 1));
      if (error instanceof OverloadedError && error.retryAfterMs !== null) {
        delay = Math.max(delay, error.retryAfterMs);
      }
      return Math.min(delay, maxBackoffMs);
    }
  };

  // src/watchdog.ts
  var Watchdog = class {
    constructor(start, ttftWarnMs, ttftHardMs, deadAfterMs) {
      this.start = start;
      this.ttftWarnMs = ttftWarnMs;
      this.ttftHardMs = ttftHardMs;
      this.deadAfterMs = deadAfterMs;
      this.lastActivity = start;
    }
    armed = false;
    warned = false;
    gotToken = false;
    lastActivity;
    /** The request went out at `now` (a WebSocket's start frame): TTFT counts from here. */
    restart(now) {
      this.start = now;
      this.lastActivity = now;
    }
    arm() {
      this.armed = true;
    }
    /** Bytes came, or the reader deliberately did not read until `now`. */
    touch(now) {
      this.lastActivity = now;
    }
    firstToken() {
      this.gotToken = true;
    }
    deadlines() {
      const out = [];
      if (!this.gotToken && this.ttftWarnMs > 0 && !this.warned) out.push([this.start + this.ttftWarnMs, "ttft_warn"]);
      if (!this.gotToken && this.ttftHardMs > 0) out.push([this.start + this.ttftHardMs, "ttft_timeout"]);
      if (this.armed && this.deadAfterMs > 0) out.push([this.lastActivity + this.deadAfterMs, "dead_connection"]);
      return out;
    }
    /** How long the next wait may last (>= 0), or null for no limit. */
    msLeft(now) {
      const deadlines = this.deadlines();
      if (deadlines.length === 0) return null;
      return Math.max(0, Math.min(...deadlines.map(([at]) => at)) - now);
    }
    /** The deadline passed by `now`, the hard ones first; "ttft_warn" marks the warning given. */
    expired(now) {
      const passed = new Set(this.deadlines().filter(([at]) => at <= now).map(([, kind]) => kind));
      for (const kind of ["ttft_timeout", "dead_connection", "ttft_warn"]) {
        if (passed.has(kind)) {
          if (kind === "ttft_warn") this.warned = true;
          return kind;
        }
      }
      return null;
    }
  };

  // src/attempt.ts
  function heartbeatOf(progress) {
    const int2 = (v) => typeof v === "number" && Number.isInteger(v) ? v : null;
    return {
      state: typeof progress.state === "string" ? progress.state : null,
      prefillDone: int2(progress.prefill_done),
      prefillTotal: int2(progress.prefill_total),
      queuePosition: int2(progress.queue_position),
      predictedWaitMs: int2(progress.predicted_wait_ms)
    };
  }
  var Attempt = class {
    constructor(number, config, host) {
      this.number = number;
      this.host = host;
      this.start = host.clock.now();
      this.watchdog = new Watchdog(
        this.start,
        config.ttftWarnMs,
        config.ttftHardTimeoutMs,
        config.heartbeatIntervalMs * config.deadAfterHeartbeats
      );
      if (config.requireHeartbeat) this.watchdog.arm();
    }
    start;
    watchdog;
    requestId = null;
    firstDataAt = null;
    firstTokenAt = null;
    lastTokenAt = null;
    itlMs = [];
    parts = [];
    nChunks = 0;
    nServerTokens = 0;
    finishReason = null;
    usage = null;
    serverStats = null;
    serverPauses = [];
    elapsedMs() {
      return this.host.clock.now() - this.start;
    }
    /**
     * `promise` under the deadlines: a TTFT warning is reported and the wait goes on;
     * the hard time-out throws TtftTimeoutError, a silent armed connection
     * DeadConnectionError, the stream's abort its reason.
     */
    async wait(promise) {
      promise.catch(() => void 0);
      for (; ; ) {
        const left = this.watchdog.msLeft(this.host.clock.now());
        const outcome = await race(promise, left, this.host.clock, this.host.signal);
        if (outcome.done) return outcome.value;
        this.deadlinePassed();
      }
    }
    /** `promise` under the stream's abort only (a connect has its own time-out). */
    async waitUndeadlined(promise) {
      const outcome = await race(promise, null, this.host.clock, this.host.signal);
      return outcome.value;
    }
    deadlinePassed() {
      const now = this.host.clock.now();
      const kind = this.watchdog.expired(now);
      const elapsed = Math.round(now - this.watchdog.start);
      if (kind === "ttft_warn") {
        this.host.emit("ttft_warn", { elapsed_ms: elapsed });
        this.host.ttftWarn(elapsed);
      } else if (kind === "ttft_timeout") {
        throw new TtftTimeoutError(`no first token after ${elapsed} ms`, elapsed);
      } else if (kind === "dead_connection") {
        const silent = Math.round(now - this.watchdog.lastActivity);
        throw new DeadConnectionError(`no byte from the server for ${silent} ms (heartbeats stopped)`, silent);
      }
    }
    setRequestId(id) {
      if (typeof id === "string" && id && this.requestId === null) this.requestId = id;
    }
    onBytes() {
      this.watchdog.touch(this.host.clock.now());
    }
    onData() {
      this.firstDataAt ??= this.host.clock.now();
    }
    onHeartbeat(beat) {
      this.watchdog.arm();
      this.host.heartbeat(beat);
    }
    /** A content chunk: into the render queue (waiting there for room when `wait`). */
    async onContent(text, nTokens, wait) {
      if (!text) return;
      const now = this.host.clock.now();
      if (this.firstTokenAt === null) {
        this.firstTokenAt = now;
        this.watchdog.firstToken();
        this.host.emit("first_token", { ttft_ms: round(now - this.start) });
      } else if (this.lastTokenAt !== null) {
        this.itlMs.push(round(now - this.lastTokenAt));
      }
      this.lastTokenAt = now;
      this.nChunks++;
      this.nServerTokens += nTokens;
      this.parts.push(text);
      this.host.emit("delta", { text, n_tokens: nTokens || 1 });
      await this.host.deliver(text, wait);
      this.watchdog.touch(this.host.clock.now());
    }
    onUsage(usage) {
      if (usage !== null && typeof usage === "object") this.usage = usage;
    }
    onFinish(reason) {
      if (typeof reason === "string") this.finishReason = reason;
    }
    /** Completion tokens: usage, else the server's per-delta counts, else chunks. */
    get nTokens() {
      const fromUsage = this.usage?.completion_tokens;
      return typeof fromUsage === "number" ? fromUsage : this.nServerTokens || this.nChunks;
    }
    msSinceStart(at) {
      return at === null ? null : round(at - this.start);
    }
  };
  function round(ms2) {
    return Math.round(ms2 * 1e3) / 1e3;
  }
  function race(promise, ms2, clock, signal) {
    return new Promise((resolve, reject) => {
      if (signal.aborted) return reject(signal.reason);
      let timer = null;
      const finish = () => {
        if (timer !== null) clock.clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
      };
      const onAbort = () => {
        finish();
        reject(signal.reason);
      };
      signal.addEventListener("abort", onAbort, { once: true });
      if (ms2 !== null) {
        timer = clock.setTimeout(() => {
          finish();
          resolve({ done: false });
        }, ms2);
      }
      promise.then(
        (value) => {
          finish();
          resolve({ done: true, value });
        },
        (error) => {
          finish();
          reject(error);
        }
      );
    });
  }

  // src/resuming.ts
  var ResumingTransport = class {
    // the number of the last event taken
    constructor(spec) {
      this.spec = spec;
    }
    streamId = null;
    // set when the server made the stream resumable
    lastN = 0;
    /** Whether the event numbered `n` was taken before (a replay): skip it. */
    seen(n) {
      if (n <= this.lastN) return true;
      this.lastN = n;
      return false;
    }
    async readResuming(attempt) {
      let tries = 0;
      let taken = this.lastN;
      for (; ; ) {
        try {
          if (tries) await this.resumeTry(attempt, tries);
          await this.read(attempt);
          return;
        } catch (error) {
          if (!(error instanceof ReadError || error instanceof DeadConnectionError || error instanceof ConnectError)) {
            throw error;
          }
          tries = this.lastN > taken ? 1 : tries + 1;
          taken = this.lastN;
          if (this.streamId === null || tries > this.spec.resumeAttempts) throw error;
        }
      }
    }
    async resumeTry(attempt, tries) {
      const delay = this.spec.resumeBackoff(tries);
      attempt.host.emit("retry", {
        attempt: attempt.number,
        backoff_ms: Math.round(delay),
        cause: "resume",
        stream_id: this.streamId,
        last_event: this.lastN
      });
      await sleep(attempt.host.clock, delay, attempt.host.signal);
      attempt.watchdog.touch(attempt.host.clock.now());
      await this.reopen(attempt);
    }
  };
  function asClientError(error, signal, make) {
    if (error instanceof ClientError || signal.aborted) return error;
    const cause = error?.cause?.message;
    return make(`${error?.message ?? String(error)}${cause ? ` (${cause})` : ""}`);
  }

  // src/sse.ts
  var LF = 10;
  var CR = 13;
  var utf8 = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
  var SSEParser = class {
    constructor(maxLineBytes = 1 << 20, maxEventBytes = 4 << 20) {
      this.maxLineBytes = maxLineBytes;
      this.maxEventBytes = maxEventBytes;
    }
    comments = 0;
    retryMs = null;
    partial = [];
    partialBytes = 0;
    skipLf = false;
    firstLine = true;
    data = [];
    dataBytes = 0;
    eventType = null;
    lastId = null;
    /** Consume one read; the events it completed. Throws EventTooLargeError. */
    feed(bytes) {
      const events = [];
      let start = 0;
      if (this.skipLf && bytes.length > 0) {
        this.skipLf = false;
        if (bytes[0] === LF) start = 1;
      }
      for (let i = start; i < bytes.length; i++) {
        const b = bytes[i];
        if (b !== LF && b !== CR) continue;
        this.append(bytes.subarray(start, i));
        if (b === CR) {
          if (i + 1 === bytes.length) this.skipLf = true;
          else if (bytes[i + 1] === LF) i++;
        }
        start = i + 1;
        const event = this.takeLine();
        if (event) events.push(event);
      }
      this.append(bytes.subarray(start));
      return events;
    }
    /** End of stream: a pending line, and a last event that lacks its blank line. */
    close() {
      const events = [];
      if (this.partialBytes > 0) {
        const event = this.takeLine();
        if (event) events.push(event);
      }
      const last = this.dispatch();
      if (last) events.push(last);
      return events;
    }
    append(chunk) {
      if (chunk.length === 0) return;
      this.partialBytes += chunk.length;
      if (this.partialBytes > this.maxLineBytes) {
        throw new EventTooLargeError(`SSE line longer than ${this.maxLineBytes} bytes`);
      }
      this.partial.push(chunk.slice());
    }
    takeLine() {
      let line = decodeAll(this.partial, this.partialBytes);
      this.partial = [];
      this.partialBytes = 0;
      if (this.firstLine) {
        this.firstLine = false;
        if (line.startsWith("\uFEFF")) line = line.slice(1);
      }
      if (line === "") return this.dispatch();
      this.field(line);
      return null;
    }
    field(line) {
      if (line.startsWith(":")) {
        this.comments++;
        return;
      }
      const colon = line.indexOf(":");
      const name = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (name === "data") this.appendData(value);
      else if (name === "event") this.eventType = value;
      else if (name === "id" && !value.includes("\0")) this.lastId = value;
      else if (name === "retry" && /^[0-9]+$/.test(value)) this.retryMs = Number(value);
    }
    appendData(value) {
      this.dataBytes += value.length + 1;
      if (this.dataBytes > this.maxEventBytes) {
        throw new EventTooLargeError(`SSE event data larger than ${this.maxEventBytes} bytes`);
      }
      this.data.push(value);
    }
    dispatch() {
      const event = this.eventType;
      this.eventType = null;
      if (this.data.length === 0) return null;
      const data = this.data.join("\n");
      this.data = [];
      this.dataBytes = 0;
      return { event: event || null, data, id: this.lastId };
    }
  };
  function decodeAll(chunks, total2) {
    if (chunks.length === 1) return utf8.decode(chunks[0]);
    const joined = new Uint8Array(total2);
    let at = 0;
    for (const chunk of chunks) {
      joined.set(chunk, at);
      at += chunk.length;
    }
    return utf8.decode(joined);
  }
  function parseChunk(event) {
    if (event.data.trim() === "[DONE]") return null;
    const obj = decodeObject(event.data);
    if (obj.error || event.event === "error") throw ServerStreamError.fromPayload(obj.error || obj);
    const choices = obj.choices;
    const choice = Array.isArray(choices) && isObject(choices[0]) ? choices[0] : {};
    const delta = isObject(choice.delta) ? choice.delta : {};
    const content = delta.content ?? choice.text;
    return {
      id: typeof obj.id === "string" ? obj.id : null,
      content: typeof content === "string" ? content : "",
      finishReason: typeof choice.finish_reason === "string" ? choice.finish_reason : null,
      usage: isObject(obj.usage) ? obj.usage : null,
      raw: obj
    };
  }
  function isObject(value) {
    return value !== null && typeof value === "object" && !Array.isArray(value);
  }
  function decodeObject(data) {
    let obj;
    try {
      obj = JSON.parse(data);
    } catch {
      throw new MalformedChunkError(`SSE data is not JSON: ${JSON.stringify(data.slice(0, 80))}`);
    }
    if (!isObject(obj)) {
      throw new MalformedChunkError(`SSE data is not a JSON object: ${JSON.stringify(data.slice(0, 80))}`);
    }
    return obj;
  }
  function parseEventId(text) {
    const trimmed = text.trim();
    const dot = trimmed.lastIndexOf(".");
    const number = trimmed.slice(dot + 1);
    if (dot <= 0 || !/^[0-9]{1,15}$/.test(number)) return null;
    return [trimmed.slice(0, dot), Number(number)];
  }

  // src/sseTransport.ts
  var MAX_ERROR_BODY = 64 * 1024;
  var OPTIONAL_FIELDS = ["resumable", "return_progress"];
  var CANCEL_TIMEOUT_MS = 2e3;
  var SSETransport = class extends ResumingTransport {
    name = "sse";
    controller = null;
    response = null;
    posted = null;
    // the POST whose headers may not be here yet
    readPaused = false;
    async run(attempt) {
      attempt.host.emit("request_sent", { transport: this.name, attempt: attempt.number, url: this.spec.url });
      this.streamId = null;
      this.lastN = 0;
      try {
        this.response = await this.checked(attempt);
        this.streamId = this.response.headers.get("X-Stream-Id");
        await this.readResuming(attempt);
      } catch (error) {
        const reason = error instanceof TtftTimeoutError ? "ttft_timeout" : attempt.host.signal.aborted ? "client" : null;
        if (reason) {
          const method = await this.giveUp(attempt.host.clock);
          attempt.host.emit("cancel_sent", { reason, method, elapsed_ms: Math.round(attempt.elapsedMs()) });
        }
        throw error;
      } finally {
        this.controller?.abort();
        this.controller = null;
        this.posted = null;
      }
    }
    /**
     * Cancel the stream: closing the connection does, unless it is resumable; then
     * `DELETE {base}/streams/{id}` too, within CANCEL_TIMEOUT_MS. The id comes with the
     * headers at admission: a resumable POST still waiting for them is kept open (as
     * long) and deleted when they come, without holding up the error or a retry.
     * Returns how (`close` or `delete`); a stream not deleted is forgotten after
     * resume_grace_ms anyway.
     */
    async giveUp(clock) {
      if (this.streamId !== null) return this.deleteStream(this.streamId, clock);
      const options = this.spec.body.stream_options;
      const posted = this.posted;
      const controller = this.controller;
      if (posted === null || controller === null || !isObject(options) || options.resumable !== true) return "close";
      this.controller = null;
      const timer = clock.setTimeout(() => controller.abort(), CANCEL_TIMEOUT_MS);
      posted.then((response) => {
        const id = response.headers.get("X-Stream-Id");
        return id === null ? "close" : this.deleteStream(id, clock);
      }).catch(() => "close").finally(() => {
        clock.clearTimeout(timer);
        controller.abort();
      });
      return "delete";
    }
    async deleteStream(id, clock) {
      const bound = new AbortController();
      const timer = clock.setTimeout(() => bound.abort(), CANCEL_TIMEOUT_MS);
      try {
        const response = await this.spec.fetch()(`${this.base()}/streams/${encodeURIComponent(id)}`, {
          method: "DELETE",
          headers: this.spec.headers,
          signal: bound.signal
        });
        await response.body?.cancel().catch(() => void 0);
        return response.ok ? "delete" : "close";
      } catch {
        return "close";
      } finally {
        clock.clearTimeout(timer);
      }
    }
    base() {
      const url = this.spec.url;
      const at = url.lastIndexOf("/chat/completions");
      return at >= 0 ? url.slice(0, at) : url.slice(0, url.lastIndexOf("/"));
    }
    pause(attempt) {
      if (attempt && !this.readPaused) attempt.host.emit("read_paused", {});
      this.readPaused = true;
    }
    resume(attempt) {
      if (attempt && this.readPaused) attempt.host.emit("read_resumed", {});
      this.readPaused = false;
    }
    drop() {
      this.controller?.abort();
    }
    async request(attempt, url, init) {
      this.controller?.abort();
      this.controller = new AbortController();
      const fetch2 = this.spec.fetch();
      const headers = { ...this.spec.headers, ...init.headers };
      const sent = fetch2(url, { ...init, headers, signal: this.controller.signal });
      if (init.method === "POST") this.posted = sent;
      try {
        const response = await attempt.wait(sent);
        this.posted = null;
        return response;
      } catch (error) {
        throw asClientError(error, attempt.host.signal, (m) => new ConnectError(`cannot connect to ${url}: ${m}`));
      }
    }
    post(attempt, body) {
      return this.request(attempt, this.spec.url, {
        method: "POST",
        body: JSON.stringify(body),
        headers: { "Content-Type": "application/json" }
      });
    }
    /** The 200 event stream; a refusal of an optional field asks again without it. */
    async checked(attempt) {
      let body = this.spec.body;
      for (; ; ) {
        const response = await this.post(attempt, body);
        try {
          await this.check(response, attempt);
          return response;
        } catch (error) {
          const field = refusedField(error, body);
          if (field === null) throw error;
          body = without(body, field);
        }
      }
    }
    async check(response, attempt) {
      attempt.setRequestId(response.headers.get("X-Request-Id"));
      if (response.status !== 200) {
        const text = await attempt.wait(readBounded(response));
        throw statusError(response, text, this.spec.url);
      }
      const type = response.headers.get("Content-Type") ?? "";
      if (!type.toLowerCase().startsWith("text/event-stream")) {
        const text = await attempt.wait(readBounded(response));
        throw new NotStreamingError(
          `the server did not stream: Content-Type is ${JSON.stringify(type || "missing")}, expected text/event-stream (body starts ${JSON.stringify(text.slice(0, 120))})`
        );
      }
    }
    async read(attempt) {
      const body = this.response?.body;
      if (!body) {
        throw new NotStreamingError(
          `this runtime's fetch does not stream response bodies (React Native's does not): use transport "ws"`
        );
      }
      const reader = body.getReader();
      const parser = new SSEParser();
      try {
        for (; ; ) {
          if (this.spec.held()) {
            await this.spec.flowOpen();
            attempt.watchdog.touch(attempt.host.clock.now());
          }
          const { value, done } = await this.readChunk(reader, attempt);
          if (value?.length) attempt.onBytes();
          const comments = parser.comments;
          const events = done ? parser.close() : parser.feed(value ?? new Uint8Array());
          if (parser.comments > comments) attempt.onHeartbeat(heartbeatOf({}));
          for (const event of events) if (await this.onEvent(event, attempt)) return;
          if (done) {
            if (attempt.finishReason === null) throw new ReadError(`the stream from ${this.spec.url} ended before [DONE]`);
            return;
          }
        }
      } finally {
        reader.cancel().catch(() => void 0);
      }
    }
    async readChunk(reader, attempt) {
      try {
        return await attempt.wait(reader.read());
      } catch (error) {
        throw asClientError(error, attempt.host.signal, (m) => new ReadError(`connection to ${this.spec.url} failed mid-stream: ${m}`));
      }
    }
    async reopen(attempt) {
      const response = await this.request(attempt, `${this.base()}/streams/${this.streamId}`, {
        method: "GET",
        headers: { "Last-Event-ID": `${this.streamId}.${this.lastN}` }
      });
      await this.check(response, attempt);
      this.response = response;
    }
    /** One event; true when the stream is complete ([DONE]). */
    async onEvent(event, attempt) {
      if (this.streamId !== null && event.id !== null) {
        const id = parseEventId(event.id);
        if (id !== null && this.seen(id[1])) return false;
      }
      attempt.onData();
      const chunk = parseChunk(event);
      if (chunk === null) return true;
      attempt.setRequestId(chunk.id);
      const progress = chunk.raw.progress;
      if (isObject(progress) && !chunk.raw.choices) attempt.onHeartbeat(heartbeatOf(progress));
      attempt.onUsage(chunk.usage);
      attempt.onFinish(chunk.finishReason);
      await attempt.onContent(chunk.content, 0, true);
      return false;
    }
  };
  async function readBounded(response) {
    const reader = response.body?.getReader();
    if (!reader) return "";
    const parts = [];
    let size = 0;
    while (size < MAX_ERROR_BODY) {
      const { value, done } = await reader.read();
      if (done) break;
      parts.push(value);
      size += value.length;
    }
    await reader.cancel().catch(() => void 0);
    const all = new Uint8Array(size);
    let at = 0;
    for (const part of parts) {
      all.set(part, at);
      at += part.length;
    }
    return new TextDecoder().decode(all.subarray(0, MAX_ERROR_BODY));
  }
  function statusError(response, text, url) {
    let error = {};
    try {
      const obj = JSON.parse(text);
      if (isObject(obj?.error)) error = obj.error;
      else if (typeof obj?.error === "string") error = { message: obj.error };
    } catch {
    }
    const serverCode = error.code == null ? null : String(error.code);
    let message = `HTTP ${response.status} from ${url}: ${String(error.message ?? text.slice(0, 200).trim()) || "no message"}`;
    if (serverCode) message += ` [${serverCode}]`;
    if (response.status === 503) {
      return new OverloadedError(message, serverCode, error, retryAfterMs(response.headers.get("Retry-After")));
    }
    return new HTTPStatusError(message, response.status, serverCode, error);
  }
  function retryAfterMs(value, now = Date.now()) {
    if (!value) return null;
    const seconds = Number(value);
    if (value.trim() !== "" && Number.isFinite(seconds)) return Math.max(0, seconds * 1e3);
    const when = Date.parse(value);
    return Number.isNaN(when) ? null : Math.max(0, when - now);
  }
  function refusedField(error, body) {
    if (!(error instanceof HTTPStatusError) || error.status !== 400) return null;
    const options = isObject(body.stream_options) ? body.stream_options : {};
    const carried = OPTIONAL_FIELDS.filter((f) => f in body || f in options);
    const param = String(error.error.param ?? "");
    return carried.find((f) => param.endsWith(f) || error.message.includes(f)) ?? null;
  }
  function without(body, field) {
    const { [field]: _dropped, ...rest } = body;
    const options = isObject(body.stream_options) ? { ...body.stream_options } : null;
    if (options) delete options[field];
    return options ? { ...rest, stream_options: options } : rest;
  }

  // src/renderQueue.ts
  var RenderQueue = class {
    /** `highMark` and `lowMark` are lengths: 0 <= low < high <= capacity. */
    constructor(capacity, highMark, lowMark) {
      this.capacity = capacity;
      if (!(0 <= lowMark && lowMark < highMark && highMark <= capacity)) {
        throw new RangeError(`need 0 <= low < high <= capacity, got ${lowMark}, ${highMark}, ${capacity}`);
      }
      this.highMark = highMark;
      this.lowMark = lowMark;
    }
    highMark;
    lowMark;
    aboveHigh = false;
    items = [];
    head = 0;
    /** The marks of fractions, as the configuration gives them. */
    static marks(capacity, high, low) {
      return [Math.max(1, Math.ceil(high * capacity)), Math.floor(low * capacity)];
    }
    get length() {
      return this.items.length - this.head;
    }
    get fill() {
      return this.length / this.capacity;
    }
    get isFull() {
      return this.length >= this.capacity;
    }
    /** Append; "high" when this push reached the high mark. The caller bounds the
     * length (a WebSocket cannot stop its frames in flight: they may pass capacity). */
    push(item) {
      this.items.push(item);
      if (!this.aboveHigh && this.length >= this.highMark) {
        this.aboveHigh = true;
        return "high";
      }
      return null;
    }
    /** The oldest item and "low" when the queue drained to the low mark after a high. */
    pop() {
      if (this.length === 0) throw new RangeError("pop from an empty render queue");
      const item = this.items[this.head++];
      if (this.head > 64 && this.head * 2 > this.items.length) {
        this.items = this.items.slice(this.head);
        this.head = 0;
      }
      if (this.aboveHigh && this.length <= this.lowMark) {
        this.aboveHigh = false;
        return [item, "low"];
      }
      return [item, null];
    }
  };

  // src/stream.ts
  var Notifier = class {
    waiters = [];
    wait(signal) {
      return new Promise((resolve, reject) => {
        if (signal?.aborted) return reject(signal.reason);
        const onAbort = () => reject(signal?.reason);
        signal?.addEventListener("abort", onAbort, { once: true });
        this.waiters.push(() => {
          signal?.removeEventListener("abort", onAbort);
          resolve();
        });
      });
    }
    notify() {
      const waiters = this.waiters;
      this.waiters = [];
      for (const wake of waiters) wake();
    }
  };
  var ChatStream = class {
    constructor(config, transport, policy, clock, hooks, signal) {
      this.config = config;
      this.transport = transport;
      this.policy = policy;
      this.clock = clock;
      this.hooks = hooks;
      const [high, low] = RenderQueue.marks(config.renderQueueCapacity, config.renderQueueHighWatermark, config.renderQueueLowWatermark);
      this.queue = new RenderQueue(config.renderQueueCapacity, high, low);
      if (signal?.aborted) this.controller.abort(signal.reason);
      signal?.addEventListener("abort", () => this.cancel(signal.reason), { once: true });
    }
    queue;
    controller = new AbortController();
    changed = new Notifier();
    room = new Notifier();
    flow = new Notifier();
    holds = /* @__PURE__ */ new Set();
    task = null;
    attempt = null;
    error = null;
    finished = false;
    startedAt = 0;
    endedAt = null;
    pauses = 0;
    [Symbol.asyncIterator]() {
      return this;
    }
    /** Start the reader (iteration does). */
    start() {
      if (this.task) return;
      this.startedAt = this.clock.now();
      this.task = this.run();
    }
    async next() {
      this.start();
      while (this.queue.length === 0 && !this.finished) await this.changed.wait();
      if (this.queue.length > 0) return { value: this.pop(), done: false };
      if (this.error !== null) {
        const error = this.error;
        this.error = null;
        throw error;
      }
      return { value: void 0, done: true };
    }
    /** `break` out of `for await`: cancel the stream if it still runs. */
    async return() {
      await this.close();
      return { value: void 0, done: true };
    }
    /** Cancel (CANCEL frame over WS, connection closed over SSE) and wait for the end. */
    async close(reason) {
      if (!this.finished) this.cancel(reason);
      await this.task?.catch(() => void 0);
    }
    cancel(reason = new DOMException("the stream was cancelled", "AbortError")) {
      if (!this.controller.signal.aborted) this.controller.abort(reason);
    }
    /** Hold the stream as the app (a Pause button), whatever the render queue wants. */
    pause() {
      this.hold("app", true);
    }
    resume() {
      this.hold("app", false);
    }
    /** Drop the connection as a dead network would (a resumable stream resumes). */
    dropConnection() {
      this.transport.drop();
    }
    /** What holds the stream now: "queue" (watermark) and/or "app". */
    get heldBy() {
      return [...this.holds];
    }
    get done() {
      return this.finished && this.queue.length === 0;
    }
    get streamId() {
      return this.transport.streamId;
    }
    /** The outcome; throws before the stream finished. */
    get result() {
      if (!this.finished || !this.attempt) throw new Error("the stream has not finished");
      const a = this.attempt;
      return {
        text: a.parts.join(""),
        finishReason: a.finishReason,
        usage: a.usage,
        requestId: a.requestId,
        streamId: this.transport.streamId,
        transport: this.transport.name,
        attempts: a.number,
        nChunks: a.nChunks,
        nTokens: a.nTokens,
        ttfrMs: a.msSinceStart(a.firstDataAt),
        ttftMs: a.msSinceStart(a.firstTokenAt),
        itlMs: a.itlMs,
        e2eMs: a.msSinceStart(a.lastTokenAt),
        totalMs: round((this.endedAt ?? this.clock.now()) - this.startedAt),
        pauses: this.pauses,
        serverPauses: a.serverPauses,
        serverStats: a.serverStats
      };
    }
    pop() {
      const [item, mark] = this.queue.pop();
      this.room.notify();
      if (mark === "low") {
        this.emit("watermark_low", { queue_fill: this.queue.fill });
        this.hold("queue", false);
      }
      return item;
    }
    hold(source, on) {
      const was = this.holds.size > 0;
      if (on) this.holds.add(source);
      else this.holds.delete(source);
      const is = this.holds.size > 0;
      if (is === was) return;
      if (is) {
        this.pauses++;
        this.transport.pause(this.attempt);
      } else {
        this.transport.resume(this.attempt);
        this.flow.notify();
      }
    }
    emit(event, fields = {}) {
      try {
        this.hooks.onEvent?.({ event, t: round(this.clock.now() - this.startedAt), ...fields });
      } catch (error) {
        console.error("edge-llm: an onEvent handler threw", error);
      }
    }
    host() {
      return {
        clock: this.clock,
        signal: this.controller.signal,
        deliver: (text, wait) => this.deliver(text, wait),
        emit: (event, fields) => this.emit(event, fields),
        heartbeat: (beat) => this.hooks.onHeartbeat?.(beat),
        ttftWarn: (elapsed) => {
          (this.hooks.warn ?? console.warn)(`edge-llm: no first token after ${elapsed} ms (ttft_warn_ms); still waiting`);
          this.hooks.onTtftWarn?.(elapsed);
        }
      };
    }
    /** Called by the transport: wait for room (SSE) or never (WS, bounded by PAUSE). */
    async deliver(text, wait) {
      if (wait) {
        while (this.queue.isFull) await this.room.wait(this.controller.signal);
      } else if (this.queue.length >= 4 * this.queue.capacity) {
        throw new ProtocolError(`render queue overflow (${this.queue.length} chunks): the server ignored PAUSE`);
      }
      const mark = this.queue.push(text);
      this.changed.notify();
      if (mark === "high") {
        this.emit("watermark_high", { queue_fill: this.queue.fill, queue_len: this.queue.length, queue_capacity: this.queue.capacity });
        this.hold("queue", true);
      }
    }
    /** Resolves when nothing holds the stream (rejects on abort). */
    async flowOpen() {
      while (this.holds.size > 0) await this.flow.wait(this.controller.signal);
    }
    isHeld() {
      return this.holds.size > 0;
    }
    async run() {
      let last;
      try {
        await this.attempts();
        last = ["end", this.endFields(this.attempt?.finishReason ?? null)];
      } catch (error) {
        this.error = error;
        if (this.controller.signal.aborted) {
          last = ["end", this.endFields("cancelled")];
        } else {
          const code = error instanceof ClientError ? error.code : "internal_error";
          const serverCode = error instanceof ClientError ? error.serverCode : null;
          const reason = error instanceof ServerStreamError ? error.error.reason ?? null : null;
          last = ["error", { code, server_code: serverCode, reason, message: String(error?.message ?? error) }];
        }
      }
      this.finished = true;
      this.endedAt = this.clock.now();
      this.emit(...last);
      this.changed.notify();
    }
    endFields(finishReason) {
      const a = this.attempt;
      return { finish_reason: finishReason, n_chunks: a?.nChunks ?? 0, n_tokens: a?.nTokens ?? 0, ttft_ms: a?.msSinceStart(a.firstTokenAt) ?? null, pauses: this.pauses };
    }
    async attempts() {
      for (let number = 1; ; ) {
        this.attempt = new Attempt(number, this.config, this.host());
        try {
          await this.transport.run(this.attempt);
          return;
        } catch (error) {
          if (this.controller.signal.aborted || !(error instanceof ClientError)) throw error;
          const decision = this.policy.decide(error, number, this.attempt.nChunks > 0);
          if (decision === null) throw error;
          this.emit("retry", { attempt: decision.nextAttempt, backoff_ms: Math.round(decision.delayMs), cause: decision.cause, message: error.message });
          await sleep(this.clock, decision.delayMs, this.controller.signal);
          number = decision.nextAttempt;
        }
      }
    }
  };

  // src/ws.ts
  var OPEN = 1;
  var FRAME_ERRORS = /* @__PURE__ */ new Set(["invalid_frame", "unknown_frame_type", "no_active_stream", "already_paused", "not_paused"]);
  var MAX_INBOX = 4096;
  var Inbox = class {
    constructor(ws) {
      this.ws = ws;
      this.opened = new Promise((resolve, reject) => {
        ws.addEventListener("open", () => resolve());
        ws.addEventListener("close", (event) => {
          reject(new ConnectError(`WebSocket closed before it opened (code ${event.code})`));
          this.put({ closed: event.code ?? 1006 });
        });
      });
      this.opened.catch(() => void 0);
      ws.addEventListener("message", (event) => this.put({ data: event.data }));
    }
    opened;
    items = [];
    waiter = null;
    closedCode = null;
    put(item) {
      if ("closed" in item) {
        if (this.closedCode !== null) return;
        this.closedCode = item.closed;
      } else if (this.items.length >= MAX_INBOX) {
        return this.ws.close(1008, "too many unread frames");
      }
      const waiter = this.waiter;
      this.waiter = null;
      if (waiter) waiter(item);
      else this.items.push(item);
    }
    next() {
      const item = this.items.shift();
      if (item) return Promise.resolve(item);
      return new Promise((resolve) => this.waiter = resolve);
    }
  };
  var WSTransport = class extends ResumingTransport {
    name = "ws";
    inbox = null;
    pausedOnSocket = false;
    async run(attempt) {
      this.streamId = null;
      this.lastN = 0;
      try {
        const start = { type: "start", request: this.spec.body };
        if (this.spec.resumeAttempts) start.resumable = true;
        await this.open(attempt, start);
        attempt.host.emit("request_sent", { transport: this.name, attempt: attempt.number, url: this.spec.url });
        attempt.watchdog.arm();
        await this.readResuming(attempt);
      } catch (error) {
        if (error instanceof TtftTimeoutError) this.cancel(attempt, "ttft_timeout");
        else if (attempt.host.signal.aborted) this.cancel(attempt, "client");
        throw error;
      } finally {
        this.close();
      }
    }
    pause(attempt) {
      this.send(attempt, "pause");
    }
    resume(attempt) {
      this.send(attempt, "resume");
    }
    drop() {
      this.inbox?.ws.close(4e3, "dropped");
    }
    send(attempt, kind) {
      const ws = this.inbox?.ws;
      if (!attempt || !ws || ws.readyState !== OPEN || this.pausedOnSocket === (kind === "pause")) return;
      this.pausedOnSocket = kind === "pause";
      ws.send(JSON.stringify({ type: kind }));
      attempt.host.emit(kind === "pause" ? "pause_sent" : "resume_sent", {});
    }
    async open(attempt, opening) {
      this.close();
      const Ctor = this.spec.WebSocket();
      let ws;
      try {
        ws = new Ctor(this.spec.url, subprotocols(this.spec.apiKey));
      } catch (error) {
        throw new ConnectError(`cannot open a WebSocket to ${this.spec.url}: ${error.message}`);
      }
      this.inbox = new Inbox(ws);
      this.pausedOnSocket = false;
      await attempt.waitUndeadlined(withTimeout(this.inbox.opened, this.spec.connectTimeoutMs, attempt, this.spec.url));
      ws.send(JSON.stringify(opening));
      if (opening.type === "start") attempt.watchdog.restart(attempt.host.clock.now());
      if (this.spec.held()) this.pause(attempt);
    }
    close() {
      const ws = this.inbox?.ws;
      this.inbox = null;
      if (ws && ws.readyState <= OPEN) ws.close(1e3);
    }
    cancel(attempt, reason) {
      const ws = this.inbox?.ws;
      const open = ws !== void 0 && ws.readyState === OPEN;
      if (open) ws.send(JSON.stringify({ type: "cancel" }));
      attempt.host.emit("cancel_sent", { reason, method: open ? "frame" : "close", elapsed_ms: Math.round(attempt.elapsedMs()) });
    }
    async read(attempt) {
      const inbox = this.inbox;
      if (!inbox) throw new ReadError("no socket to read");
      for (; ; ) {
        const item = await attempt.wait(inbox.next());
        if ("closed" in item) throw new ReadError(`the server closed the WebSocket before done (code ${item.closed})`);
        attempt.onBytes();
        if (await this.onFrame(decode(item.data), attempt)) return;
      }
    }
    async reopen(attempt) {
      await this.open(attempt, { type: "resume", stream_id: this.streamId, last_event_id: this.lastN });
    }
    /** Handle one server frame; true when the stream is done. */
    async onFrame(frame, attempt) {
      if (typeof frame.n === "number" && this.seen(frame.n)) return false;
      const host = attempt.host;
      switch (frame.type) {
        case "delta":
          attempt.setRequestId(frame.id);
          await attempt.onContent(String(frame.text ?? ""), intOf(frame.n_tokens), false);
          break;
        case "heartbeat":
          attempt.onHeartbeat(heartbeatOf(frame));
          break;
        case "started":
          attempt.onData();
          attempt.setRequestId(frame.id);
          this.streamId = typeof frame.stream_id === "string" ? frame.stream_id : null;
          host.emit("started", { id: frame.id, stream_id: this.streamId });
          break;
        case "paused": {
          const cause = String(frame.cause ?? "unknown");
          attempt.serverPauses.push(cause);
          host.emit("server_paused", { cause });
          if (cause === "preempted") attempt.onHeartbeat({ ...heartbeatOf({}), state: cause });
          break;
        }
        case "resumed":
          host.emit("server_resumed", {});
          break;
        case "done":
          attempt.setRequestId(frame.id);
          attempt.onFinish(frame.finish_reason);
          attempt.onUsage(frame.usage);
          attempt.serverStats = isObject(frame.stats) ? frame.stats : null;
          return true;
        case "error":
          if (FRAME_ERRORS.has(String(frame.code))) {
            host.emit("frame_refused", { code: frame.code, message: frame.message });
            break;
          }
          throw ServerStreamError.fromPayload(frame);
        default:
          host.emit("frame", { type: frame.type });
      }
      return false;
    }
  };
  function decode(data) {
    if (typeof data !== "string") throw new MalformedChunkError("unexpected binary WebSocket frame");
    let frame;
    try {
      frame = JSON.parse(data);
    } catch {
      throw new MalformedChunkError(`WebSocket frame is not JSON: ${JSON.stringify(data.slice(0, 80))}`);
    }
    if (!isObject(frame)) throw new MalformedChunkError(`WebSocket frame is not a JSON object: ${JSON.stringify(data.slice(0, 80))}`);
    return frame;
  }
  function intOf(value) {
    return typeof value === "number" && Number.isInteger(value) ? value : 0;
  }
  function withTimeout(promise, ms2, attempt, url) {
    const clock = attempt.host.clock;
    return new Promise((resolve, reject) => {
      const timer = clock.setTimeout(() => reject(new ConnectError(`timed out connecting to ${url}`)), ms2);
      promise.then(resolve, reject).finally(() => clock.clearTimeout(timer));
    });
  }
  function subprotocols(apiKey) {
    if (!apiKey) return ["edge-llm"];
    return ["edge-llm", `edge-llm.key.${base64url(new TextEncoder().encode(apiKey))}`];
  }
  var ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  function base64url(bytes) {
    let out = "";
    for (let i = 0; i < bytes.length; i += 3) {
      const n = bytes[i] << 16 | (bytes[i + 1] ?? 0) << 8 | (bytes[i + 2] ?? 0);
      const chars = Math.min(4, Math.ceil((bytes.length - i) * 8 / 6));
      for (let j = 0; j < chars; j++) out += ALPHABET[n >> 18 - 6 * j & 63];
    }
    return out;
  }

  // src/client.ts
  var StreamClient = class {
    constructor(config, options = {}) {
      this.config = config;
      this.options = options;
      this.policy = new RetryPolicy(config.retry, options.random);
      this.clock = options.clock ?? systemClock;
    }
    policy;
    clock;
    /** A stream of `messages`; it starts on first iteration (or `start()`). */
    stream(messages, options = {}) {
      const name = options.transport ?? "sse";
      if (name !== "ws" && name !== "sse") throw new ConfigError(`transport must be "ws" or "sse", got ${JSON.stringify(name)}`, "transport");
      let stream = null;
      const spec = this.spec(name, this.body(messages, options), () => stream);
      const transport = name === "ws" ? new WSTransport(spec) : new SSETransport(spec);
      const hooks = {
        onEvent: (event) => {
          this.options.onEvent?.(event);
          options.onEvent?.(event);
        },
        onHeartbeat: options.onHeartbeat,
        onTtftWarn: options.onTtftWarn,
        warn: this.options.warn
      };
      stream = new ChatStream(this.config, transport, this.policy, this.clock, hooks, options.signal);
      return stream;
    }
    /** Stream to the end; the result (text included). Throws the stream's error. */
    async complete(messages, options = {}) {
      const stream = this.stream(messages, options);
      for await (const _ of stream) {
      }
      return stream.result;
    }
    spec(name, body, stream) {
      const { config, options } = this;
      const headers = { Accept: "text/event-stream", "X-Client-Request-Id": requestId() };
      if (config.apiKey) headers.Authorization = `Bearer ${config.apiKey}`;
      return {
        url: name === "ws" ? config.baseUrl.replace(/^http/, "ws") + "/stream" : `${config.baseUrl}/chat/completions`,
        body,
        headers,
        apiKey: config.apiKey,
        connectTimeoutMs: config.connectTimeoutMs,
        resumeAttempts: config.resumable ? config.resumeAttempts : 0,
        resumeBackoff: (tries) => tries <= 1 ? options.resumeDelayMs ?? 0 : this.policy.backoffMs(tries - 1),
        flowOpen: () => stream().flowOpen(),
        held: () => stream().isHeld(),
        fetch: () => {
          const fetch2 = options.fetch ?? globalThis.fetch?.bind(globalThis);
          if (!fetch2) throw new ConfigError("no fetch in this runtime: pass { fetch } to StreamClient", "fetch");
          return fetch2;
        },
        WebSocket: () => {
          const ws = options.WebSocket ?? globalThis.WebSocket;
          if (!ws) {
            throw new ConfigError(
              "no WebSocket in this runtime: pass { WebSocket } to StreamClient (Node 20: from the ws package, or run node with --experimental-websocket)",
              "WebSocket"
            );
          }
          return ws;
        }
      };
    }
    body(messages, options) {
      const { config } = this;
      const body = {
        messages: messages.map((m) => ({ ...m })),
        stream: true,
        stream_options: config.resumable ? { include_usage: true, resumable: true } : { include_usage: true }
      };
      if (config.modelId !== null) body.model = config.modelId;
      const maxTokens = options.max_tokens ?? config.maxTokens;
      const temperature = options.temperature ?? config.temperature;
      if (maxTokens !== null) body.max_tokens = maxTokens;
      if (temperature !== null) body.temperature = temperature;
      if (options.session) body.user = options.session;
      if (options.priority !== void 0) body.priority = options.priority;
      if (options.progress) body.return_progress = true;
      return { ...body, ...options.extra_body };
    }
  };
  function requestId() {
    return Math.random().toString(36).slice(2, 10) + Date.now().toString(36);
  }

  // playground/app.js
  var STREAMS_POLL_MS = 500;
  var METRICS_POLL_MS = 1e3;
  var MAX_LOG_LINES = 200;
  var RESUME_AFTER_MS = 1e3;
  var KEY_STORAGE = "edge-llm-playground-key";
  var PAGE_CONFIG = {
    ttft_hard_timeout_ms: 0,
    dead_after_heartbeats: 10,
    retry: { max_attempts: 1 }
  };
  var auth = {
    key: sessionStorage.getItem(KEY_STORAGE) || "",
    headers() {
      return this.key ? { Authorization: "Bearer " + this.key } : {};
    },
    set(key) {
      this.key = key.trim();
      sessionStorage.setItem(KEY_STORAGE, this.key);
    }
  };
  async function fetchWithKey(path) {
    const response = await fetch(path, { headers: auth.headers(), cache: "no-store" });
    if (response.status === 401) {
      askForKey(auth.key ? "That key was refused." : "");
      throw new Error("401 invalid_api_key");
    }
    if (!response.ok) throw new Error(path + ": HTTP " + response.status);
    return response;
  }
  var keyPrompted = null;
  function askForKey(message) {
    const dialog = document.getElementById("key-dialog");
    document.getElementById("key-error").textContent = message;
    document.getElementById("auth-status").textContent = "API key needed";
    if (!dialog.open) dialog.showModal();
    if (!keyPrompted) {
      keyPrompted = new Promise((resolve) => {
        document.getElementById("key-form").addEventListener(
          "submit",
          (event) => {
            event.preventDefault();
            auth.set(document.getElementById("key-input").value);
            dialog.close();
            keyPrompted = null;
            resolve();
          },
          { once: true }
        );
      });
    }
    return keyPrompted;
  }
  async function loadModel() {
    for (; ; ) {
      try {
        const models = await (await fetchWithKey("/v1/models")).json();
        const id = models.data && models.data[0] ? models.data[0].id : "?";
        document.getElementById("model").textContent = "model: " + id;
        document.getElementById("auth-status").textContent = auth.key ? "key set" : "";
        document.getElementById("change-key").hidden = !auth.key;
        document.body.dataset.ready = "true";
        return;
      } catch (error) {
        if (keyPrompted) {
          await keyPrompted;
        } else {
          document.getElementById("model").textContent = "model: unreachable (" + error.message + ")";
          return;
        }
      }
    }
  }
  var paneCount = 0;
  function randomId() {
    return Math.random().toString(36).slice(2, 8);
  }
  function newClient() {
    const config = loadClientConfig(void 0, {
      overrides: { ...PAGE_CONFIG, base_url: location.origin + "/v1", api_key: auth.key }
    });
    return new StreamClient(config, { resumeDelayMs: RESUME_AFTER_MS });
  }
  var Run = class {
    // One stream and what the engine said about it.
    constructor(request) {
      this.request = request;
      this.stream = null;
      this.id = null;
      this.received = 0;
      this.rendered = 0;
      this.serverPause = null;
      this.finished = false;
      this.startedAt = performance.now();
      this.firstTokenMs = null;
    }
  };
  var Pane = class {
    constructor(root) {
      this.index = paneCount++;
      this.root = root;
      this.run = null;
      this.lastRequest = null;
      this.speedChanged = null;
      this.el = {};
      for (const node of root.querySelectorAll("[data-role]")) this.el[node.dataset.role] = node;
      root.dataset.pane = String(this.index);
      root.querySelector(".pane-title").textContent = "Pane " + (this.index + 1);
      this.el.session.value = "pane" + (this.index + 1) + "-" + randomId();
      this.el.send.addEventListener("click", () => this.send());
      this.el.regenerate.addEventListener("click", () => this.regenerate());
      this.el.pause.addEventListener("click", () => this.hold(true));
      this.el.resume.addEventListener("click", () => this.hold(false));
      this.el.cancel.addEventListener("click", () => this.cancel());
      this.el.drop.addEventListener("click", () => this.dropConnection());
      this.el["render-speed"].addEventListener("change", () => this.speedChanged?.());
      this.el.close.addEventListener("click", () => this.close());
      this.el.prompt.addEventListener("keydown", (event) => {
        if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) this.send();
      });
      const [high, low] = RenderQueue.marks(32, 0.8, 0.3);
      const marks = root.querySelectorAll(".queue .mark");
      marks[0].style.left = 100 * high / 32 + "%";
      marks[1].style.left = 100 * low / 32 + "%";
      this.updateControls();
      this.showQueue();
    }
    buildRequest() {
      const maxTokens = parseInt(this.el["max-tokens"].value, 10);
      const temperature = parseFloat(this.el.temperature.value);
      const priority = parseInt(this.el.priority.value, 10);
      return {
        messages: [{ role: "user", content: this.el.prompt.value }],
        max_tokens: Number.isFinite(maxTokens) ? maxTokens : 160,
        temperature: Number.isFinite(temperature) ? temperature : 0,
        // The session: a new request of the same session supersedes a running one.
        session: this.el.session.value.trim() || void 0,
        // Its class (lower first); empty: the server's default for this key or route.
        priority: Number.isFinite(priority) ? priority : void 0
      };
    }
    send() {
      this.lastRequest = this.buildRequest();
      this.open(this.lastRequest);
    }
    regenerate() {
      const request = this.lastRequest || this.buildRequest();
      request.session = this.el.session.value.trim() || request.session;
      this.lastRequest = request;
      this.open(request);
    }
    open(request) {
      this.el.output.textContent = "";
      this.el.stats.textContent = "";
      const run = new Run(request);
      this.run = run;
      this.root.dataset.streamId = "";
      this.root.dataset.pausedBy = "";
      this.setState("connecting");
      const { messages, ...options } = request;
      run.stream = newClient().stream(messages, {
        ...options,
        transport: "ws",
        progress: true,
        // a heartbeat at each change of state too (queued, prefill, preempted)
        onEvent: (event) => this.onEvent(run, event),
        onHeartbeat: (beat) => this.onHeartbeat(run, beat),
        onTtftWarn: (ms2) => this.log(run, "no first token after " + ms2 + " ms (ttft_warn_ms)")
      });
      this.renderLoop(run);
    }
    // The renderer: takes chunks from the SDK's render queue at the chosen speed (one per
    // 1/speed seconds, like a UI that cannot keep up with the engine; instant takes them
    // as they come, stalled takes none). The SDK pauses the engine when the queue fills.
    async renderLoop(run) {
      try {
        for await (const text of run.stream) {
          if (run !== this.run) continue;
          this.el.output.append(text);
          run.rendered += 1;
          this.root.dataset.rendered = String(run.rendered);
          this.showQueue();
          await this.renderDelay(run);
        }
        if (run === this.run) this.root.dataset.complete = "true";
      } catch (error) {
      }
      this.showQueue();
    }
    renderSpeed() {
      const value = this.el["render-speed"].value;
      return value === "instant" ? Infinity : parseFloat(value) || 0;
    }
    renderDelay(run) {
      return new Promise((resolve) => {
        const speed = this.renderSpeed();
        const timer = speed === Infinity ? null : speed > 0 ? setTimeout(done, 1e3 / speed) : null;
        const pane = this;
        function done() {
          clearTimeout(timer);
          pane.speedChanged = null;
          resolve();
        }
        if (speed === Infinity || run.finished || run !== this.run) return done();
        this.speedChanged = done;
      });
    }
    onEvent(run, event) {
      if (run !== this.run) {
        if (event.event === "end" || event.event === "error") {
          run.finished = true;
          const reason = this.endReason(run, event);
          this.log(run, "previous stream " + (run.id || "") + " ended: " + reason);
        }
        return;
      }
      switch (event.event) {
        case "request_sent":
          this.log(run, "> start");
          break;
        case "started":
          run.id = event.id;
          this.root.dataset.streamId = event.id;
          this.log(run, "started " + event.id);
          this.setState("queued");
          break;
        case "delta":
          this.onDelta(run, event);
          break;
        case "watermark_high":
          this.log(run, "render queue at high watermark: PAUSE");
          break;
        case "watermark_low":
          this.log(run, "render queue at low watermark: RESUME");
          break;
        case "pause_sent":
        case "resume_sent":
        case "cancel_sent":
          this.log(run, "> " + event.event.replace("_sent", ""));
          break;
        case "server_paused":
          run.serverPause = event.cause;
          this.root.dataset.pauseCause = event.cause;
          this.log(run, "paused (" + event.cause + ")");
          this.setState(event.cause === "preempted" ? "preempted" : "paused");
          break;
        case "server_resumed":
          run.serverPause = null;
          this.root.dataset.pauseCause = "";
          this.log(run, "resumed");
          this.setState("decoding");
          break;
        case "retry":
          if (event.cause === "resume") this.log(run, "> resume after frame " + event.last_event);
          break;
        case "frame_refused":
          this.log(run, "refused frame: " + event.code);
          break;
        case "end":
        case "error":
          this.onEnd(run, event);
          break;
        case "frame":
          this.log(run, "frame " + event.type);
          break;
      }
      this.showHeld(run);
      this.showQueue();
    }
    onHeartbeat(run, beat) {
      if (run !== this.run) return;
      if (!run.serverPause && beat.state) this.setState(beat.state);
      if (run.firstTokenMs === null) this.el.stats.textContent = progressText(beat);
    }
    onDelta(run, event) {
      if (run.firstTokenMs === null) {
        run.firstTokenMs = performance.now() - run.startedAt;
        this.el.stats.textContent = "first token after " + Math.round(run.firstTokenMs) + " ms";
      }
      run.received += event.n_tokens;
      this.root.dataset.received = String(run.received);
      if (!run.serverPause) this.setState("decoding");
    }
    endReason(run, event) {
      return event.event === "end" ? event.finish_reason : event.reason || event.server_code || event.code;
    }
    onEnd(run, event) {
      run.finished = true;
      this.speedChanged?.();
      if (event.event === "end" && event.finish_reason === "cancelled") {
        this.log(run, "cancelled (client)");
        this.setState("cancelled");
        this.el.stats.textContent = "cancelled (client), KV freed";
        return;
      }
      if (event.event === "end") {
        this.log(run, "done: " + event.finish_reason);
        this.showDone(run, run.stream.result);
        this.setState("done");
        return;
      }
      const cancelled = event.server_code === "cancelled";
      const message = event.message;
      const reason = event.reason ? " (" + event.reason + ")" : "";
      this.log(run, cancelled ? "cancelled" + reason : "error " + (event.server_code || event.code) + reason + ": " + message);
      this.setState(cancelled ? "cancelled" : "error");
      this.el.stats.textContent = (event.server_code || event.code) + ": " + message;
    }
    // Pause/Resume buttons: the app's hold on the stream, beside the render queue's;
    // the SDK pauses the engine while either holds and resumes it when both let go.
    hold(on) {
      const run = this.run;
      if (!run || run.finished) return;
      if (on) run.stream.pause();
      else run.stream.resume();
      this.showHeld(run);
    }
    cancel() {
      const run = this.run;
      if (run && !run.finished) run.stream.cancel();
    }
    dropConnection() {
      const run = this.run;
      if (!run || run.finished || !run.stream.streamId) return;
      run.stream.dropConnection();
      this.root.dataset.drops = String(parseInt(this.root.dataset.drops || "0", 10) + 1);
      this.log(run, "connection dropped: the stream is detached");
      this.setState("detached");
    }
    showHeld(run) {
      if (run !== this.run) return;
      const held = run.stream.heldBy.map((source) => source === "app" ? "user" : source);
      this.root.dataset.pausedBy = held.join(" ");
      this.updateControls();
    }
    showQueue() {
      const queue = this.run && this.run.stream.queue;
      const length = queue ? queue.length : 0;
      this.root.dataset.queued = String(length);
      this.el["queue-fill"].style.width = 100 * Math.min(1, length / 32) + "%";
      this.el["queue-fill"].classList.toggle("hot", !!(queue && queue.aboveHigh));
      this.el["queue-text"].textContent = "queue " + length + "/32";
    }
    showDone(run, result) {
      const s = result.serverStats || {};
      const usage = result.usage || {};
      const parts = [
        result.finishReason,
        (usage.completion_tokens ?? run.received) + " tokens",
        "TTFT " + (s.ttft_ms != null ? Math.round(s.ttft_ms) + " ms" : "–"),
        "pauses " + (s.pauses ?? 0) + " (" + Math.round(s.paused_ms || 0) + " ms)",
        "tokens after pause " + (s.tokens_while_paused ?? 0)
      ];
      const cached = usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens;
      if (cached) parts.push("cached prompt " + cached);
      this.el.stats.textContent = parts.join(" · ");
      this.root.dataset.pauses = String(s.pauses ?? 0);
    }
    setState(state) {
      const run = this.run;
      const cause = run && run.serverPause;
      this.root.dataset.state = state;
      this.el.state.textContent = state === "paused" && cause ? "paused (" + cause + ")" : state;
      if (state !== "done") delete this.root.dataset.complete;
      this.updateControls();
    }
    updateControls() {
      const run = this.run;
      const live = !!(run && !run.finished);
      const byUser = !!(run && run.stream && run.stream.heldBy.includes("app"));
      this.el.pause.disabled = !live || byUser;
      this.el.resume.disabled = !live || !byUser;
      this.el.cancel.disabled = !live;
      this.el.drop.disabled = !live || !(run.stream && run.stream.streamId);
      this.el.regenerate.disabled = !this.lastRequest;
    }
    log(run, text) {
      const item = document.createElement("li");
      const t = run ? ((performance.now() - run.startedAt) / 1e3).toFixed(2) + "s " : "";
      item.textContent = t + text;
      this.el.log.prepend(item);
      while (this.el.log.childElementCount > MAX_LOG_LINES) this.el.log.lastElementChild.remove();
    }
    close() {
      const run = this.run;
      if (run && !run.finished) run.stream.cancel();
      this.root.remove();
    }
  };
  function ordinal(n) {
    const teen = n % 100 >= 10 && n % 100 <= 20;
    return n + (teen ? "th" : { 1: "st", 2: "nd", 3: "rd" }[n % 10] || "th");
  }
  function progressText(beat) {
    const wait = beat.predictedWaitMs == null ? "" : ", ~" + (beat.predictedWaitMs / 1e3).toFixed(1) + " s";
    if (beat.state === "queued") {
      return "queued" + (beat.queuePosition == null ? "" : " " + ordinal(beat.queuePosition)) + wait;
    }
    if (beat.state === "preempted") return "preempted by a more urgent request";
    return beat.state + ": " + beat.prefillDone + "/" + beat.prefillTotal + " prompt tokens" + wait;
  }
  function addPane() {
    const template = document.getElementById("pane-template");
    const root = template.content.firstElementChild.cloneNode(true);
    document.getElementById("panes").append(root);
    return new Pane(root);
  }
  var MIB = 1024 * 1024;
  function mib(bytes) {
    return (Math.floor(bytes / MIB * 10 + 0.5) / 10).toFixed(1);
  }
  function cell(text, className) {
    const td = document.createElement("td");
    td.textContent = text;
    if (className) td.className = className;
    return td;
  }
  function ringCell(stream) {
    const td = document.createElement("td");
    const held = stream.ring_write - stream.ring_read;
    const bar = document.createElement("div");
    bar.className = "bar small";
    const fill = document.createElement("div");
    fill.className = "fill";
    fill.style.width = 100 * held / Math.max(1, stream.ring_capacity) + "%";
    if (held >= stream.ring_capacity) fill.classList.add("hot");
    bar.append(fill);
    const text = document.createElement("span");
    text.textContent = held + "/" + stream.ring_capacity;
    td.append(bar, text);
    td.dataset.col = "ring";
    return td;
  }
  function ms(value) {
    return value == null ? "–" : Math.round(value) + " ms";
  }
  function streamRow(stream) {
    const tr = document.createElement("tr");
    tr.dataset.streamId = stream.id;
    tr.dataset.state = stream.state;
    tr.dataset.pauseCause = stream.pause_cause || "";
    tr.className = "state-" + stream.state;
    const state = stream.state === "paused" ? "paused (" + stream.pause_cause + ")" : stream.state;
    const end = stream.cancel_reason || stream.finish_reason || "";
    tr.append(
      cell(stream.id.slice(-12), "mono"),
      cell(stream.session || "–"),
      cell(state, "state"),
      ringCell(stream),
      cell(String(stream.kv_tokens), "num"),
      cell(stream.n_cached_tokens == null ? "–" : String(stream.n_cached_tokens), "num"),
      cell(stream.n_generated + "/" + stream.max_tokens, "num"),
      cell(String(stream.pauses), "num"),
      cell(ms(stream.paused_ms), "num"),
      cell(ms(stream.ttft_ms), "num"),
      cell(priorityText(stream), "num"),
      cell(end)
    );
    tr.cells[2].dataset.col = "state";
    tr.title = stream.id;
    return tr;
  }
  function priorityText(stream) {
    if (stream.priority == null) return "–";
    return stream.preemptions ? stream.priority + " ×" + stream.preemptions : String(stream.priority);
  }
  var LIVE_ORDER = { decoding: 0, prefill: 1, paused: 2, preempted: 3, offloaded: 4, queued: 5 };
  function showStreams(doc) {
    const used = doc.kv_used_bytes;
    const budget = doc.kv_budget_bytes;
    const kvText = document.getElementById("kv-text");
    kvText.textContent = mib(used) + " / " + mib(budget) + " MiB";
    kvText.dataset.kvUsed = String(used);
    kvText.dataset.kvBudget = String(budget);
    document.getElementById("kv-bar").style.width = 100 * used / Math.max(1, budget) + "%";
    document.getElementById("t-running").textContent = String(doc.requests_running);
    document.getElementById("t-waiting").textContent = String(doc.requests_waiting);
    const streams = [...doc.streams].sort(
      (a, b) => (LIVE_ORDER[a.state] ?? 9) - (LIVE_ORDER[b.state] ?? 9) || a.age_ms - b.age_ms
    );
    const tbody = document.querySelector("#streams tbody");
    tbody.replaceChildren(...streams.map(streamRow));
  }
  function parseMetrics(text) {
    const samples = [];
    for (const line of text.split("\n")) {
      if (!line || line.startsWith("#")) continue;
      const match = /^([a-zA-Z_:][\w:]*)(\{([^}]*)\})?\s+(\S+)/.exec(line);
      if (!match) continue;
      const labels = {};
      for (const pair of (match[3] || "").matchAll(/(\w+)="([^"]*)"/g)) labels[pair[1]] = pair[2];
      samples.push({ name: match[1], labels, value: parseFloat(match[4]) });
    }
    return samples;
  }
  function total(samples, name) {
    return samples.filter((s) => s.name === name).reduce((sum, s) => sum + s.value, 0);
  }
  function byLabel(samples, name, label) {
    const out = {};
    for (const s of samples) {
      if (s.name !== name || !(label in s.labels)) continue;
      out[s.labels[label]] = (out[s.labels[label]] || 0) + s.value;
    }
    const parts = Object.entries(out).filter(([, v]) => v > 0).map(([k, v]) => k + " " + v);
    return parts.length ? parts.join(", ") : "none";
  }
  function showMetrics(text) {
    const samples = parseMetrics(text);
    document.getElementById("t-paused").textContent = String(total(samples, "edge_llm_streams_paused"));
    document.getElementById("t-pauses").textContent = byLabel(
      samples,
      "edge_llm_backpressure_pauses_total",
      "cause"
    );
    document.getElementById("t-cancels").textContent = byLabel(
      samples,
      "edge_llm_cancellations_total",
      "reason"
    );
    document.getElementById("t-tokens").textContent = String(
      total(samples, "edge_llm_generated_tokens_total")
    );
  }
  function poll(path, period, show) {
    const status = document.getElementById("live-status");
    let count = 0;
    const tick = async () => {
      try {
        const response = await fetchWithKey(path);
        show(path === "/metrics" ? await response.text() : await response.json());
        count += 1;
        document.body.dataset[path === "/metrics" ? "metricsPolls" : "streamsPolls"] = String(count);
        status.textContent = "updated " + (/* @__PURE__ */ new Date()).toLocaleTimeString();
        status.classList.remove("error");
      } catch (error) {
        status.textContent = path + ": " + error.message;
        status.classList.add("error");
        if (keyPrompted) await keyPrompted;
      }
      setTimeout(tick, period);
    };
    tick();
  }
  async function main() {
    document.getElementById("key-dialog").addEventListener("cancel", (e) => e.preventDefault());
    document.getElementById("add-pane").addEventListener("click", addPane);
    document.getElementById("change-key").addEventListener("click", () => askForKey(""));
    addPane();
    addPane();
    await loadModel();
    poll("/debug/streams", STREAMS_POLL_MS, showStreams);
    poll("/metrics", METRICS_POLL_MS, showMetrics);
  }
  main();
})();
