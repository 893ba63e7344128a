#!/usr/bin/env bash
# The JavaScript client's dev tools (typescript, esbuild; pinned in
# clients/js/package-lock.json) from the npm registry: `npm ci`, which also builds the
# package (its `prepare`). Idempotent: it runs again only when the lock file changed
# (npm's cache in ~/.npm makes a re-run cheap). Without node/npm the JS tests skip,
# saying why; in CI (CI=true) this fails instead, so CI never passes without them.
set -euo pipefail

dir=$(cd "$(dirname "$0")/../clients/js" && pwd)
stamp="$dir/node_modules/.package-lock.json"

missing() {
    if [ "${CI:-}" = true ]; then
        echo "install-js-client: $1 (CI=true: the JavaScript client's tests need it)" >&2
        exit 1
    fi
    echo "install-js-client: $1 (the JavaScript client's tests will be skipped)" >&2
    exit 0
}

command -v npm >/dev/null 2>&1 || missing "npm is not on PATH"
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null) || missing "node does not run"
[ "$major" -ge 20 ] || missing "node $major is older than 20"

if [ -f "$stamp" ] && [ "$stamp" -nt "$dir/package-lock.json" ] && [ -f "$dir/dist/index.js" ]; then
    exit 0
fi
echo "install-js-client: npm ci in $dir" >&2
if ! (cd "$dir" && npm ci --prefer-offline --no-audit --no-fund --loglevel=error \
    --fetch-retries=1 --fetch-timeout=60000 >&2); then
    rm -f "$stamp"
    missing "npm ci failed in clients/js (registry unreachable?)"
fi
touch "$stamp"
