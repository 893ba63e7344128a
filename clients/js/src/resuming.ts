/**
 * What the SSE and WebSocket transports share: one attempt's request, flow control
 * and the resume of a resumable stream after a drop (the Python SDK's rules: the
 * first try after `resumeDelayMs`, then with the retry backoff, up to
 * `resume_attempts` tries in a row that bring no event; an event already taken is
 * skipped by its number, so nothing renders twice and nothing is lost).
 */
import type { Attempt } from "./attempt.js";
import { sleep } from "./clock.js";
import { ClientError, ConnectError, DeadConnectionError, ReadError } from "./errors.js";

/** The platform's WebSocket, or one passed in (Node 20, the `ws` package, React Native). */
export interface WebSocketLike {
  readonly readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  addEventListener(type: string, listener: (event: any) => void): void;
}
export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocketLike;
export type FetchLike = (input: string, init?: RequestInit) => Promise<Response>;

export interface RequestSpec {
  url: string;
  body: Record<string, unknown>;
  headers: Record<string, string>;
  apiKey: string;
  connectTimeoutMs: number;
  resumeAttempts: number;
  /** Milliseconds before resume try `tries` (1: the first). */
  resumeBackoff(tries: number): number;
  /** Resolves when nothing holds the stream paused (SSE reads only then). */
  flowOpen(): Promise<void>;
  /** Whether a pause holds now (a new socket is told again). */
  held(): boolean;
  fetch(): FetchLike;
  WebSocket(): WebSocketConstructor;
}

export abstract class ResumingTransport {
  abstract readonly name: "ws" | "sse";
  streamId: string | null = null; // set when the server made the stream resumable
  lastN = 0; // the number of the last event taken

  constructor(protected readonly spec: RequestSpec) {}

  abstract run(attempt: Attempt): Promise<void>;
  /** The render queue or the app holds the stream (PAUSE / stop reading). */
  abstract pause(attempt: Attempt | null): void;
  abstract resume(attempt: Attempt | null): void;
  /** Let the connection go without a word, as a dropped network does. */
  abstract drop(): void;
  protected abstract read(attempt: Attempt): Promise<void>;
  protected abstract reopen(attempt: Attempt): Promise<void>;

  /** Whether the event numbered `n` was taken before (a replay): skip it. */
  protected seen(n: number): boolean {
    if (n <= this.lastN) return true;
    this.lastN = n;
    return false;
  }

  protected async readResuming(attempt: Attempt): Promise<void> {
    let tries = 0;
    let taken = this.lastN;
    for (;;) {
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

  private async resumeTry(attempt: Attempt, tries: number): Promise<void> {
    const delay = this.spec.resumeBackoff(tries);
    attempt.host.emit("retry", {
      attempt: attempt.number, backoff_ms: Math.round(delay), cause: "resume",
      stream_id: this.streamId, last_event: this.lastN,
    });
    await sleep(attempt.host.clock, delay, attempt.host.signal);
    // The new connection's silence counts from now, not from the dead one's.
    attempt.watchdog.touch(attempt.host.clock.now());
    await this.reopen(attempt);
  }
}

/** `error` as the client's error: a ClientError or the stream's abort as is, else `make`'s. */
export function asClientError(error: unknown, signal: AbortSignal, make: (message: string) => ClientError): unknown {
  if (error instanceof ClientError || signal.aborted) return error;
  const cause = (error as { cause?: { message?: string } })?.cause?.message;
  return make(`${(error as Error)?.message ?? String(error)}${cause ? ` (${cause})` : ""}`);
}
