// edge-llm playground: chat panes that stream with @edge-llm/client over the WebSocket
// protocol (/v1/stream), and a live view of /debug/streams and /metrics. The SDK does
// the protocol (frames, render queue, PAUSE/RESUME, CANCEL, resume after a drop); this
// page renders, and shows what the SDK and the engine did. Bundled by esbuild into
// src/edge_llm/server/playground/app.js (`npm run bundle` in clients/js). Model text is
// only ever inserted as text, never as HTML.
import { RenderQueue, StreamClient, loadClientConfig } from "../src/index.ts";

const STREAMS_POLL_MS = 500;
const METRICS_POLL_MS = 1000;
const MAX_LOG_LINES = 200;
const RESUME_AFTER_MS = 1000; // "Drop the connection": how long the stream shows detached
const KEY_STORAGE = "edge-llm-playground-key";
// The SDK's configuration for the page: the seed's defaults (render queue of 32, PAUSE
// at 0.8, RESUME at 0.3), one attempt (a retry is the user's Regenerate), no client
// TTFT time-out (the engine has its own), and patience with heartbeats on a loaded host.
const PAGE_CONFIG = {
  ttft_hard_timeout_ms: 0,
  dead_after_heartbeats: 10,
  retry: { max_attempts: 1 },
};

// ---------------------------------------------------------------------------
// Authentication: the page asks for a key when the server answers 401.

const auth = {
  key: sessionStorage.getItem(KEY_STORAGE) || "",

  headers() {
    return this.key ? { Authorization: "Bearer " + this.key } : {};
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
// A chat pane: one SDK stream per run, rendered at the chosen speed.

let paneCount = 0;

function randomId() {
  return Math.random().toString(36).slice(2, 8);
}

function newClient() {
  const config = loadClientConfig(undefined, {
    overrides: { ...PAGE_CONFIG, base_url: location.origin + "/v1", api_key: auth.key },
  });
  return new StreamClient(config, { resumeDelayMs: RESUME_AFTER_MS });
}

class Run {
  // One stream and what the engine said about it.
  constructor(request) {
    this.request = request;
    this.stream = null;
    this.id = null;
    this.received = 0; // tokens received
    this.rendered = 0; // chunks rendered
    this.serverPause = null; // cause from the last paused frame
    this.finished = false;
    this.startedAt = performance.now();
    this.firstTokenMs = null;
  }
}

class Pane {
  constructor(root) {
    this.index = paneCount++;
    this.root = root;
    this.run = null;
    this.lastRequest = null;
    this.speedChanged = null; // wakes a stalled or waiting renderer
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
    marks[0].style.left = (100 * high) / 32 + "%";
    marks[1].style.left = (100 * low) / 32 + "%";
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
      session: this.el.session.value.trim() || undefined,
      // Its class (lower first); empty: the server's default for this key or route.
      priority: Number.isFinite(priority) ? priority : undefined,
    };
  }

  send() {
    this.lastRequest = this.buildRequest();
    this.open(this.lastRequest);
  }

  regenerate() {
    // Like a user hammering "regenerate": a new stream, same session. The engine
    // cancels the previous one (reason superseded), whose end is logged; this pane
    // follows only the newest.
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
      progress: true, // a heartbeat at each change of state too (queued, prefill, preempted)
      onEvent: (event) => this.onEvent(run, event),
      onHeartbeat: (beat) => this.onHeartbeat(run, beat),
      onTtftWarn: (ms) => this.log(run, "no first token after " + ms + " ms (ttft_warn_ms)"),
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
      // How it ended is shown from the SDK's end and error events.
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
      const timer = speed === Infinity ? null : speed > 0 ? setTimeout(done, 1000 / speed) : null;
      const pane = this;
      function done() {
        clearTimeout(timer);
        pane.speedChanged = null;
        resolve();
      }
      if (speed === Infinity || run.finished || run !== this.run) return done();
      this.speedChanged = done; // a new speed takes effect at once
    });
  }

  onEvent(run, event) {
    if (run !== this.run) {
      // A superseded or replaced run: report how it ended, nothing else.
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
        // Preempted: a more urgent request took the slot; it resumes by itself.
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
    // The engine's own cancel (a supersede, a timeout) is how the stream ended.
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
    // What a network drop does: the socket goes without a word. The engine pauses the
    // stream (cause disconnected, KV kept); a moment later the SDK opens a new socket
    // that resumes it from the last frame taken, and the text goes on.
    const run = this.run;
    if (!run || run.finished || !run.stream.streamId) return;
    run.stream.dropConnection();
    this.root.dataset.drops = String(parseInt(this.root.dataset.drops || "0", 10) + 1);
    this.log(run, "connection dropped: the stream is detached");
    this.setState("detached");
  }

  showHeld(run) {
    if (run !== this.run) return;
    const held = run.stream.heldBy.map((source) => (source === "app" ? "user" : source));
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
      "tokens after pause " + (s.tokens_while_paused ?? 0),
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
    const t = run ? ((performance.now() - run.startedAt) / 1000).toFixed(2) + "s " : "";
    item.textContent = t + text;
    this.el.log.prepend(item);
    while (this.el.log.childElementCount > MAX_LOG_LINES) this.el.log.lastElementChild.remove();
  }

  close() {
    const run = this.run;
    if (run && !run.finished) run.stream.cancel(); // the engine frees it at once
    this.root.remove();
  }
}

function ordinal(n) {
  const teen = n % 100 >= 10 && n % 100 <= 20;
  return n + (teen ? "th" : { 1: "st", 2: "nd", 3: "rd" }[n % 10] || "th");
}

// A heartbeat before the first token: where the request stands, as `edge-llm chat` says it.
function progressText(beat) {
  const wait = beat.predictedWaitMs == null ? "" : ", ~" + (beat.predictedWaitMs / 1000).toFixed(1) + " s";
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
