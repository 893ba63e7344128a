/**
 * The engine's WebSocket protocol (`GET {base}/stream`, docs/lifecycle.md): `start`,
 * then `pause` / `resume` as the render queue crosses its watermarks (or the app
 * asks), `cancel` on the TTFT hard time-out or an abort. Heartbeat frames arm the
 * dead-connection deadline from the start (this endpoint always heartbeats). The API
 * key travels as the `edge-llm.key.<base64url>` subprotocol: browsers and Node's
 * WebSocket cannot set headers. A resumable stream's frames carry `n`; after a drop a
 * new socket sends `resume` with the stream id and the last `n` taken, and the pause
 * still wanted is sent again (the server starts a new socket unpaused).
 */
import { Attempt, heartbeatOf } from "./attempt.js";
import { ConnectError, MalformedChunkError, ReadError, ServerStreamError, TtftTimeoutError } from "./errors.js";
import { ResumingTransport, type WebSocketLike } from "./resuming.js";
import { isObject } from "./sse.js";

const OPEN = 1;
// Error frames about one bad client frame: the stream goes on.
const FRAME_ERRORS = new Set(["invalid_frame", "unknown_frame_type", "no_active_stream", "already_paused", "not_paused"]);
const MAX_INBOX = 4096; // frames not yet read: only a server ignoring PAUSE gets here

type Item = { data: unknown } | { closed: number };

/** One socket's frames, in order, read one at a time. */
class Inbox {
  readonly opened: Promise<void>;
  private items: Item[] = [];
  private waiter: ((item: Item) => void) | null = null;
  private closedCode: number | null = null;

  constructor(readonly ws: WebSocketLike) {
    this.opened = new Promise((resolve, reject) => {
      ws.addEventListener("open", () => resolve());
      ws.addEventListener("close", (event) => {
        reject(new ConnectError(`WebSocket closed before it opened (code ${event.code})`));
        this.put({ closed: event.code ?? 1006 });
      });
    });
    this.opened.catch(() => undefined);
    ws.addEventListener("message", (event) => this.put({ data: event.data }));
  }

  private put(item: Item): void {
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

  next(): Promise<Item> {
    const item = this.items.shift();
    if (item) return Promise.resolve(item);
    return new Promise((resolve) => (this.waiter = resolve));
  }
}

export class WSTransport extends ResumingTransport {
  readonly name = "ws";
  private inbox: Inbox | null = null;
  private pausedOnSocket = false;

  async run(attempt: Attempt): Promise<void> {
    this.streamId = null;
    this.lastN = 0;
    try {
      const start: Record<string, unknown> = { type: "start", request: this.spec.body };
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

  pause(attempt: Attempt | null): void {
    this.send(attempt, "pause");
  }

  resume(attempt: Attempt | null): void {
    this.send(attempt, "resume");
  }

  drop(): void {
    this.inbox?.ws.close(4000, "dropped");
  }

  private send(attempt: Attempt | null, kind: "pause" | "resume"): void {
    const ws = this.inbox?.ws;
    if (!attempt || !ws || ws.readyState !== OPEN || this.pausedOnSocket === (kind === "pause")) return;
    this.pausedOnSocket = kind === "pause";
    ws.send(JSON.stringify({ type: kind }));
    attempt.host.emit(kind === "pause" ? "pause_sent" : "resume_sent", {});
  }

  private async open(attempt: Attempt, opening: Record<string, unknown>): Promise<void> {
    this.close();
    const Ctor = this.spec.WebSocket();
    let ws: WebSocketLike;
    try {
      ws = new Ctor(this.spec.url, subprotocols(this.spec.apiKey));
    } catch (error) {
      throw new ConnectError(`cannot open a WebSocket to ${this.spec.url}: ${(error as Error).message}`);
    }
    this.inbox = new Inbox(ws);
    this.pausedOnSocket = false;
    // Connecting has its own time-out; TTFT counts from the start frame sent.
    await attempt.waitUndeadlined(withTimeout(this.inbox.opened, this.spec.connectTimeoutMs, attempt, this.spec.url));
    ws.send(JSON.stringify(opening));
    if (opening.type === "start") attempt.watchdog.restart(attempt.host.clock.now());
    if (this.spec.held()) this.pause(attempt);
  }

  private close(): void {
    const ws = this.inbox?.ws;
    this.inbox = null;
    if (ws && ws.readyState <= OPEN) ws.close(1000);
  }

  private cancel(attempt: Attempt, reason: string): void {
    const ws = this.inbox?.ws;
    const open = ws !== undefined && ws.readyState === OPEN;
    if (open) ws.send(JSON.stringify({ type: "cancel" }));
    attempt.host.emit("cancel_sent", { reason, method: open ? "frame" : "close", elapsed_ms: Math.round(attempt.elapsedMs()) });
  }

  protected async read(attempt: Attempt): Promise<void> {
    const inbox = this.inbox;
    if (!inbox) throw new ReadError("no socket to read");
    for (;;) {
      const item = await attempt.wait(inbox.next());
      if ("closed" in item) throw new ReadError(`the server closed the WebSocket before done (code ${item.closed})`);
      attempt.onBytes();
      if (await this.onFrame(decode(item.data), attempt)) return;
    }
  }

  protected async reopen(attempt: Attempt): Promise<void> {
    await this.open(attempt, { type: "resume", stream_id: this.streamId, last_event_id: this.lastN });
  }

  /** Handle one server frame; true when the stream is done. */
  private async onFrame(frame: Record<string, unknown>, attempt: Attempt): Promise<boolean> {
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
}

function decode(data: unknown): Record<string, unknown> {
  if (typeof data !== "string") throw new MalformedChunkError("unexpected binary WebSocket frame");
  let frame: unknown;
  try {
    frame = JSON.parse(data);
  } catch {
    throw new MalformedChunkError(`WebSocket frame is not JSON: ${JSON.stringify(data.slice(0, 80))}`);
  }
  if (!isObject(frame)) throw new MalformedChunkError(`WebSocket frame is not a JSON object: ${JSON.stringify(data.slice(0, 80))}`);
  return frame;
}

function intOf(value: unknown): number {
  return typeof value === "number" && Number.isInteger(value) ? value : 0;
}

function withTimeout<T>(promise: Promise<T>, ms: number, attempt: Attempt, url: string): Promise<T> {
  const clock = attempt.host.clock;
  return new Promise((resolve, reject) => {
    const timer = clock.setTimeout(() => reject(new ConnectError(`timed out connecting to ${url}`)), ms);
    promise.then(resolve, reject).finally(() => clock.clearTimeout(timer));
  });
}

/** `edge-llm` and, with a key, `edge-llm.key.<base64url(utf-8 key)>` (the server's form). */
export function subprotocols(apiKey: string): string[] {
  if (!apiKey) return ["edge-llm"];
  return ["edge-llm", `edge-llm.key.${base64url(new TextEncoder().encode(apiKey))}`];
}

const ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

function base64url(bytes: Uint8Array): string {
  let out = "";
  for (let i = 0; i < bytes.length; i += 3) {
    const n = (bytes[i] << 16) | ((bytes[i + 1] ?? 0) << 8) | (bytes[i + 2] ?? 0);
    const chars = Math.min(4, Math.ceil(((bytes.length - i) * 8) / 6));
    for (let j = 0; j < chars; j++) out += ALPHABET[(n >> (18 - 6 * j)) & 63];
  }
  return out;
}

