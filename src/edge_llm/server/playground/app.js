// edge-llm playground: chat panes over the WebSocket protocol (/v1/stream) and a
// live view of /debug/streams and /metrics. Plain JavaScript, no build step, no
// other origin. Model text is only ever inserted as text, never as HTML.
"use strict";

const RENDER_QUEUE_CAPACITY = 32; // chunks, like the SDK's render_queue_capacity
const HIGH_WATERMARK = 0.8; // render_queue_high_watermark: send PAUSE
const LOW_WATERMARK = 0.3; // render_queue_low_watermark: send RESUME
const STREAMS_POLL_MS = 500;
const METRICS_POLL_MS = 1000;
const MAX_LOG_LINES = 200;
const RESUME_AFTER_MS = 1000; // "Drop the connection": how long the stream shows detached
const KEY_STORAGE = "edge-llm-playground-key";
// Error frames about one bad client frame; the stream itself goes on.
const PROTOCOL_ERRORS = new Set([
  "invalid_frame", "unknown_frame_type", "no_active_stream",
  "already_paused", "not_paused", "stream_active",
]);

// ---------------------------------------------------------------------------
// Render queue: the SDK's RenderQueue (client/render_queue.py) in JavaScript.
// push() returns "high" once when the queue reaches the high mark; pop()
// returns "low" once when it drains to the low mark after that (hysteresis).

class RenderQueue {
  constructor(capacity, highFraction, lowFraction) {
    this.capacity = capacity;
    this.highMark = Math.max(1, Math.ceil(highFraction * capacity));
    this.lowMark = Math.floor(lowFraction * capacity);
    this.aboveHigh = false;
    this.items = [];
  }

  get length() {
    return this.items.length;
  }

  push(item) {
    // A browser cannot stop reading a WebSocket, so chunks already in flight
    // when PAUSE was sent still arrive: the queue may pass its capacity by
    // those few (the engine stops within one token; max_tokens bounds it).
    this.items.push(item);
    if (!this.aboveHigh && this.items.length >= this.highMark) {
      this.aboveHigh = true;
      return "high";
    }
    return null;
  }

  pop() {
    const item = this.items.shift();
    if (this.aboveHigh && this.items.length <= this.lowMark) {
      this.aboveHigh = false;
      return [item, "low"];
    }
    return [item, null];
  }
}

// ---------------------------------------------------------------------------
// Authentication: the page asks for a key when the server answers 401.

const auth = {
  key: sessionStorage.getItem(KEY_STORAGE) || "",

  headers() {
    return this.key ? { Authorization: "Bearer " + this.key } : {};
  },

  // Browsers cannot set headers on a WebSocket: the key travels as a
  // subprotocol (base64url, so any key is a valid token); the server answers
  // with the plain "edge-llm" subprotocol, never echoing the key.
  subprotocols() {
    if (!this.key) return ["edge-llm"];
    const bytes = new TextEncoder().encode(this.key);
    let binary = "";
    for (const b of bytes) binary += String.fromCharCode(b);
    const encoded = btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
    return ["edge-llm", "edge-llm.key." + encoded];
  },

  set(key) {
    this.key = key.trim();
    sessionStorage.setItem(KEY_STORAGE, this.key);
  },
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

let keyPrompted = null;

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
        { once: true },
      );
    });
  }
  return keyPrompted;
}

async function loadModel() {
  for (;;) {
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

// ---------------------------------------------------------------------------
// A chat pane: one WebSocket per run, a render queue drained at the chosen speed.

let paneCount = 0;

function randomId() {
  return Math.random().toString(36).slice(2, 8);
}

function socketUrl() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return scheme + "//" + location.host + "/v1/stream";
}

class Run {
  // One stream: its socket, its render queue and what the engine said about it.
  constructor(request) {
    this.request = request;
    this.ws = null;
    this.id = null;
    this.queue = new RenderQueue(RENDER_QUEUE_CAPACITY, HIGH_WATERMARK, LOW_WATERMARK);
    this.received = 0; // tokens received
    this.rendered = 0; // chunks rendered
    this.pausedBy = new Set(); // "user" and/or "queue": PAUSE is sent while non-empty
    this.serverPause = null; // cause from the last paused frame
    this.finished = false;
    this.startedAt = performance.now();
    this.firstTokenMs = null;
    this.maxQueue = 0;
    this.streamId = null; // the resumable stream's id (started frame)
    this.lastN = 0; // the number of the last frame taken: a resume asks for what follows
  }
}

class Pane {
  constructor(root) {
    this.index = paneCount++;
    this.root = root;
    this.run = null;
    this.lastRequest = null;
    this.renderTimer = null;
    this.el = {};
    for (const node of root.querySelectorAll("[data-role]")) this.el[node.dataset.role] = node;
    root.dataset.pane = String(this.index);
    root.querySelector(".pane-title").textContent = "Pane " + (this.index + 1);
    this.el.session.value = "pane" + (this.index + 1) + "-" + randomId();
    this.el.send.addEventListener("click", () => this.send());
    this.el.regenerate.addEventListener("click", () => this.regenerate());
    this.el.pause.addEventListener("click", () => this.setPaused("user", true));
    this.el.resume.addEventListener("click", () => this.setPaused("user", false));
    this.el.cancel.addEventListener("click", () => this.sendFrame({ type: "cancel" }));
    this.el.drop.addEventListener("click", () => this.dropConnection());
    this.el["render-speed"].addEventListener("change", () => this.scheduleRender());
    this.el.close.addEventListener("click", () => this.close());
    this.el.prompt.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) this.send();
    });
    const marks = root.querySelectorAll(".queue .mark");
    const queue = new RenderQueue(RENDER_QUEUE_CAPACITY, HIGH_WATERMARK, LOW_WATERMARK);
    marks[0].style.left = (100 * queue.highMark) / queue.capacity + "%";
    marks[1].style.left = (100 * queue.lowMark) / queue.capacity + "%";
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
      user: this.el.session.value.trim() || undefined,
      // Its class (lower first); empty: the server's default for this key or route.
      priority: Number.isFinite(priority) ? priority : undefined,
      // A heartbeat at each change of state too (queued, prefill, preempted).
      return_progress: true,
    };
  }

  send() {
    this.lastRequest = this.buildRequest();
    this.open(this.lastRequest);
  }

  regenerate() {
    // Like a user hammering "regenerate": a new connection, same session. The
    // engine cancels the previous stream (reason superseded) and the old
    // socket is told so; this pane follows only the newest.
    const request = this.lastRequest || this.buildRequest();
    request.user = this.el.session.value.trim() || request.user;
    this.lastRequest = request;
    this.open(request);
  }

  open(request) {
    // A previous run keeps its socket until the engine ends it (superseded,
    // for a regenerate): onFrame reports that and closes it.
    this.el.output.textContent = "";
    this.el.stats.textContent = "";
    const run = new Run(request);
    this.run = run;
    this.root.dataset.streamId = "";
    this.setState("connecting");
    // Resumable: a dropped socket detaches the stream, and a new one takes it up.
    if (this.connect(run, { type: "start", request, resumable: true }, "> start")) {
      this.scheduleRender();
    }
  }

  connect(run, opening, note) {
    // A new socket for the run that sends `opening` once open; false if none opens.
    let ws;
    try {
      ws = new WebSocket(socketUrl(), auth.subprotocols());
    } catch (error) {
      this.fail("cannot open socket: " + error.message);
      return false;
    }
    run.ws = ws;
    ws.addEventListener("open", () => {
      this.log(run, note);
      ws.send(JSON.stringify(opening));
    });
    ws.addEventListener("message", (event) => this.onNumbered(run, JSON.parse(event.data)));
    ws.addEventListener("close", (event) => {
      if (!run.finished && run === this.run && run.ws === ws) {
        const why = event.code === 1006 ? " (refused: API key or origin?)" : "";
        this.fail("socket closed " + event.code + why);
      }
    });
    return true;
  }

  onNumbered(run, frame) {
    // A resumed stream's frames carry n: one taken before the drop is not shown twice.
    if (typeof frame.n === "number") {
      if (frame.n <= run.lastN) return;
      run.lastN = frame.n;
    }
    this.onFrame(run, frame);
  }

  dropConnection() {
    // What a network drop does: the socket goes without a word. The engine pauses
    // the stream (cause disconnected, KV kept); a moment later a new socket resumes
    // it with the number of the last frame taken, and the text goes on.
    const run = this.run;
    if (!run || run.finished || !run.streamId || !run.ws) return;
    const old = run.ws;
    run.ws = null;
    old.close();
    this.root.dataset.drops = String(parseInt(this.root.dataset.drops || "0", 10) + 1);
    this.log(run, "connection dropped: the stream is detached");
    this.setState("detached");
    this.updateControls();
    setTimeout(() => this.reattach(run), RESUME_AFTER_MS);
  }

  reattach(run) {
    if (run !== this.run || run.finished) return;
    const resume = { type: "resume", stream_id: run.streamId, last_event_id: run.lastN };
    if (this.connect(run, resume, "> resume after frame " + run.lastN)) {
      run.ws.addEventListener("open", () => {
        // The server starts the new socket unpaused: a pause still held is sent again.
        if (run.pausedBy.size > 0) this.sendFrame({ type: "pause" });
        this.updateControls();
      });
    }
  }

  onFrame(run, frame) {
    if (run !== this.run) {
      // A superseded or replaced run: report how it ended, nothing else.
      if (frame.type === "error" || frame.type === "done") {
        run.finished = true;
        const reason = frame.reason || frame.code || frame.finish_reason;
        this.log(run, "previous stream " + (run.id || "") + " ended: " + reason);
        run.ws.close();
      }
      return;
    }
    switch (frame.type) {
      case "started":
        run.id = frame.id;
        run.streamId = frame.stream_id || null;
        this.updateControls();
        this.root.dataset.streamId = frame.id;
        this.log(run, "started " + frame.id);
        this.setState("queued");
        break;
      case "heartbeat":
        if (!run.serverPause) this.setState(frame.state);
        if (run.firstTokenMs === null) this.el.stats.textContent = progressText(frame);
        break;
      case "delta":
        this.onDelta(run, frame);
        break;
      case "paused":
        run.serverPause = frame.cause;
        this.root.dataset.pauseCause = frame.cause;
        this.log(run, "paused (" + frame.cause + ")");
        // Preempted: a more urgent request took the slot; it resumes by itself.
        this.setState(frame.cause === "preempted" ? "preempted" : "paused");
        break;
      case "resumed":
        run.serverPause = null;
        this.root.dataset.pauseCause = "";
        this.log(run, "resumed");
        this.setState("decoding");
        break;
      case "done":
        run.finished = true;
        this.log(run, "done: " + frame.finish_reason);
        this.showDone(run, frame);
        run.ws.close();
        this.setState("done");
        break;
      case "error":
        this.onError(run, frame);
        break;
      default:
        this.log(run, "frame " + frame.type);
    }
  }

  onDelta(run, frame) {
    if (run.firstTokenMs === null) {
      run.firstTokenMs = performance.now() - run.startedAt;
      this.el.stats.textContent = "first token after " + Math.round(run.firstTokenMs) + " ms";
    }
    run.received += frame.n_tokens;
    this.root.dataset.received = String(run.received);
    if (!run.serverPause) this.setState("decoding");
    if (run.queue.push(frame.text) === "high") {
      this.log(run, "render queue at high watermark: PAUSE");
      this.setPaused("queue", true);
    }
    run.maxQueue = Math.max(run.maxQueue, run.queue.length);
    this.scheduleRender();
    this.showQueue();
  }

  onError(run, frame) {
    // A cancel (the user's own, a regenerate's supersede, a timeout) is how the
    // stream ended, not a failure: it is logged as such.
    const cancelled = frame.code === "cancelled";
    const reason = frame.reason ? " (" + frame.reason + ")" : "";
    const failure = "error " + frame.code + reason + ": " + frame.message;
    this.log(run, cancelled ? "cancelled" + reason : failure);
    if (PROTOCOL_ERRORS.has(frame.code)) return; // the stream goes on
    run.finished = true;
    run.ws.close();
    this.setState(cancelled ? "cancelled" : "error");
    this.el.stats.textContent = cancelled
      ? "cancelled (" + (frame.reason || "client") + "), KV freed"
      : frame.code + ": " + frame.message;
  }

  fail(message) {
    if (this.run) this.run.finished = true;
    this.setState("error");
    this.el.stats.textContent = message;
    this.log(this.run, message);
  }

  // Pause/resume have two sources, the user's button and the render queue;
  // the engine is paused while either holds, resumed when both let go.
  setPaused(source, on) {
    const run = this.run;
    if (!run || run.finished || !run.ws || run.ws.readyState !== WebSocket.OPEN) return;
    const wasPaused = run.pausedBy.size > 0;
    if (on) run.pausedBy.add(source);
    else run.pausedBy.delete(source);
    const isPaused = run.pausedBy.size > 0;
    this.root.dataset.pausedBy = [...run.pausedBy].join(" ");
    if (isPaused !== wasPaused) this.sendFrame({ type: isPaused ? "pause" : "resume" });
    this.updateControls();
  }

  sendFrame(frame) {
    const run = this.run;
    if (!run || run.finished || !run.ws || run.ws.readyState !== WebSocket.OPEN) return;
    this.log(run, "> " + frame.type);
    run.ws.send(JSON.stringify(frame));
  }

  // Chunks per second; Infinity renders at once, 0 is a stalled renderer.
  renderSpeed() {
    const value = this.el["render-speed"].value;
    return value === "instant" ? Infinity : parseFloat(value) || 0;
  }

  // The renderer: one chunk per 1/speed seconds, like a UI that cannot keep up
  // with the engine; instant drains the queue at once, stalled renders nothing.
  scheduleRender() {
    const speed = this.renderSpeed();
    if (this.renderTimer !== null || speed === 0) return;
    this.renderTimer = setTimeout(() => {
      this.renderTimer = null;
      this.renderSome();
    }, speed === Infinity ? 0 : 1000 / speed);
  }

  renderSome() {
    const run = this.run;
    if (!run) return;
    const count = this.renderSpeed() === Infinity ? run.queue.length : 1;
    for (let i = 0; i < count && run.queue.length > 0; i++) {
      const [text, mark] = run.queue.pop();
      this.el.output.append(text);
      run.rendered += 1;
      if (mark === "low") {
        this.log(run, "render queue at low watermark: RESUME");
        this.setPaused("queue", false);
      }
    }
    this.root.dataset.rendered = String(run.rendered);
    this.root.dataset.queued = String(run.queue.length);
    this.showQueue();
    if (run.queue.length > 0) this.scheduleRender();
    else if (run.finished) this.root.dataset.complete = "true";
  }

  showQueue() {
    const length = this.run ? this.run.queue.length : 0;
    const fill = Math.min(1, length / RENDER_QUEUE_CAPACITY);
    this.el["queue-fill"].style.width = 100 * fill + "%";
    this.el["queue-fill"].classList.toggle("hot", this.run && this.run.queue.aboveHigh);
    this.el["queue-text"].textContent = "queue " + length + "/" + RENDER_QUEUE_CAPACITY;
  }

  showDone(run, frame) {
    const s = frame.stats || {};
    const usage = frame.usage || {};
    const parts = [
      frame.finish_reason,
      (usage.completion_tokens ?? run.received) + " tokens",
      "TTFT " + (s.ttft_ms != null ? Math.round(s.ttft_ms) + " ms" : "–"),
      "pauses " + (s.pauses ?? 0) + " (" + Math.round(s.paused_ms || 0) + " ms)",
      "tokens after pause " + (s.tokens_while_paused ?? 0),
    ];
    const cached = usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens;
    if (cached) parts.push("cached prompt " + cached);
    this.el.stats.textContent = parts.join(" · ");
    this.root.dataset.pauses = String(s.pauses ?? 0);
    if (run.queue.length === 0) this.root.dataset.complete = "true";
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
    this.el.pause.disabled = !live || (run && run.pausedBy.has("user"));
    this.el.resume.disabled = !live || !(run && run.pausedBy.has("user"));
    this.el.cancel.disabled = !live;
    this.el.drop.disabled = !live || !run.streamId || !run.ws;
    this.el.regenerate.disabled = !this.lastRequest;
  }

  log(run, text) {
    const item = document.createElement("li");
    const t = run ? ((performance.now() - run.startedAt) / 1000).toFixed(2) + "s " : "";
    item.textContent = t + text;
    this.el.log.prepend(item);
    while (this.el.log.childElementCount > MAX_LOG_LINES) this.el.log.lastElementChild.remove();
  }

  close() {
    const run = this.run;
    if (run && run.ws && run.ws.readyState <= WebSocket.OPEN) run.ws.close(); // engine: disconnect
    this.root.remove();
  }
}

function ordinal(n) {
  const teen = n % 100 >= 10 && n % 100 <= 20;
  return n + (teen ? "th" : { 1: "st", 2: "nd", 3: "rd" }[n % 10] || "th");
}

// A heartbeat before the first token: where the request stands, as `edge-llm chat` says it.
function progressText(frame) {
  const wait = frame.predicted_wait_ms == null ? "" : ", ~" + (frame.predicted_wait_ms / 1000).toFixed(1) + " s";
  if (frame.state === "queued") {
    return "queued" + (frame.queue_position == null ? "" : " " + ordinal(frame.queue_position)) + wait;
  }
  if (frame.state === "preempted") return "preempted by a more urgent request";
  return frame.state + ": " + frame.prefill_done + "/" + frame.prefill_total + " prompt tokens" + wait;
}

function addPane() {
  const template = document.getElementById("pane-template");
  const root = template.content.firstElementChild.cloneNode(true);
  document.getElementById("panes").append(root);
  return new Pane(root);
}

// ---------------------------------------------------------------------------
// Live panel: /debug/streams every STREAMS_POLL_MS, /metrics every METRICS_POLL_MS.

const MIB = 1024 * 1024;

// MiB with one decimal, a half rounded up: edge_llm.observability.units.mib,
// so the serve banner, `edge-llm top` and this page print the same digits.
function mib(bytes) {
  return (Math.floor((bytes / MIB) * 10 + 0.5) / 10).toFixed(1);
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
  fill.style.width = (100 * held) / Math.max(1, stream.ring_capacity) + "%";
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
    cell(end),
  );
  tr.cells[2].dataset.col = "state";
  tr.title = stream.id;
  return tr;
}

// The class, and how often the stream was preempted ("5 ×2"); "–" when relayed.
function priorityText(stream) {
  if (stream.priority == null) return "–";
  return stream.preemptions ? stream.priority + " ×" + stream.preemptions : String(stream.priority);
}

const LIVE_ORDER = { decoding: 0, prefill: 1, paused: 2, preempted: 3, offloaded: 4, queued: 5 };

function showStreams(doc) {
  const used = doc.kv_used_bytes;
  const budget = doc.kv_budget_bytes;
  const kvText = document.getElementById("kv-text");
  kvText.textContent = mib(used) + " / " + mib(budget) + " MiB";
  kvText.dataset.kvUsed = String(used);
  kvText.dataset.kvBudget = String(budget);
  document.getElementById("kv-bar").style.width = (100 * used) / Math.max(1, budget) + "%";
  document.getElementById("t-running").textContent = String(doc.requests_running);
  document.getElementById("t-waiting").textContent = String(doc.requests_waiting);
  const streams = [...doc.streams].sort(
    (a, b) => (LIVE_ORDER[a.state] ?? 9) - (LIVE_ORDER[b.state] ?? 9) || a.age_ms - b.age_ms,
  );
  const tbody = document.querySelector("#streams tbody");
  tbody.replaceChildren(...streams.map(streamRow));
}

// Prometheus text: sum each metric over its labels, or keep one label's values.
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
  const parts = Object.entries(out)
    .filter(([, v]) => v > 0)
    .map(([k, v]) => k + " " + v);
  return parts.length ? parts.join(", ") : "none";
}

function showMetrics(text) {
  const samples = parseMetrics(text);
  document.getElementById("t-paused").textContent = String(total(samples, "edge_llm_streams_paused"));
  document.getElementById("t-pauses").textContent = byLabel(
    samples, "edge_llm_backpressure_pauses_total", "cause");
  document.getElementById("t-cancels").textContent = byLabel(
    samples, "edge_llm_cancellations_total", "reason");
  document.getElementById("t-tokens").textContent = String(
    total(samples, "edge_llm_generated_tokens_total"));
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
      status.textContent = "updated " + new Date().toLocaleTimeString();
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

// ---------------------------------------------------------------------------

async function main() {
  // The key dialog stays until a key is given (Escape would leave the page stuck).
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
