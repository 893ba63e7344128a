/**
 * One streamed chat completion, consumed as an async iterable of text:
 *
 *     const stream = client.stream(messages, { transport: "ws" });
 *     for await (const text of stream) render(text);
 *     stream.result.ttftMs;
 *
 * A reader runs the attempts (with the retry policy) and pushes text into a bounded
 * render queue; iteration pops it. At the high watermark the stream is held (WS: a
 * PAUSE frame; SSE: the body is not read) until the queue drains to the low one. The
 * app may hold it too (`pause()` / `resume()`). Breaking out of the loop or aborting
 * the `signal` cancels (WS: a CANCEL frame; SSE: the connection closes). Iteration
 * throws the stream's ClientError (or the abort's reason) after the text before it.
 */
import { Attempt, round, type AttemptHost, type Heartbeat } from "./attempt.js";
import { sleep, type Clock } from "./clock.js";
import type { ClientConfig } from "./config.js";
import { ClientError, ProtocolError, ServerStreamError } from "./errors.js";
import { RenderQueue } from "./renderQueue.js";
import type { RetryPolicy } from "./retry.js";
import type { ResumingTransport } from "./resuming.js";

/** One line of the client's event log (the Python SDK's event names). */
export interface ClientEvent {
  event: string;
  /** Milliseconds since the stream started. */
  t: number;
  [field: string]: unknown;
}

export interface StreamResult {
  text: string;
  finishReason: string | null;
  usage: Record<string, unknown> | null;
  requestId: string | null;
  streamId: string | null;
  transport: "ws" | "sse";
  attempts: number;
  nChunks: number;
  nTokens: number;
  ttfrMs: number | null;
  ttftMs: number | null;
  itlMs: number[];
  e2eMs: number | null;
  totalMs: number;
  /** Times the client held the stream (PAUSE sent / reading stopped). */
  pauses: number;
  /** Causes of the server's `paused` frames (WS). */
  serverPauses: string[];
  /** The `done` frame's stats (WS): ttft_ms, pauses, paused_ms, tokens_while_paused, ... */
  serverStats: Record<string, unknown> | null;
}

export interface StreamHooks {
  onEvent?: (event: ClientEvent) => void;
  onHeartbeat?: (beat: Heartbeat) => void;
  onTtftWarn?: (elapsedMs: number) => void;
  warn?: (message: string) => void;
}

type Hold = "queue" | "app";

/** Wakes every waiter on `notify()`. */
class Notifier {
  private waiters: (() => void)[] = [];
  wait(signal?: AbortSignal): Promise<void> {
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
  notify(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }
}

export class ChatStream implements AsyncIterableIterator<string> {
  readonly queue: RenderQueue<string>;
  private readonly controller = new AbortController();
  private readonly changed = new Notifier();
  private readonly room = new Notifier();
  private readonly flow = new Notifier();
  private readonly holds = new Set<Hold>();
  private task: Promise<void> | null = null;
  private attempt: Attempt | null = null;
  private error: unknown = null;
  private finished = false;
  private startedAt = 0;
  private endedAt: number | null = null;
  private pauses = 0;

  constructor(
    readonly config: ClientConfig,
    private readonly transport: ResumingTransport,
    private readonly policy: RetryPolicy,
    private readonly clock: Clock,
    private readonly hooks: StreamHooks,
    signal?: AbortSignal,
  ) {
    const [high, low] = RenderQueue.marks(config.renderQueueCapacity, config.renderQueueHighWatermark, config.renderQueueLowWatermark);
    this.queue = new RenderQueue(config.renderQueueCapacity, high, low);
    if (signal?.aborted) this.controller.abort(signal.reason);
    signal?.addEventListener("abort", () => this.cancel(signal.reason), { once: true });
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  /** Start the reader (iteration does). */
  start(): void {
    if (this.task) return;
    this.startedAt = this.clock.now();
    this.task = this.run();
  }

  async next(): Promise<IteratorResult<string>> {
    this.start();
    while (this.queue.length === 0 && !this.finished) await this.changed.wait();
    if (this.queue.length > 0) return { value: this.pop(), done: false };
    if (this.error !== null) {
      const error = this.error;
      this.error = null;
      throw error;
    }
    return { value: undefined, done: true };
  }

  /** `break` out of `for await`: cancel the stream if it still runs. */
  async return(): Promise<IteratorResult<string>> {
    await this.close();
    return { value: undefined, done: true };
  }

  /** Cancel (CANCEL frame over WS, connection closed over SSE) and wait for the end. */
  async close(reason?: unknown): Promise<void> {
    if (!this.finished) this.cancel(reason);
    await this.task?.catch(() => undefined);
  }

  cancel(reason: unknown = new DOMException("the stream was cancelled", "AbortError")): void {
    if (!this.controller.signal.aborted) this.controller.abort(reason);
  }

  /** Hold the stream as the app (a Pause button), whatever the render queue wants. */
  pause(): void {
    this.hold("app", true);
  }

  resume(): void {
    this.hold("app", false);
  }

  /** Drop the connection as a dead network would (a resumable stream resumes). */
  dropConnection(): void {
    this.transport.drop();
  }

  /** What holds the stream now: "queue" (watermark) and/or "app". */
  get heldBy(): Hold[] {
    return [...this.holds];
  }

  get done(): boolean {
    return this.finished && this.queue.length === 0;
  }

  get streamId(): string | null {
    return this.transport.streamId;
  }

  /** The outcome; throws before the stream finished. */
  get result(): StreamResult {
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
      serverStats: a.serverStats,
    };
  }

  private pop(): string {
    const [item, mark] = this.queue.pop();
    this.room.notify();
    if (mark === "low") {
      this.emit("watermark_low", { queue_fill: this.queue.fill });
      this.hold("queue", false);
    }
    return item;
  }

  private hold(source: Hold, on: boolean): void {
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

  private emit(event: string, fields: Record<string, unknown> = {}): void {
    try {
      this.hooks.onEvent?.({ event, t: round(this.clock.now() - this.startedAt), ...fields });
    } catch (error) {
      console.error("edge-llm: an onEvent handler threw", error); // the stream goes on
    }
  }

  private host(): AttemptHost {
    return {
      clock: this.clock,
      signal: this.controller.signal,
      deliver: (text, wait) => this.deliver(text, wait),
      emit: (event, fields) => this.emit(event, fields),
      heartbeat: (beat) => this.hooks.onHeartbeat?.(beat),
      ttftWarn: (elapsed) => {
        (this.hooks.warn ?? console.warn)(`edge-llm: no first token after ${elapsed} ms (ttft_warn_ms); still waiting`);
        this.hooks.onTtftWarn?.(elapsed);
      },
    };
  }

  /** Called by the transport: wait for room (SSE) or never (WS, bounded by PAUSE). */
  private async deliver(text: string, wait: boolean): Promise<void> {
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
  async flowOpen(): Promise<void> {
    while (this.holds.size > 0) await this.flow.wait(this.controller.signal);
  }

  isHeld(): boolean {
    return this.holds.size > 0;
  }

  private async run(): Promise<void> {
    let last: [string, Record<string, unknown>];
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
        last = ["error", { code, server_code: serverCode, reason, message: String((error as Error)?.message ?? error) }];
      }
    }
    this.finished = true; // the last event's handler may read `result`
    this.endedAt = this.clock.now();
    this.emit(...last);
    this.changed.notify();
  }

  private endFields(finishReason: string | null): Record<string, unknown> {
    const a = this.attempt;
    return { finish_reason: finishReason, n_chunks: a?.nChunks ?? 0, n_tokens: a?.nTokens ?? 0, ttft_ms: a?.msSinceStart(a.firstTokenAt) ?? null, pauses: this.pauses };
  }

  private async attempts(): Promise<void> {
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
}
