// `npm test`: Node's own test runner over test/*.test.mjs (the built dist/). Node 20
// has no global WebSocket: the flag gives it undici's (Node 22 has it by default).
import { spawnSync } from "node:child_process";
import { readdirSync } from "node:fs";

const files = readdirSync("test").filter((f) => f.endsWith(".test.mjs")).map((f) => `test/${f}`);
const major = Number(process.versions.node.split(".")[0]);
const flags = major < 22 ? ["--experimental-websocket"] : [];
const run = spawnSync(process.execPath, [...flags, "--test", ...files, ...process.argv.slice(2)], { stdio: "inherit" });
process.exit(run.status ?? 1);
