// The SSE cases shared with the Python SDK (tests/data/sse_cases.json).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { ClientError, SSEParser, parseChunk } from "../dist/index.js";

const cases = JSON.parse(readFileSync(new URL("../../../tests/data/sse_cases.json", import.meta.url), "utf8"));
const bytesOf = (read) => (typeof read === "string" ? new TextEncoder().encode(read) : Buffer.from(read.hex, "hex"));

for (const c of cases.parser) {
  test(`sse case ${c.name}`, () => {
    const parser = new SSEParser(c.max_line_bytes, c.max_event_bytes);
    const events = [];
    try {
      for (const read of c.reads) events.push(...parser.feed(bytesOf(read)));
      events.push(...parser.close());
    } catch (error) {
      assert.ok(error instanceof ClientError, String(error));
      assert.equal(error.code, c.error);
      return;
    }
    assert.equal(c.error, undefined, `expected ${c.error}`);
    assert.deepEqual(events, c.events);
    assert.equal(parser.comments, c.comments ?? 0);
    assert.equal(parser.retryMs, c.retry_ms ?? null);
  });
}

for (const c of cases.chunks) {
  test(`chunk case ${c.name}`, () => {
    let chunk;
    try {
      chunk = parseChunk({ event: null, data: c.data, id: null });
    } catch (error) {
      assert.equal(error.code, c.error);
      if ("server_code" in c) assert.equal(error.serverCode, c.server_code);
      return;
    }
    assert.equal(c.error, undefined);
    const got = chunk && { id: chunk.id, content: chunk.content, finish_reason: chunk.finishReason, usage: chunk.usage };
    assert.deepEqual(got, c.chunk);
  });
}

test("any split of a stream gives the same events", () => {
  const stream = new TextEncoder().encode("data: a\r\n\r\n: ping\rdata: é🙂\ndata: x\n\ndata: [DONE]\r\r");
  const whole = new SSEParser();
  const expected = [...whole.feed(stream), ...whole.close()];
  assert.equal(expected.length, 3);
  for (let cut = 0; cut <= stream.length; cut++) {
    for (let cut2 = cut; cut2 <= stream.length; cut2 += 3) {
      const parser = new SSEParser();
      const got = [
        ...parser.feed(stream.subarray(0, cut)), ...parser.feed(stream.subarray(cut, cut2)),
        ...parser.feed(stream.subarray(cut2)), ...parser.close(),
      ];
      assert.deepEqual(got, expected, `cuts at ${cut}, ${cut2}`);
    }
  }
});
