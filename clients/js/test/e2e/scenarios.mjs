// The e2e scenarios against a real engine, run by tests/e2e/test_js_client_engine.py from
// a fresh Node project that installed the packed package (so this is also the check that
// `import { StreamClient, loadClientConfig } from "@edge-llm/client"` works as published).
// Usage: node scenarios.mjs NAME '{"base_url": ...}'; prints one JSON line.
import { StreamClient, TtftTimeoutError, loadClientConfig } from "@edge-llm/client";

const STORY = [{ role: "user", content: "Write a long story about a dragon who learns to bake." }];
const [name, argText] = process.argv.slice(2);
const args = JSON.parse(argText);

function client(fields, events = [], notify = () => undefined) {
  const config = loadClientConfig({
    edge_llm_client: { base_url: args.base_url, model_id: args.model_id, api_key: "", ttft_warn_ms: 0, ttft_hard_timeout_ms: 120000, ...fields },
  });
  return new StreamClient(config, { onEvent: (e) => (events.push(e), notify(e)) });
}

const scenarios = {
  // A renderer that does not take a token until the SDK reports the hold (SSE: the high
  // watermark, reading stopped; WS: the server's `paused` answer to the PAUSE), then
  // drains: the queue fills whatever the machine's speed, so the SDK must hold the
  // stream and let it go at the low mark.
  async slow() {
    const request = { max_tokens: args.max_tokens, temperature: 0, extra_body: { ignore_eos: true } };
    const reference = await client({}).complete(STORY, { ...request, transport: args.transport });
    const events = [];
    let highReached;
    const high = new Promise((resolve) => (highReached = resolve)); // or the stream ended without it
    const held = args.transport === "ws" ? "server_paused" : "watermark_high";
    const notify = (e) => [held, "end", "error"].includes(e.event) && highReached();
    const stream = client({ render_queue_capacity: args.capacity }, events, notify)
      .stream(STORY, { ...request, transport: args.transport });
    stream.start();
    await high;
    const texts = [];
    for await (const text of stream) texts.push(text);
    const queueAtPause = events.filter((e) => e.event === "watermark_high").map((e) => e.queue_len);
    return {
      text: texts.join(""), reference: reference.text, n_tokens: stream.result.nTokens,
      pauses: stream.result.pauses, server_stats: stream.result.serverStats,
      server_pauses: stream.result.serverPauses, queue_at_pause: queueAtPause,
      high_mark: stream.queue.highMark, events: [...new Set(events.map((e) => e.event))],
    };
  },

  // A 1 ms hard TTFT time-out: the stream is cancelled (WS: a CANCEL frame; SSE: the
  // resumable stream DELETEd), the attempt fails with TtftTimeoutError.
  async ttft() {
    const events = [];
    try {
      await client({ ttft_hard_timeout_ms: 1, retry: { max_attempts: 1 } }, events)
        .complete(STORY, { transport: args.transport, max_tokens: 64, session: args.session });
      return { error: null };
    } catch (error) {
      return {
        error: error.code, typed: error instanceof TtftTimeoutError,
        cancels: events.filter((e) => e.event === "cancel_sent").map((e) => [e.reason, e.method]),
      };
    }
  },

  // Through a proxy that drops connections: the stream resumes, nothing lost or repeated.
  async drop() {
    const events = [];
    const result = await client({ resume_attempts: 10 }, events).complete(STORY, {
      transport: args.transport, max_tokens: args.max_tokens, temperature: 0, extra_body: { ignore_eos: true },
    });
    const resumes = events.filter((e) => e.event === "retry" && e.cause === "resume").length;
    return { text: result.text, attempts: result.attempts, resumes, request_id: result.requestId };
  },
};

console.log(JSON.stringify(await scenarios[name]()));
