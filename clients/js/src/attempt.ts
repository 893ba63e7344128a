/**
 * One attempt of a streamed request: its deadlines, timing and what the server said.
 * A transport waits for the server only through `wait()` (which enforces the TTFT
 * and dead-connection deadlines and the stream's abort) and reports what it sees.
 */
import type { Clock } from "./clock.js";
import type { ClientConfig } from "./config.js";
import { DeadConnectionError, TtftTimeoutError } from "./errors.js";
import { Watchdog } from "./watchdog.js";

export interface Heartbeat {
  state: string | null;
  prefillDone: number | null;
  prefillTotal: number | null;
  queuePosition: number | null;
  predictedWaitMs: number | null;
}

export function heartbeatOf(progress: Record<string, unknown>): Heartbeat {
  const int = (v: unknown) => (typeof v === "number" && Number.isInteger(v) ? v : null);
  return {
    state: typeof progress.state === "string" ? progress.state : null,
    prefillDone: int(progress.prefill_done),
    prefillTotal: int(progress.prefill_total),
    queuePosition: int(progress.queue_position),
    predictedWaitMs: int(progress.predicted_wait_ms),
  };
}

/** What the stream gives its transport: the render queue's side and the log. */
export interface AttemptHost {
  readonly clock: Clock;
  readonly signal: AbortSignal;
  /** Hand text to the render queue; may wait for room (SSE) or never (WS). */
  deliver(text: string, wait: boolean): Promise<void>;
  emit(event: string, fields?: Record<string, unknown>): void;
  heartbeat(beat: Heartbeat): void;
  ttftWarn(elapsedMs: number): void;
}

export class Attempt {
  readonly start: number;
  readonly watchdog: Watchdog;
  requestId: string | null = null;
  firstDataAt: number | null = null;
  firstTokenAt: number | null = null;
  lastTokenAt: number | null = null;
  itlMs: number[] = [];
  parts: string[] = [];
  nChunks = 0;
  nServerTokens = 0;
  finishReason: string | null = null;
  usage: Record<string, unknown> | null = null;
  serverStats: Record<string, unknown> | null = null;
  serverPauses: string[] = [];

  constructor(readonly number: number, config: ClientConfig, readonly host: AttemptHost) {
    this.start = host.clock.now();
    this.watchdog = new Watchdog(
      this.start,
      config.ttftWarnMs,
      config.ttftHardTimeoutMs,
      config.heartbeatIntervalMs * config.deadAfterHeartbeats,
    );
    if (config.requireHeartbeat) this.watchdog.arm();
  }

  elapsedMs(): number {
    return this.host.clock.now() - this.start;
  }

  /**
   * `promise` under the deadlines: a TTFT warning is reported and the wait goes on;
   * the hard time-out throws TtftTimeoutError, a silent armed connection
   * DeadConnectionError, the stream's abort its reason.
   */
  async wait<T>(promise: Promise<T>): Promise<T> {
    promise.catch(() => undefined); // abandoned on a deadline: not an unhandled rejection
    for (;;) {
      const left = this.watchdog.msLeft(this.host.clock.now());
      const outcome = await race(promise, left, this.host.clock, this.host.signal);
      if (outcome.done) return outcome.value as T;
      this.deadlinePassed();
    }
  }

  /** `promise` under the stream's abort only (a connect has its own time-out). */
  async waitUndeadlined<T>(promise: Promise<T>): Promise<T> {
    const outcome = await race(promise, null, this.host.clock, this.host.signal);
    return (outcome as { value: T }).value;
  }

  private deadlinePassed(): void {
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

  setRequestId(id: unknown): void {
    if (typeof id === "string" && id && this.requestId === null) this.requestId = id;
  }

  onBytes(): void {
    this.watchdog.touch(this.host.clock.now());
  }

  onData(): void {
    this.firstDataAt ??= this.host.clock.now();
  }

  onHeartbeat(beat: Heartbeat): void {
    this.watchdog.arm();
    this.host.heartbeat(beat);
  }

  /** A content chunk: into the render queue (waiting there for room when `wait`). */
  async onContent(text: string, nTokens: number, wait: boolean): Promise<void> {
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

  onUsage(usage: unknown): void {
    if (usage !== null && typeof usage === "object") this.usage = usage as Record<string, unknown>;
  }

  onFinish(reason: unknown): void {
    if (typeof reason === "string") this.finishReason = reason;
  }

  /** Completion tokens: usage, else the server's per-delta counts, else chunks. */
  get nTokens(): number {
    const fromUsage = this.usage?.completion_tokens;
    return typeof fromUsage === "number" ? fromUsage : this.nServerTokens || this.nChunks;
  }

  msSinceStart(at: number | null): number | null {
    return at === null ? null : round(at - this.start);
  }
}

export function round(ms: number): number {
  return Math.round(ms * 1000) / 1000;
}

type Outcome = { done: true; value: unknown } | { done: false };

function race<T>(promise: Promise<T>, ms: number | null, clock: Clock, signal: AbortSignal): Promise<Outcome> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    let timer: unknown = null;
    const finish = () => {
      if (timer !== null) clock.clearTimeout(timer);
      signal.removeEventListener("abort", onAbort);
    };
    const onAbort = () => {
      finish();
      reject(signal.reason);
    };
    signal.addEventListener("abort", onAbort, { once: true });
    if (ms !== null) {
      timer = clock.setTimeout(() => {
        finish();
        resolve({ done: false });
      }, ms);
    }
    promise.then(
      (value) => {
        finish();
        resolve({ done: true, value });
      },
      (error) => {
        finish();
        reject(error);
      },
    );
  });
}
