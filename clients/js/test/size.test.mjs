// The package's size, minified and gzipped as an app's bundler ships it (goal <= 15 kB).
import assert from "node:assert/strict";
import { test } from "node:test";
import { librarySize } from "../scripts/bundle.mjs";

test("the package is at most 15 kB minified and gzipped", async () => {
  const { minified, gzipped } = await librarySize();
  console.log(`@edge-llm/client: ${minified} B minified, ${gzipped} B gzipped`);
  assert.ok(gzipped <= 15 * 1024, `${gzipped} B gzipped`);
  assert.ok(minified > 5000, "the bundle holds the package"); // not an empty entry
});
