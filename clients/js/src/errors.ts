/**
 * Errors the client raises, each with a stable `code` (the Python SDK's codes):
 *
 *     ClientError                 client_error
 *     ├── ConfigError             config_error (.field names the bad key)
 *     ├── TransportError
 *     │   ├── ConnectError        connect_error
 *     │   ├── ReadError           read_error (dropped mid-stream)
 *     │   └── StreamTimeoutError
 *     │       ├── TtftTimeoutError     ttft_timeout
 *     │       └── DeadConnectionError  dead_connection
 *     ├── HTTPStatusError         http_status (.status, .serverCode)
 *     │   └── OverloadedError     overloaded (503; .retryAfterMs)
 *     ├── ServerStreamError       server_error (.serverCode: the server's code)
 *     └── ProtocolError
 *         ├── NotStreamingError   not_streaming
 *         ├── MalformedChunkError malformed_chunk
 *         └── EventTooLargeError  event_too_large
 *
 * The retry policy matches `retry.retry_on` against `code` and `serverCode`.
 */

export type ErrorBody = Record<string, unknown>;

export class ClientError extends Error {
  readonly code: string = "client_error";
  /** The code the server gave, when the error came from the server. */
  get serverCode(): string | null {
    return null;
  }
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

export class ConfigError extends ClientError {
  override readonly code = "config_error";
  constructor(message: string, readonly field: string | null = null) {
    super(message);
  }
}

export class TransportError extends ClientError {
  override readonly code: string = "transport_error";
}

export class ConnectError extends TransportError {
  override readonly code = "connect_error";
}

export class ReadError extends TransportError {
  override readonly code = "read_error";
}

export class StreamTimeoutError extends TransportError {
  override readonly code: string = "timeout";
  constructor(message: string, readonly elapsedMs: number) {
    super(message);
  }
}

export class TtftTimeoutError extends StreamTimeoutError {
  override readonly code = "ttft_timeout";
}

export class DeadConnectionError extends StreamTimeoutError {
  override readonly code = "dead_connection";
}

export class HTTPStatusError extends ClientError {
  override readonly code: string = "http_status";
  constructor(
    message: string,
    readonly status: number,
    private readonly server: string | null = null,
    readonly error: ErrorBody = {},
  ) {
    super(message);
  }
  override get serverCode(): string | null {
    return this.server;
  }
}

export class OverloadedError extends HTTPStatusError {
  override readonly code = "overloaded";
  constructor(
    message: string,
    serverCode: string | null = null,
    error: ErrorBody = {},
    /** From `Retry-After`; null when the server gave none. */
    readonly retryAfterMs: number | null = null,
  ) {
    super(message, 503, serverCode, error);
  }
}

export class ServerStreamError extends ClientError {
  override readonly code = "server_error";
  constructor(
    message: string,
    private readonly server: string | null,
    readonly error: ErrorBody = {},
  ) {
    super(message);
  }
  override get serverCode(): string | null {
    return this.server;
  }
  /** From the value of an `"error"` key or a WebSocket `error` frame. */
  static fromPayload(payload: unknown): ServerStreamError {
    if (payload !== null && typeof payload === "object") {
      const body = payload as ErrorBody;
      const code = body.code ?? body.type;
      const message = String(body.message || "server error");
      return new ServerStreamError(message, code == null ? null : String(code), body);
    }
    return new ServerStreamError(String(payload), null, { message: String(payload) });
  }
}

export class ProtocolError extends ClientError {
  override readonly code: string = "protocol_error";
}

export class NotStreamingError extends ProtocolError {
  override readonly code = "not_streaming";
}

export class MalformedChunkError extends ProtocolError {
  override readonly code = "malformed_chunk";
}

export class EventTooLargeError extends ProtocolError {
  override readonly code = "event_too_large";
}
