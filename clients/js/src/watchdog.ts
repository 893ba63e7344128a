/**
 * The deadlines of one attempt (sans I/O): TTFT warning, TTFT hard time-out, dead
 * connection. The transport asks `msLeft(now)` before each wait and, when a wait ran
 * out, `expired(now)` for which deadline passed. The dead-connection deadline runs
 * only once armed (the server was seen to heartbeat, or always over the WebSocket).
 * Times in milliseconds; 0 disables a limit.
 */
export type Deadline = "ttft_warn" | "ttft_timeout" | "dead_connection";

export class Watchdog {
  armed = false;
  warned = false;
  gotToken = false;
  lastActivity: number;

  constructor(
    public start: number,
    readonly ttftWarnMs: number,
    readonly ttftHardMs: number,
    readonly deadAfterMs: number,
  ) {
    this.lastActivity = start;
  }

  /** The request went out at `now` (a WebSocket's start frame): TTFT counts from here. */
  restart(now: number): void {
    this.start = now;
    this.lastActivity = now;
  }

  arm(): void {
    this.armed = true;
  }

  /** Bytes came, or the reader deliberately did not read until `now`. */
  touch(now: number): void {
    this.lastActivity = now;
  }

  firstToken(): void {
    this.gotToken = true;
  }

  private deadlines(): [number, Deadline][] {
    const out: [number, Deadline][] = [];
    if (!this.gotToken && this.ttftWarnMs > 0 && !this.warned) out.push([this.start + this.ttftWarnMs, "ttft_warn"]);
    if (!this.gotToken && this.ttftHardMs > 0) out.push([this.start + this.ttftHardMs, "ttft_timeout"]);
    if (this.armed && this.deadAfterMs > 0) out.push([this.lastActivity + this.deadAfterMs, "dead_connection"]);
    return out;
  }

  /** How long the next wait may last (>= 0), or null for no limit. */
  msLeft(now: number): number | null {
    const deadlines = this.deadlines();
    if (deadlines.length === 0) return null;
    return Math.max(0, Math.min(...deadlines.map(([at]) => at)) - now);
  }

  /** The deadline passed by `now`, the hard ones first; "ttft_warn" marks the warning given. */
  expired(now: number): Deadline | null {
    const passed = new Set(this.deadlines().filter(([at]) => at <= now).map(([, kind]) => kind));
    for (const kind of ["ttft_timeout", "dead_connection", "ttft_warn"] as const) {
      if (passed.has(kind)) {
        if (kind === "ttft_warn") this.warned = true;
        return kind;
      }
    }
    return null;
  }
}
