// The stream's contract on scripted transports and a fake clock: retries and their
// timing, the TTFT time-outs, watermarks, cancel and resume.
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  OverloadedError, ReadError, RetryPolicy, ServerStreamError, StreamClient, TtftTimeoutError, loadClientConfig,
} from "../dist/index.js";
import { FakeClock, FakeSocket, chunk, flush, sseResponse } from "./helpers.mjs";

const HI = [{ role: "user", content: "Hi" }];
const config = (fields = {}) =>
  loadClientConfig({ edge_llm_client: { base_url: "http://engine:1", model_id: "m", api_key: "", ...fields } });

function recorder() {
  const events = [];
  return { events, onEvent: (e) => events.push(e), of: (name) => events.filter((e) => e.event === name) };
}

test("retry timing: a TTFT time-out, then the backoff, then a second attempt", async () => {
  const clock = new FakeClock();
  const calls = [];
  const answer = sseResponse();
  const fetch = (url, init) => {
    calls.push({ at: clock.now(), body: JSON.parse(init.body) });
    if (calls.length === 1) return new Promise((_, reject) => init.signal.addEventListener("abort", () => reject(init.signal.reason)));
    return Promise.resolve(answer.response);
  };
  const log = recorder();
  const warnings = [];
  const client = new StreamClient(config({ ttft_warn_ms: 300, ttft_hard_timeout_ms: 1000, retry: { backoff_ms: 500, retry_on: ["ttft_timeout"] } }),
    { fetch, clock, random: () => 0.5, onEvent: log.onEvent, warn: (m) => warnings.push(m) });
  const stream = client.stream(HI, { max_tokens: 8 });
  const texts = (async () => { const out = []; for await (const t of stream) out.push(t); return out; })();
  await clock.advance(299);
  assert.equal(warnings.length, 0);
  await clock.advance(1);
  assert.match(warnings[0], /no first token after 300 ms/);
  await clock.advance(700); // t = 1000: the hard time-out
  assert.deepEqual(log.of("cancel_sent").map((e) => e.reason), ["ttft_timeout"]);
  assert.deepEqual(log.of("retry").map((e) => [e.attempt, e.backoff_ms, e.cause]), [[2, 500, "ttft_timeout"]]);
  assert.equal(calls.length, 1);
  await clock.advance(499);
  assert.equal(calls.length, 1);
  await clock.advance(1);
  assert.deepEqual(calls.map((c) => c.at), [0, 1500]);
  assert.equal(calls[1].body.max_tokens, 8);
  answer.push(chunk("Hel") + chunk("lo", { finish_reason: "stop" }) + "data: [DONE]\n\n");
  answer.end();
  await clock.advance(1);
  assert.deepEqual(await texts, ["Hel", "lo"]);
  assert.equal(stream.result.attempts, 2);
  assert.equal(stream.result.finishReason, "stop");
  assert.equal(warnings.length, 1); // the second attempt's first token came at once
});

test("backoff doubles with jitter, takes Retry-After, is capped; 4xx and delivered text are never retried", () => {
  const retry = { maxAttempts: 5, backoffMs: 100, retryOn: ["overloaded", "ttft_timeout"], jitter: 0.2, maxBackoffMs: 1000 };
  const low = new RetryPolicy(retry, () => 0);
  assert.deepEqual([1, 2, 3, 4].map((n) => low.backoffMs(n)), [80, 160, 320, 640]);
  const high = new RetryPolicy(retry, () => 0.999999);
  assert.ok(Math.abs(high.backoffMs(4) - 960) < 0.01);
  assert.equal(high.backoffMs(5), 1000);
  const overloaded = new OverloadedError("busy", "queue_full", {}, 700);
  assert.deepEqual(low.decide(overloaded, 1, false), { nextAttempt: 2, delayMs: 700, cause: "overloaded" });
  const timeout = new TtftTimeoutError("slow", 1);
  assert.equal(low.decide(timeout, 1, true), null);
  assert.equal(low.decide(timeout, 5, false), null);
  assert.equal(low.decide(new ReadError("x"), 1, false), null);
});

test("a 503 with Retry-After waits that long, then the answer comes", async () => {
  const clock = new FakeClock();
  const calls = [];
  const fetch = () => {
    calls.push(clock.now());
    if (calls.length === 1) {
      return Promise.resolve(new Response(JSON.stringify({ error: { message: "full", code: "queue_full" } }), { status: 503, headers: { "Retry-After": "2" } }));
    }
    const ok = sseResponse();
    ok.push(chunk("ok", { finish_reason: "stop" }) + "data: [DONE]\n\n");
    ok.end();
    return Promise.resolve(ok.response);
  };
  const client = new StreamClient(config({ retry: { retry_on: ["queue_full"] } }), { fetch, clock, random: () => 0.5 });
  const done = client.complete(HI);
  await clock.advance(2000);
  const result = await done;
  assert.deepEqual(calls, [0, 2000]);
  assert.equal(result.text, "ok");
  assert.equal(result.attempts, 2);
});

test("a 400 is not retried and names the server's code", async () => {
  const fetch = async () => new Response(JSON.stringify({ error: { message: "too long", code: "prompt_too_long" } }), { status: 400 });
  const client = new StreamClient(config({ retry: { max_attempts: 3, retry_on: ["http_status"] } }), { fetch });
  await assert.rejects(client.complete(HI), (e) => e.code === "http_status" && e.status === 400 && e.serverCode === "prompt_too_long");
});

function wsClient(fields = {}, options = {}) {
  FakeSocket.all = [];
  const log = recorder();
  const client = new StreamClient(config({ ttft_warn_ms: 0, ...fields }), { WebSocket: FakeSocket, onEvent: log.onEvent, ...options });
  return { client, log };
}

test("WS: PAUSE on the push that reaches the high mark, RESUME at the low one, every token once", async () => {
  const { client, log } = wsClient({ render_queue_capacity: 10, api_key: "sk-é" });
  const stream = client.stream(HI, { transport: "ws" });
  stream.start();
  await flush();
  const ws = FakeSocket.last;
  assert.deepEqual(ws.protocols, ["edge-llm", "edge-llm.key.c2stw6k"]); // base64url("sk-é")
  assert.equal(ws.sent[0].type, "start");
  assert.equal(ws.sent[0].resumable, true);
  ws.serve({ type: "started", id: "chatcmpl-1", stream_id: "s1", n: 1 });
  for (let i = 0; i < 8; i++) {
    ws.serve({ type: "delta", id: "chatcmpl-1", text: `t${i}`, n_tokens: 1, n: i + 2 });
    await flush(2);
    // PAUSE goes out with the 8th token (ceil(0.8 * 10)), not a token later
    assert.equal(ws.types().includes("pause"), i === 7, `after token ${i}`);
  }
  ws.serve({ type: "paused", cause: "client", n: 10 });
  ws.serve({ type: "delta", id: "chatcmpl-1", text: "t8", n_tokens: 1, n: 11 }); // the step in flight
  await flush();
  assert.equal(stream.queue.length, 9);
  const got = [];
  for (let i = 0; i < 5; i++) got.push((await stream.next()).value);
  assert.ok(!ws.types().includes("resume"));
  got.push((await stream.next()).value); // 3 left = floor(0.3 * 10): at the low mark
  assert.deepEqual(ws.types(), ["start", "pause", "resume"]);
  ws.serve({ type: "resumed", n: 12 });
  ws.serve({ type: "delta", id: "chatcmpl-1", text: "t9", n_tokens: 1, n: 13 });
  ws.serve({ type: "done", id: "chatcmpl-1", finish_reason: "length", usage: { completion_tokens: 10 }, stats: { tokens_while_paused: 1 }, n: 14 });
  for await (const t of stream) got.push(t);
  assert.deepEqual(got, Array.from({ length: 10 }, (_, i) => `t${i}`));
  const r = stream.result;
  assert.deepEqual([r.nTokens, r.pauses, r.finishReason, r.requestId, r.streamId], [10, 1, "length", "chatcmpl-1", "s1"]);
  assert.deepEqual(r.serverPauses, ["client"]);
  assert.deepEqual(log.of("watermark_high").length, 1);
  assert.deepEqual(log.of("server_paused").map((e) => e.cause), ["client"]);
});

test("WS: the app's pause and the queue's are one hold; abort sends CANCEL and iteration throws", async () => {
  const { client, log } = wsClient({ render_queue_capacity: 4 });
  const abort = new AbortController();
  const stream = client.stream(HI, { transport: "ws", signal: abort.signal });
  stream.start();
  await flush();
  const ws = FakeSocket.last;
  stream.pause();
  stream.pause();
  ws.serve({ type: "started", id: "x" });
  for (let i = 0; i < 4; i++) ws.serve({ type: "delta", text: "a", n_tokens: 1 });
  await flush();
  assert.deepEqual(stream.heldBy.sort(), ["app", "queue"]);
  for (let i = 0; i < 4; i++) await stream.next();
  assert.deepEqual(stream.heldBy, ["app"]);
  stream.resume();
  assert.deepEqual(ws.types(), ["start", "pause", "resume"]);
  abort.abort();
  await assert.rejects(stream.next(), (e) => e.name === "AbortError");
  assert.deepEqual(ws.types(), ["start", "pause", "resume", "cancel"]);
  assert.deepEqual(log.of("cancel_sent").map((e) => [e.reason, e.method]), [["client", "frame"]]);
  assert.equal(ws.readyState, 3);
});

test("WS: a drop resumes on a new socket from the last frame taken, the pause told again", async () => {
  const clock = new FakeClock();
  const { client, log } = wsClient({}, { resumeDelayMs: 50, clock });
  const stream = client.stream(HI, { transport: "ws" });
  stream.start();
  await flush();
  const first = FakeSocket.last;
  first.serve({ type: "started", id: "c1", stream_id: "s1", n: 1 });
  first.serve({ type: "delta", text: "A", n_tokens: 1, n: 2 });
  stream.pause();
  first.close(1006); // the network dropped it
  await clock.advance(49);
  assert.equal(FakeSocket.last, first); // the first resume try comes after resumeDelayMs
  await clock.advance(1);
  const second = FakeSocket.last;
  assert.notEqual(second, first);
  assert.deepEqual(second.sent, [{ type: "resume", stream_id: "s1", last_event_id: 2 }, { type: "pause" }]);
  second.serve({ type: "delta", text: "A", n_tokens: 1, n: 2 }); // replayed: skipped
  second.serve({ type: "paused", cause: "disconnected", n: 3 });
  second.serve({ type: "delta", text: "B", n_tokens: 1, n: 4 });
  second.serve({ type: "done", finish_reason: "stop", n: 5 });
  stream.resume();
  const got = [];
  for await (const t of stream) got.push(t);
  assert.deepEqual(got, ["A", "B"]);
  assert.deepEqual(log.of("retry").map((e) => [e.cause, e.last_event]), [["resume", 2]]);
  assert.equal(stream.result.attempts, 1);
});

test("WS: a server error frame is a ServerStreamError with its code; a refused frame is not fatal", async () => {
  const { client } = wsClient();
  const stream = client.stream(HI, { transport: "ws" });
  stream.start();
  await flush();
  const ws = FakeSocket.last;
  ws.serve({ type: "error", code: "not_paused", message: "not paused" });
  ws.serve({ type: "delta", text: "x", n_tokens: 1 });
  ws.serve({ type: "error", code: "cancelled", reason: "superseded", message: "superseded" });
  assert.equal((await stream.next()).value, "x");
  await assert.rejects(stream.next(), (e) => e instanceof ServerStreamError && e.serverCode === "cancelled" && e.error.reason === "superseded");
});

test("WS: the TTFT hard time-out sends CANCEL, then the retry policy applies", async () => {
  const clock = new FakeClock();
  const { client, log } = wsClient({ ttft_hard_timeout_ms: 1, retry: { max_attempts: 2, backoff_ms: 10, retry_on: ["ttft_timeout"] } }, { clock, random: () => 0.5 });
  const done = client.complete(HI, { transport: "ws" });
  done.catch(() => undefined);
  await clock.advance(100);
  await assert.rejects(done, TtftTimeoutError);
  assert.equal(FakeSocket.all.length, 2);
  for (const ws of FakeSocket.all) assert.deepEqual(ws.types(), ["start", "cancel"]);
  assert.deepEqual(log.of("cancel_sent").map((e) => e.reason), ["ttft_timeout", "ttft_timeout"]);
});

test("WS: no frame for three heartbeat intervals is a dead connection", async () => {
  const clock = new FakeClock();
  const { client } = wsClient({ resumable: false, heartbeat_interval_ms: 100, ttft_hard_timeout_ms: 0 }, { clock });
  const done = client.complete(HI, { transport: "ws" });
  done.catch(() => undefined);
  await flush();
  FakeSocket.last.serve({ type: "heartbeat", state: "prefill", prefill_done: 1, prefill_total: 9 });
  await clock.advance(299);
  FakeSocket.last.serve({ type: "heartbeat", state: "prefill", prefill_done: 5, prefill_total: 9 });
  await clock.advance(299);
  await clock.advance(1);
  await assert.rejects(done, (e) => e.code === "dead_connection");
});

test("SSE: the body is not read while held; a break cancels the request", async () => {
  const answer = sseResponse();
  let signal;
  const fetch = async (url, init) => {
    signal = init.signal;
    return answer.response;
  };
  const log = recorder();
  const client = new StreamClient(config({ render_queue_capacity: 4 }), { fetch, onEvent: log.onEvent });
  const stream = client.stream(HI);
  stream.start();
  for (let i = 0; i < 8; i++) answer.push(chunk(`t${i}`));
  await flush();
  assert.equal(stream.queue.length, 4); // full: the reader waits, the body is not read
  assert.deepEqual(stream.heldBy, ["queue"]);
  assert.equal(log.of("read_paused").length, 1);
  const got = [];
  for await (const t of stream) {
    got.push(t);
    if (got.length === 6) break;
  }
  assert.deepEqual(got, ["t0", "t1", "t2", "t3", "t4", "t5"]);
  assert.equal(log.of("read_resumed").length, 1);
  assert.ok(signal.aborted);
  assert.deepEqual(log.of("cancel_sent").map((e) => [e.reason, e.method]), [["client", "close"]]);
});

test("SSE: giving up a resumable stream (break, the TTFT time-out before its headers) DELETEs it", async () => {
  const clock = new FakeClock();
  const requests = [];
  let answer;
  let headers; // the POST's response, held back until the test lets it go
  const fetch = (url, init) => {
    requests.push([init.method, url, init.headers.Authorization ?? null]);
    if (init.method === "DELETE") return Promise.resolve(new Response("{}", { status: 200 }));
    answer = sseResponse({ headers: { "X-Stream-Id": `s${requests.length}` } });
    return new Promise((resolve) => (headers = () => resolve(answer.response)));
  };
  const log = recorder();
  const client = new StreamClient(config({ api_key: "k", ttft_hard_timeout_ms: 100, retry: { max_attempts: 1 } }), { fetch, clock, onEvent: log.onEvent });
  const stream = client.stream(HI);
  stream.start();
  await clock.advance(1);
  headers();
  answer.push(`id: s1.1\n${chunk("A")}`);
  for await (const t of stream) if (t === "A") break;
  await clock.advance(1);
  const late = client.complete(HI);
  late.catch(() => undefined);
  await clock.advance(100); // the hard time-out: no headers yet, so no id yet
  await assert.rejects(late, TtftTimeoutError); // at once: the DELETE waits for the id, not the caller
  assert.equal(requests.length, 3);
  headers(); // admission: the id arrives, the DELETE follows
  await flush();
  assert.deepEqual(requests, [
    ["POST", "http://engine:1/v1/chat/completions", "Bearer k"],
    ["DELETE", "http://engine:1/v1/streams/s1", "Bearer k"],
    ["POST", "http://engine:1/v1/chat/completions", "Bearer k"],
    ["DELETE", "http://engine:1/v1/streams/s3", "Bearer k"],
  ]);
  assert.deepEqual(log.of("cancel_sent").map((e) => [e.reason, e.method]), [["client", "delete"], ["ttft_timeout", "delete"]]);
});

test("SSE: a drop mid-stream resumes with Last-Event-ID; replayed events are skipped", async () => {
  const first = sseResponse({ headers: { "X-Stream-Id": "s9" } });
  const second = sseResponse();
  const requests = [];
  const fetch = async (url, init) => {
    requests.push([init.method, url, init.headers["Last-Event-ID"]]);
    return requests.length === 1 ? first.response : second.response;
  };
  const client = new StreamClient(config(), { fetch });
  const done = client.complete(HI);
  first.push(`id: s9.1\n${chunk("A")}id: s9.2\n${chunk("B")}`);
  await flush();
  first.end(); // ends before [DONE]: a drop
  await flush();
  second.push(`id: s9.2\n${chunk("B")}id: s9.3\n${chunk("C", { finish_reason: "stop" })}id: s9.4\ndata: [DONE]\n\n`);
  second.end();
  const result = await done;
  assert.equal(result.text, "ABC");
  assert.deepEqual(requests, [
    ["POST", "http://engine:1/v1/chat/completions", undefined],
    ["GET", "http://engine:1/v1/streams/s9", "s9.2"],
  ]);
});

test("SSE: a server that refuses the resumable option is asked again without it", async () => {
  const bodies = [];
  const fetch = async (url, init) => {
    bodies.push(JSON.parse(init.body));
    if (bodies.length === 1) {
      return new Response(JSON.stringify({ error: { message: "unknown field", param: "stream_options.resumable" } }), { status: 400 });
    }
    const ok = sseResponse();
    ok.push(chunk("fine", { finish_reason: "stop" }) + "data: [DONE]\n\n");
    ok.end();
    return ok.response;
  };
  const result = await new StreamClient(config(), { fetch }).complete(HI);
  assert.equal(result.text, "fine");
  assert.deepEqual(bodies.map((b) => b.stream_options), [{ include_usage: true, resumable: true }, { include_usage: true }]);
});

test("without a WebSocket the error says what to pass", async () => {
  const saved = globalThis.WebSocket;
  delete globalThis.WebSocket;
  try {
    const client = new StreamClient(config());
    await assert.rejects(client.complete(HI, { transport: "ws" }), /pass \{ WebSocket \}.*--experimental-websocket/);
  } finally {
    if (saved) globalThis.WebSocket = saved;
  }
});

test("SSE: dropConnection() aborts the body and the stream resumes from the last event", async () => {
  const first = sseResponse({ headers: { "X-Stream-Id": "s5" } });
  const second = sseResponse();
  const requests = [];
  const fetch = async (url, init) => {
    requests.push(init.headers["Last-Event-ID"] ?? null);
    if (requests.length === 1) {
      init.signal.addEventListener("abort", () => first.fail(new DOMException("aborted", "AbortError")));
      return first.response;
    }
    return second.response;
  };
  const clock = new FakeClock();
  const client = new StreamClient(config(), { fetch, clock, resumeDelayMs: 50 });
  const stream = client.stream(HI);
  first.push(`id: s5.1\n${chunk("A")}`);
  assert.equal((await stream.next()).value, "A");
  stream.dropConnection();
  await clock.advance(49);
  assert.deepEqual(requests, [null]);
  await clock.advance(1);
  second.push(`id: s5.2\n${chunk("B", { finish_reason: "stop" })}id: s5.3\ndata: [DONE]\n\n`);
  second.end();
  const rest = [];
  for await (const t of stream) rest.push(t);
  assert.deepEqual(rest, ["B"]);
  assert.deepEqual(requests, [null, "s5.1"]);
});

test("SSE: after a ping, silence for three heartbeat intervals is a dead connection", async () => {
  const clock = new FakeClock();
  const answer = sseResponse();
  const beats = [];
  const client = new StreamClient(config({ resumable: false, heartbeat_interval_ms: 100, ttft_hard_timeout_ms: 0, ttft_warn_ms: 0 }), {
    fetch: async () => answer.response, clock,
  });
  const done = client.complete(HI, { onHeartbeat: (b) => beats.push(b) });
  done.catch(() => undefined);
  await clock.advance(1000); // no ping yet: a plain server may be silent in prefill
  answer.push(": ping\n\n");
  await clock.advance(299);
  await clock.advance(1);
  await assert.rejects(done, (e) => e.code === "dead_connection");
  assert.equal(beats.length, 1);
});

test("SSE: a fetch without streamed bodies (React Native) says to use the WebSocket", async () => {
  const fetch = async () => ({ status: 200, headers: new Headers({ "Content-Type": "text/event-stream" }), body: null });
  const client = new StreamClient(config(), { fetch });
  await assert.rejects(client.complete(HI), (e) => e.code === "not_streaming" && /use transport "ws"/.test(e.message));
});
