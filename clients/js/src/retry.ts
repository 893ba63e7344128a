/**
 * Which failures get another attempt, and the wait first (the Python SDK's policy):
 * retried when attempts remain, no text was handed to the app yet, it is not a 4xx,
 * and its `code` or `serverCode` is in `retry_on`. The wait is
 * `backoff_ms * 2**(attempt-1)` +/- `jitter`, at least the server's Retry-After,
 * at most `max_backoff_ms`.
 */
import type { RetryConfig } from "./config.js";
import { ClientError, HTTPStatusError, OverloadedError } from "./errors.js";

export interface RetryDecision {
  nextAttempt: number;
  delayMs: number;
  cause: string;
}

export class RetryPolicy {
  /** `random` returns [0, 1) (Math.random unless a test fixes it). */
  constructor(readonly config: RetryConfig, private readonly random: () => number = Math.random) {}

  causeOf(error: ClientError): string | null {
    if (error instanceof HTTPStatusError && error.status >= 400 && error.status < 500) return null;
    for (const code of [error.code, error.serverCode]) {
      if (code !== null && this.config.retryOn.includes(code)) return code;
    }
    return null;
  }

  /** After attempt `attempt` (1-based) failed with `error`: the retry, or null. */
  decide(error: ClientError, attempt: number, delivered: boolean): RetryDecision | null {
    if (delivered || attempt >= this.config.maxAttempts) return null;
    const cause = this.causeOf(error);
    if (cause === null) return null;
    return { nextAttempt: attempt + 1, delayMs: this.backoffMs(attempt, error), cause };
  }

  backoffMs(attempt: number, error?: ClientError): number {
    const { backoffMs, jitter, maxBackoffMs } = this.config;
    let delay = backoffMs * 2 ** (attempt - 1) * (1 + jitter * (2 * this.random() - 1));
    if (error instanceof OverloadedError && error.retryAfterMs !== null) {
      delay = Math.max(delay, error.retryAfterMs);
    }
    return Math.min(delay, maxBackoffMs);
  }
}
