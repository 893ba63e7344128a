/**
 * The render queue between the network reader (push) and the app's renderer (pop).
 * Reaching the high mark on a push returns "high" once (send PAUSE / stop reading);
 * draining to the low mark afterwards returns "low" once (send RESUME / read again):
 * each "high" is followed by exactly one "low" before the next "high".
 */
export type Watermark = "high" | "low" | null;

export class RenderQueue<T> {
  readonly highMark: number;
  readonly lowMark: number;
  aboveHigh = false;
  private items: T[] = [];
  private head = 0;

  /** `highMark` and `lowMark` are lengths: 0 <= low < high <= capacity. */
  constructor(readonly capacity: number, highMark: number, lowMark: number) {
    if (!(0 <= lowMark && lowMark < highMark && highMark <= capacity)) {
      throw new RangeError(`need 0 <= low < high <= capacity, got ${lowMark}, ${highMark}, ${capacity}`);
    }
    this.highMark = highMark;
    this.lowMark = lowMark;
  }

  /** The marks of fractions, as the configuration gives them. */
  static marks(capacity: number, high: number, low: number): [number, number] {
    return [Math.max(1, Math.ceil(high * capacity)), Math.floor(low * capacity)];
  }

  get length(): number {
    return this.items.length - this.head;
  }

  get fill(): number {
    return this.length / this.capacity;
  }

  get isFull(): boolean {
    return this.length >= this.capacity;
  }

  /** Append; "high" when this push reached the high mark. The caller bounds the
   * length (a WebSocket cannot stop its frames in flight: they may pass capacity). */
  push(item: T): Watermark {
    this.items.push(item);
    if (!this.aboveHigh && this.length >= this.highMark) {
      this.aboveHigh = true;
      return "high";
    }
    return null;
  }

  /** The oldest item and "low" when the queue drained to the low mark after a high. */
  pop(): [T, Watermark] {
    if (this.length === 0) throw new RangeError("pop from an empty render queue");
    const item = this.items[this.head++] as T;
    if (this.head > 64 && this.head * 2 > this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
    if (this.aboveHigh && this.length <= this.lowMark) {
      this.aboveHigh = false;
      return [item, "low"];
    }
    return [item, null];
  }
}
