/**
 * @edge-llm/client: the client half of edge-llm's token backpressure contract.
 * See docs/js-client.md.
 */
export { loadClientConfig, normaliseApiKey, normaliseBaseUrl, DEFAULT_BASE_URL, TOP_LEVEL_KEY } from "./config.js";
export type { ClientConfig, LoadOptions, RetryConfig } from "./config.js";
export { StreamClient } from "./client.js";
export type { ClientOptions, Message, StreamOptions } from "./client.js";
export { ChatStream } from "./stream.js";
export type { ClientEvent, StreamResult } from "./stream.js";
export type { Heartbeat } from "./attempt.js";
export {
  ClientError, ConfigError, TransportError, ConnectError, ReadError, StreamTimeoutError, TtftTimeoutError,
  DeadConnectionError, HTTPStatusError, OverloadedError, ServerStreamError, ProtocolError, NotStreamingError,
  MalformedChunkError, EventTooLargeError,
} from "./errors.js";
export { RenderQueue } from "./renderQueue.js";
export type { Watermark } from "./renderQueue.js";
export { SSEParser, parseChunk, parseEventId } from "./sse.js";
export type { SSEEvent, ChatChunk } from "./sse.js";
export { RetryPolicy } from "./retry.js";
export type { RetryDecision } from "./retry.js";
export { Watchdog } from "./watchdog.js";
export type { Clock } from "./clock.js";
export type { WebSocketConstructor, WebSocketLike, FetchLike } from "./resuming.js";
export { subprotocols } from "./ws.js";
export { retryAfterMs } from "./sseTransport.js";
