// esbuild bundles: the package minified (its size is a goal: <= 15 kB gzipped) and the
// playground's script, which is committed in src/edge_llm/server/playground/app.js so
// that `make run` and the Python package need no Node. `npm run bundle` writes it;
// `node scripts/bundle.mjs --check` fails when the committed file is not current.
import { build } from "esbuild";
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";

const here = (path) => fileURLToPath(new URL(path, import.meta.url));
export const PLAYGROUND_OUT = here("../../../src/edge_llm/server/playground/app.js");
const BANNER = "// Built by `npm run bundle` in clients/js from clients/js/playground/app.js and the\n// @edge-llm/client sources: do not edit (a test checks that this file is current).";

async function bundle(entry, options) {
  const result = await build({
    entryPoints: [here(entry)], bundle: true, write: false, format: "esm", target: "es2022",
    platform: "neutral", legalComments: "none", logLevel: "silent", ...options,
  });
  return result.outputFiles[0].text;
}

/** The package as an app's bundler would ship it: minified; and its gzipped size. */
export async function librarySize() {
  const code = await bundle("../src/index.ts", { minify: true });
  return { minified: Buffer.byteLength(code), gzipped: gzipSync(code).length };
}

export async function playground() {
  return `${BANNER}\n${await bundle("../playground/app.js", { format: "iife", minify: false, charset: "utf8" })}`;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const code = await playground();
  if (process.argv.includes("--check")) {
    if (readFileSync(PLAYGROUND_OUT, "utf8") !== code) {
      console.error(`${PLAYGROUND_OUT} is stale: run \`npm run bundle\` in clients/js`);
      process.exit(1);
    }
  } else {
    writeFileSync(PLAYGROUND_OUT, code);
  }
  console.log(JSON.stringify(await librarySize()));
}
