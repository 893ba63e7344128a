// Test doubles: a fake clock, a scripted fetch and a scripted WebSocket.
export const flush = async (n = 20) => {
  for (let i = 0; i < n; i++) await new Promise((r) => setImmediate(r));
};

export class FakeClock {
  t = 0;
  timers = [];
  next = 0;
  now() {
    return this.t;
  }
  setTimeout(fn, ms) {
    const id = ++this.next;
    this.timers.push({ id, at: this.t + Math.max(0, ms), fn });
    return id;
  }
  clearTimeout(id) {
    this.timers = this.timers.filter((x) => x.id !== id);
  }
  /** Move time on by `ms`, firing the timers due in order (and the work they cause). */
  async advance(ms) {
    const end = this.t + ms;
    for (;;) {
      await flush();
      const due = this.timers.filter((x) => x.at <= end).sort((a, b) => a.at - b.at)[0];
      if (!due) break;
      this.timers = this.timers.filter((x) => x !== due);
      this.t = due.at;
      due.fn();
    }
    this.t = end;
    await flush();
  }
}

/** An SSE response whose body the test writes (`push`, `end`). */
export function sseResponse(init = {}) {
  let controller;
  const body = new ReadableStream({ start: (c) => (controller = c) }, { highWaterMark: 0 });
  const encoder = new TextEncoder();
  const response = new Response(body, {
    status: init.status ?? 200,
    headers: { "Content-Type": "text/event-stream", ...(init.headers ?? {}) },
  });
  return {
    response,
    push: (text) => controller.enqueue(encoder.encode(text)),
    end: () => controller.close(),
    fail: (error) => controller.error(error),
  };
}

export const chunk = (content, extra = {}) =>
  `data: ${JSON.stringify({ id: "r1", choices: [{ delta: { content }, ...extra }] })}\n\n`;

/** A WebSocket the test drives: `sent` holds the client's frames, `serve` answers. */
export class FakeSocket {
  static last = null;
  static all = [];
  readyState = 0;
  sent = [];
  listeners = {};
  constructor(url, protocols) {
    this.url = url;
    this.protocols = protocols;
    FakeSocket.last = this;
    FakeSocket.all.push(this);
    queueMicrotask(() => {
      this.readyState = 1;
      this.fire("open", {});
    });
  }
  addEventListener(type, fn) {
    (this.listeners[type] ??= []).push(fn);
  }
  fire(type, event) {
    for (const fn of this.listeners[type] ?? []) fn(event);
  }
  send(data) {
    this.sent.push(JSON.parse(data));
  }
  serve(frame) {
    this.fire("message", { data: JSON.stringify(frame) });
  }
  close(code = 1000) {
    if (this.readyState >= 2) return;
    this.readyState = 3;
    queueMicrotask(() => this.fire("close", { code }));
  }
  types() {
    return this.sent.map((f) => f.type);
  }
}
