/**
 * The client: opens streams with the configuration's policies.
 *
 *     const client = new StreamClient(loadClientConfig(json));
 *     const stream = client.stream([{ role: "user", content: "Hi" }], { transport: "ws" });
 *     for await (const text of stream) process.stdout.write(text);
 *
 * `transport: "ws"` speaks the engine's WebSocket protocol (PAUSE/RESUME, progress);
 * `"sse"` (the default, as in Python) works with any OpenAI-compatible server.
 */
import type { Heartbeat } from "./attempt.js";
import { systemClock, type Clock } from "./clock.js";
import type { ClientConfig } from "./config.js";
import { ConfigError } from "./errors.js";
import { RetryPolicy } from "./retry.js";
import type { FetchLike, RequestSpec, ResumingTransport, WebSocketConstructor } from "./resuming.js";
import { SSETransport } from "./sseTransport.js";
import { ChatStream, type ClientEvent, type StreamHooks, type StreamResult } from "./stream.js";
import { WSTransport } from "./ws.js";

export type Message = Record<string, unknown> & { role: string };

export interface ClientOptions {
  /** Node 20 has no global WebSocket: pass one (`ws`'s, or run with --experimental-websocket). */
  WebSocket?: WebSocketConstructor;
  fetch?: FetchLike;
  /** Every stream's events (the Python SDK's event log names). */
  onEvent?: (event: ClientEvent) => void;
  /** Where TTFT warnings go (default console.warn). */
  warn?: (message: string) => void;
  /** Wait before the first resume try after a drop (default 0: at once). */
  resumeDelayMs?: number;
  clock?: Clock;
  random?: () => number;
}

export interface StreamOptions {
  transport?: "ws" | "sse";
  max_tokens?: number;
  temperature?: number;
  /** Aborting it cancels the stream; iteration then throws its reason. */
  signal?: AbortSignal;
  /** The request's session (`user`): a new request of the same session supersedes it. */
  session?: string;
  /** The request's class (lower runs first). */
  priority?: number;
  /** Ask for progress heartbeats over SSE (`return_progress`; WS always has them). */
  progress?: boolean;
  /** More fields of the chat completion body. */
  extra_body?: Record<string, unknown>;
  onEvent?: (event: ClientEvent) => void;
  onHeartbeat?: (beat: Heartbeat) => void;
  onTtftWarn?: (elapsedMs: number) => void;
}

export class StreamClient {
  private readonly policy: RetryPolicy;
  private readonly clock: Clock;

  constructor(readonly config: ClientConfig, private readonly options: ClientOptions = {}) {
    this.policy = new RetryPolicy(config.retry, options.random);
    this.clock = options.clock ?? systemClock;
  }

  /** A stream of `messages`; it starts on first iteration (or `start()`). */
  stream(messages: readonly Message[], options: StreamOptions = {}): ChatStream {
    const name = options.transport ?? "sse";
    if (name !== "ws" && name !== "sse") throw new ConfigError(`transport must be "ws" or "sse", got ${JSON.stringify(name)}`, "transport");
    let stream: ChatStream | null = null;
    const spec = this.spec(name, this.body(messages, options), () => stream as ChatStream);
    const transport: ResumingTransport = name === "ws" ? new WSTransport(spec) : new SSETransport(spec);
    const hooks: StreamHooks = {
      onEvent: (event) => {
        this.options.onEvent?.(event);
        options.onEvent?.(event);
      },
      onHeartbeat: options.onHeartbeat,
      onTtftWarn: options.onTtftWarn,
      warn: this.options.warn,
    };
    stream = new ChatStream(this.config, transport, this.policy, this.clock, hooks, options.signal);
    return stream;
  }

  /** Stream to the end; the result (text included). Throws the stream's error. */
  async complete(messages: readonly Message[], options: StreamOptions = {}): Promise<StreamResult> {
    const stream = this.stream(messages, options);
    for await (const _ of stream) {
      // the result holds the text
    }
    return stream.result;
  }

  private spec(name: "ws" | "sse", body: Record<string, unknown>, stream: () => ChatStream): RequestSpec {
    const { config, options } = this;
    const headers: Record<string, string> = { Accept: "text/event-stream", "X-Client-Request-Id": requestId() };
    if (config.apiKey) headers.Authorization = `Bearer ${config.apiKey}`;
    return {
      url: name === "ws" ? config.baseUrl.replace(/^http/, "ws") + "/stream" : `${config.baseUrl}/chat/completions`,
      body,
      headers,
      apiKey: config.apiKey,
      connectTimeoutMs: config.connectTimeoutMs,
      resumeAttempts: config.resumable ? config.resumeAttempts : 0,
      resumeBackoff: (tries) => (tries <= 1 ? options.resumeDelayMs ?? 0 : this.policy.backoffMs(tries - 1)),
      flowOpen: () => stream().flowOpen(),
      held: () => stream().isHeld(),
      fetch: () => {
        const fetch = options.fetch ?? globalThis.fetch?.bind(globalThis);
        if (!fetch) throw new ConfigError("no fetch in this runtime: pass { fetch } to StreamClient", "fetch");
        return fetch;
      },
      WebSocket: () => {
        const ws = options.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
        if (!ws) {
          throw new ConfigError(
            "no WebSocket in this runtime: pass { WebSocket } to StreamClient (Node 20: from the ws package, or run node with --experimental-websocket)",
            "WebSocket",
          );
        }
        return ws;
      },
    };
  }

  private body(messages: readonly Message[], options: StreamOptions): Record<string, unknown> {
    const { config } = this;
    const body: Record<string, unknown> = {
      messages: messages.map((m) => ({ ...m })),
      stream: true,
      stream_options: config.resumable ? { include_usage: true, resumable: true } : { include_usage: true },
    };
    if (config.modelId !== null) body.model = config.modelId;
    const maxTokens = options.max_tokens ?? config.maxTokens;
    const temperature = options.temperature ?? config.temperature;
    if (maxTokens !== null) body.max_tokens = maxTokens;
    if (temperature !== null) body.temperature = temperature;
    if (options.session) body.user = options.session;
    if (options.priority !== undefined) body.priority = options.priority;
    if (options.progress) body.return_progress = true;
    return { ...body, ...options.extra_body };
  }
}

function requestId(): string {
  return Math.random().toString(36).slice(2, 10) + Date.now().toString(36);
}
