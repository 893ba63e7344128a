/**
 * Streaming over SSE: `POST {base}/chat/completions` with `stream: true`, against this
 * engine or any OpenAI-compatible server. Flow control is the transport's own: while a
 * pause holds the body is not read, so the platform's buffers fill and TCP pushes
 * back on the server. Cancel = abort the request (the connection closes). `: ping`
 * comments arm the dead-connection deadline. A resumable stream (`X-Stream-Id`, event
 * ids `<stream_id>.<n>`) is resumed after a drop with `GET {base}/streams/{id}` and
 * `Last-Event-ID`. Giving a resumable stream up (the TTFT hard time-out, an abort,
 * `break`) also sends `DELETE {base}/streams/{id}`: closing alone would only detach it,
 * keeping its KV. A server that refuses our optional fields (a 400 naming
 * `resumable` or `return_progress`) is asked again without them.
 */
import { Attempt, heartbeatOf } from "./attempt.js";
import {
  ConnectError, HTTPStatusError, NotStreamingError, OverloadedError, ReadError, TtftTimeoutError, type ClientError,
} from "./errors.js";
import { ResumingTransport, asClientError } from "./resuming.js";
import type { Clock } from "./clock.js";
import { SSEParser, isObject, parseChunk, parseEventId, type SSEEvent } from "./sse.js";

const MAX_ERROR_BODY = 64 * 1024;
const OPTIONAL_FIELDS = ["resumable", "return_progress"];
const CANCEL_TIMEOUT_MS = 2000; // a resumable stream's DELETE when the client gives it up

export class SSETransport extends ResumingTransport {
  readonly name = "sse";
  private controller: AbortController | null = null;
  private response: Response | null = null;
  private posted: Promise<Response> | null = null; // the POST whose headers may not be here yet
  private readPaused = false;

  async run(attempt: Attempt): Promise<void> {
    attempt.host.emit("request_sent", { transport: this.name, attempt: attempt.number, url: this.spec.url });
    this.streamId = null;
    this.lastN = 0;
    try {
      this.response = await this.checked(attempt);
      this.streamId = this.response.headers.get("X-Stream-Id");
      await this.readResuming(attempt);
    } catch (error) {
      const reason = error instanceof TtftTimeoutError ? "ttft_timeout" : attempt.host.signal.aborted ? "client" : null;
      if (reason) {
        const method = await this.giveUp(attempt.host.clock);
        attempt.host.emit("cancel_sent", { reason, method, elapsed_ms: Math.round(attempt.elapsedMs()) });
      }
      throw error;
    } finally {
      this.controller?.abort();
      this.controller = null;
      this.posted = null;
    }
  }

  /**
   * Cancel the stream: closing the connection does, unless it is resumable; then
   * `DELETE {base}/streams/{id}` too, within CANCEL_TIMEOUT_MS. The id comes with the
   * headers at admission: a resumable POST still waiting for them is kept open (as
   * long) and deleted when they come, without holding up the error or a retry.
   * Returns how (`close` or `delete`); a stream not deleted is forgotten after
   * resume_grace_ms anyway.
   */
  private async giveUp(clock: Clock): Promise<"close" | "delete"> {
    if (this.streamId !== null) return this.deleteStream(this.streamId, clock);
    const options = this.spec.body.stream_options;
    const posted = this.posted;
    const controller = this.controller;
    if (posted === null || controller === null || !isObject(options) || options.resumable !== true) return "close";
    this.controller = null; // not aborted by run(): its headers bring the id
    const timer = clock.setTimeout(() => controller.abort(), CANCEL_TIMEOUT_MS);
    posted
      .then((response) => {
        const id = response.headers.get("X-Stream-Id");
        return id === null ? "close" : this.deleteStream(id, clock);
      })
      .catch(() => "close")
      .finally(() => {
        clock.clearTimeout(timer);
        controller.abort();
      });
    return "delete";
  }

  private async deleteStream(id: string, clock: Clock): Promise<"close" | "delete"> {
    const bound = new AbortController();
    const timer = clock.setTimeout(() => bound.abort(), CANCEL_TIMEOUT_MS);
    try {
      const response = await this.spec.fetch()(`${this.base()}/streams/${encodeURIComponent(id)}`, {
        method: "DELETE", headers: this.spec.headers, signal: bound.signal,
      });
      await response.body?.cancel().catch(() => undefined);
      return response.ok ? "delete" : "close";
    } catch {
      return "close";
    } finally {
      clock.clearTimeout(timer);
    }
  }

  private base(): string {
    const url = this.spec.url;
    const at = url.lastIndexOf("/chat/completions");
    return at >= 0 ? url.slice(0, at) : url.slice(0, url.lastIndexOf("/"));
  }

  pause(attempt: Attempt | null): void {
    if (attempt && !this.readPaused) attempt.host.emit("read_paused", {});
    this.readPaused = true;
  }

  resume(attempt: Attempt | null): void {
    if (attempt && this.readPaused) attempt.host.emit("read_resumed", {});
    this.readPaused = false;
  }

  drop(): void {
    this.controller?.abort();
  }

  private async request(attempt: Attempt, url: string, init: RequestInit): Promise<Response> {
    this.controller?.abort();
    this.controller = new AbortController();
    const fetch = this.spec.fetch();
    const headers = { ...this.spec.headers, ...(init.headers as Record<string, string>) };
    const sent = fetch(url, { ...init, headers, signal: this.controller.signal });
    if (init.method === "POST") this.posted = sent;
    try {
      const response = await attempt.wait(sent);
      this.posted = null; // its headers are here: X-Stream-Id or not resumable
      return response;
    } catch (error) {
      throw asClientError(error, attempt.host.signal, (m) => new ConnectError(`cannot connect to ${url}: ${m}`));
    }
  }

  private post(attempt: Attempt, body: Record<string, unknown>): Promise<Response> {
    return this.request(attempt, this.spec.url, {
      method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" },
    });
  }

  /** The 200 event stream; a refusal of an optional field asks again without it. */
  private async checked(attempt: Attempt): Promise<Response> {
    let body = this.spec.body;
    for (;;) {
      const response = await this.post(attempt, body);
      try {
        await this.check(response, attempt);
        return response;
      } catch (error) {
        const field = refusedField(error, body);
        if (field === null) throw error;
        body = without(body, field);
      }
    }
  }

  private async check(response: Response, attempt: Attempt): Promise<void> {
    attempt.setRequestId(response.headers.get("X-Request-Id"));
    if (response.status !== 200) {
      const text = await attempt.wait(readBounded(response));
      throw statusError(response, text, this.spec.url);
    }
    const type = response.headers.get("Content-Type") ?? "";
    if (!type.toLowerCase().startsWith("text/event-stream")) {
      const text = await attempt.wait(readBounded(response));
      throw new NotStreamingError(
        `the server did not stream: Content-Type is ${JSON.stringify(type || "missing")}, expected text/event-stream (body starts ${JSON.stringify(text.slice(0, 120))})`,
      );
    }
  }

  protected async read(attempt: Attempt): Promise<void> {
    const body = this.response?.body;
    if (!body) {
      throw new NotStreamingError(
        "this runtime's fetch does not stream response bodies (React Native's does not): use transport \"ws\"",
      );
    }
    const reader = body.getReader();
    const parser = new SSEParser();
    try {
      for (;;) {
        if (this.spec.held()) {
          await this.spec.flowOpen();
          attempt.watchdog.touch(attempt.host.clock.now()); // not reading is not silence
        }
        const { value, done } = await this.readChunk(reader, attempt);
        if (value?.length) attempt.onBytes();
        const comments = parser.comments;
        const events = done ? parser.close() : parser.feed(value ?? new Uint8Array());
        if (parser.comments > comments) attempt.onHeartbeat(heartbeatOf({}));
        for (const event of events) if (await this.onEvent(event, attempt)) return;
        if (done) {
          if (attempt.finishReason === null) throw new ReadError(`the stream from ${this.spec.url} ended before [DONE]`);
          return;
        }
      }
    } finally {
      reader.cancel().catch(() => undefined); // this body is done with, whatever follows
    }
  }

  private async readChunk(reader: ReadableStreamDefaultReader<Uint8Array>, attempt: Attempt) {
    try {
      return await attempt.wait(reader.read());
    } catch (error) {
      throw asClientError(error, attempt.host.signal, (m) => new ReadError(`connection to ${this.spec.url} failed mid-stream: ${m}`));
    }
  }

  protected async reopen(attempt: Attempt): Promise<void> {
    const response = await this.request(attempt, `${this.base()}/streams/${this.streamId}`, {
      method: "GET", headers: { "Last-Event-ID": `${this.streamId}.${this.lastN}` },
    });
    await this.check(response, attempt);
    this.response = response;
  }

  /** One event; true when the stream is complete ([DONE]). */
  private async onEvent(event: SSEEvent, attempt: Attempt): Promise<boolean> {
    if (this.streamId !== null && event.id !== null) {
      const id = parseEventId(event.id);
      if (id !== null && this.seen(id[1])) return false;
    }
    attempt.onData();
    const chunk = parseChunk(event);
    if (chunk === null) return true;
    attempt.setRequestId(chunk.id);
    const progress = chunk.raw.progress;
    if (isObject(progress) && !chunk.raw.choices) attempt.onHeartbeat(heartbeatOf(progress));
    attempt.onUsage(chunk.usage);
    attempt.onFinish(chunk.finishReason);
    await attempt.onContent(chunk.content, 0, true);
    return false;
  }
}

async function readBounded(response: Response): Promise<string> {
  const reader = response.body?.getReader();
  if (!reader) return "";
  const parts: Uint8Array[] = [];
  let size = 0;
  while (size < MAX_ERROR_BODY) {
    const { value, done } = await reader.read();
    if (done) break;
    parts.push(value);
    size += value.length;
  }
  await reader.cancel().catch(() => undefined);
  const all = new Uint8Array(size);
  let at = 0;
  for (const part of parts) {
    all.set(part, at);
    at += part.length;
  }
  return new TextDecoder().decode(all.subarray(0, MAX_ERROR_BODY));
}

function statusError(response: Response, text: string, url: string): ClientError {
  let error: Record<string, unknown> = {};
  try {
    const obj = JSON.parse(text);
    if (isObject(obj?.error)) error = obj.error;
    else if (typeof obj?.error === "string") error = { message: obj.error };
  } catch {
    // not JSON: the message is the body's start
  }
  const serverCode = error.code == null ? null : String(error.code);
  let message = `HTTP ${response.status} from ${url}: ${String(error.message ?? text.slice(0, 200).trim()) || "no message"}`;
  if (serverCode) message += ` [${serverCode}]`;
  if (response.status === 503) {
    return new OverloadedError(message, serverCode, error, retryAfterMs(response.headers.get("Retry-After")));
  }
  return new HTTPStatusError(message, response.status, serverCode, error);
}

/** Milliseconds from a `Retry-After` header (delta-seconds or an HTTP date). */
export function retryAfterMs(value: string | null, now = Date.now()): number | null {
  if (!value) return null;
  const seconds = Number(value);
  if (value.trim() !== "" && Number.isFinite(seconds)) return Math.max(0, seconds * 1000);
  const when = Date.parse(value);
  return Number.isNaN(when) ? null : Math.max(0, when - now);
}

function refusedField(error: unknown, body: Record<string, unknown>): string | null {
  if (!(error instanceof HTTPStatusError) || error.status !== 400) return null;
  const options = isObject(body.stream_options) ? body.stream_options : {};
  const carried = OPTIONAL_FIELDS.filter((f) => f in body || f in options);
  const param = String(error.error.param ?? "");
  return carried.find((f) => param.endsWith(f) || error.message.includes(f)) ?? null;
}

function without(body: Record<string, unknown>, field: string): Record<string, unknown> {
  const { [field]: _dropped, ...rest } = body;
  const options = isObject(body.stream_options) ? { ...body.stream_options } : null;
  if (options) delete options[field];
  return options ? { ...rest, stream_options: options } : rest;
}
