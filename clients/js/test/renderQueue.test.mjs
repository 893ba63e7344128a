import assert from "node:assert/strict";
import { test } from "node:test";
import { RenderQueue } from "../dist/index.js";

test("high once at the high mark, low once at the low mark (hysteresis)", () => {
  const [high, low] = RenderQueue.marks(32, 0.8, 0.3);
  assert.deepEqual([high, low], [26, 9]); // the Python SDK's marks for the seed's values
  const q = new RenderQueue(32, high, low);
  const marks = [];
  for (let i = 0; i < 30; i++) marks.push(q.push(i));
  assert.deepEqual(marks.map((m, i) => (m ? `${i}:${m}` : null)).filter(Boolean), ["25:high"]);
  const popped = [];
  for (let i = 0; i < 30; i++) {
    const [item, mark] = q.pop();
    assert.equal(item, i);
    if (mark) popped.push(`${q.length}:${mark}`);
  }
  assert.deepEqual(popped, ["9:low"]);
  assert.equal(q.push("again"), null); // below the high mark again: no mark
});

test("marks are validated and an empty pop throws", () => {
  assert.throws(() => new RenderQueue(4, 2, 2), RangeError);
  assert.throws(() => new RenderQueue(4, 5, 1), RangeError);
  assert.throws(() => new RenderQueue(4, 3, 1).pop(), RangeError);
});

test("a long run keeps order and memory compact", () => {
  const q = new RenderQueue(8, 6, 2);
  let next = 0;
  for (let i = 0; i < 10000; i++) {
    q.push(i);
    if (i % 2 === 1) {
      assert.equal(q.pop()[0], next++);
      assert.equal(q.pop()[0], next++);
    }
  }
  assert.equal(q.length, 0);
});
