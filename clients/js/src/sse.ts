/**
 * A byte-level server-sent-events parser (sans I/O), the rules of the Python SDK's
 * `edge_llm.protocol.sse.SSEParser` (WHATWG event streams): CRLF, LF or CR line ends
 * (a CR ending one read may be half of a CRLF); lines decoded as UTF-8 only once
 * complete (a character split across reads is whole; invalid bytes become U+FFFD;
 * a leading BOM is dropped); `:` comments counted; `data:` with or without one space,
 * several joined with "\n"; `id` persists; memory bounded per line and per event.
 * tests/data/sse_cases.json holds the cases both SDKs' tests run.
 */
import { EventTooLargeError, MalformedChunkError, ServerStreamError } from "./errors.js";

export interface SSEEvent {
  event: string | null;
  data: string;
  id: string | null;
}

const LF = 10;
const CR = 13;
const utf8 = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

export class SSEParser {
  comments = 0;
  retryMs: number | null = null;
  private partial: Uint8Array[] = [];
  private partialBytes = 0;
  private skipLf = false;
  private firstLine = true;
  private data: string[] = [];
  private dataBytes = 0;
  private eventType: string | null = null;
  private lastId: string | null = null;

  constructor(
    readonly maxLineBytes = 1 << 20,
    readonly maxEventBytes = 4 << 20,
  ) {}

  /** Consume one read; the events it completed. Throws EventTooLargeError. */
  feed(bytes: Uint8Array): SSEEvent[] {
    const events: SSEEvent[] = [];
    let start = 0;
    if (this.skipLf && bytes.length > 0) {
      this.skipLf = false;
      if (bytes[0] === LF) start = 1;
    }
    for (let i = start; i < bytes.length; i++) {
      const b = bytes[i];
      if (b !== LF && b !== CR) continue;
      this.append(bytes.subarray(start, i));
      if (b === CR) {
        if (i + 1 === bytes.length) this.skipLf = true;
        else if (bytes[i + 1] === LF) i++;
      }
      start = i + 1;
      const event = this.takeLine();
      if (event) events.push(event);
    }
    this.append(bytes.subarray(start));
    return events;
  }

  /** End of stream: a pending line, and a last event that lacks its blank line. */
  close(): SSEEvent[] {
    const events: SSEEvent[] = [];
    if (this.partialBytes > 0) {
      const event = this.takeLine();
      if (event) events.push(event);
    }
    const last = this.dispatch();
    if (last) events.push(last);
    return events;
  }

  private append(chunk: Uint8Array): void {
    if (chunk.length === 0) return;
    this.partialBytes += chunk.length;
    if (this.partialBytes > this.maxLineBytes) {
      throw new EventTooLargeError(`SSE line longer than ${this.maxLineBytes} bytes`);
    }
    this.partial.push(chunk.slice());
  }

  private takeLine(): SSEEvent | null {
    let line = decodeAll(this.partial, this.partialBytes);
    this.partial = [];
    this.partialBytes = 0;
    if (this.firstLine) {
      this.firstLine = false;
      if (line.startsWith("\ufeff")) line = line.slice(1);
    }
    if (line === "") return this.dispatch();
    this.field(line);
    return null;
  }

  private field(line: string): void {
    if (line.startsWith(":")) {
      this.comments++;
      return;
    }
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "data") this.appendData(value);
    else if (name === "event") this.eventType = value;
    else if (name === "id" && !value.includes("\0")) this.lastId = value;
    else if (name === "retry" && /^[0-9]+$/.test(value)) this.retryMs = Number(value);
  }

  private appendData(value: string): void {
    this.dataBytes += value.length + 1;
    if (this.dataBytes > this.maxEventBytes) {
      throw new EventTooLargeError(`SSE event data larger than ${this.maxEventBytes} bytes`);
    }
    this.data.push(value);
  }

  private dispatch(): SSEEvent | null {
    const event = this.eventType;
    this.eventType = null;
    if (this.data.length === 0) return null;
    const data = this.data.join("\n");
    this.data = [];
    this.dataBytes = 0;
    return { event: event || null, data, id: this.lastId };
  }
}

function decodeAll(chunks: Uint8Array[], total: number): string {
  if (chunks.length === 1) return utf8.decode(chunks[0]);
  const joined = new Uint8Array(total);
  let at = 0;
  for (const chunk of chunks) {
    joined.set(chunk, at);
    at += chunk.length;
  }
  return utf8.decode(joined);
}

/** One decoded chunk of an OpenAI-style stream. */
export interface ChatChunk {
  id: string | null;
  content: string;
  finishReason: string | null;
  usage: Record<string, unknown> | null;
  raw: Record<string, unknown>;
}

/**
 * Decode one event: null for `[DONE]` (stop reading); throws ServerStreamError for
 * `{"error": ...}` inside a 200 stream and MalformedChunkError for data that is not
 * a JSON object.
 */
export function parseChunk(event: SSEEvent): ChatChunk | null {
  if (event.data.trim() === "[DONE]") return null;
  const obj = decodeObject(event.data);
  if (obj.error || event.event === "error") throw ServerStreamError.fromPayload(obj.error || obj);
  const choices = obj.choices;
  const choice = Array.isArray(choices) && isObject(choices[0]) ? choices[0] : {};
  const delta = isObject(choice.delta) ? choice.delta : {};
  const content = delta.content ?? choice.text;
  return {
    id: typeof obj.id === "string" ? obj.id : null,
    content: typeof content === "string" ? content : "",
    finishReason: typeof choice.finish_reason === "string" ? choice.finish_reason : null,
    usage: isObject(obj.usage) ? obj.usage : null,
    raw: obj,
  };
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function decodeObject(data: string): Record<string, unknown> {
  let obj: unknown;
  try {
    obj = JSON.parse(data);
  } catch {
    throw new MalformedChunkError(`SSE data is not JSON: ${JSON.stringify(data.slice(0, 80))}`);
  }
  if (!isObject(obj)) {
    throw new MalformedChunkError(`SSE data is not a JSON object: ${JSON.stringify(data.slice(0, 80))}`);
  }
  return obj;
}

/** `[streamId, n]` of a resumable stream's event id `<stream_id>.<n>`; null otherwise. */
export function parseEventId(text: string): [string, number] | null {
  const trimmed = text.trim();
  const dot = trimmed.lastIndexOf(".");
  const number = trimmed.slice(dot + 1);
  if (dot <= 0 || !/^[0-9]{1,15}$/.test(number)) return null;
  return [trimmed.slice(0, dot), Number(number)];
}
