#!/usr/bin/env bash
# Debian's Chromium for the playground's browser tests (Playwright drives it; its
# own `playwright install` would download a browser build, which we never do).
# Idempotent: returns at once when the browser is there; `apt-get update` only
# when the package is not known to apt yet or the install failed on stale lists.
set -euo pipefail

BROWSER="${EDGE_LLM_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$BROWSER" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chromium: no apt-get here; install Chromium and set EDGE_LLM_CHROMIUM to its path" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
install_it() {
    $SUDO apt-get install -y -q --no-install-recommends chromium >/dev/null
}
candidate="$(apt-cache policy chromium 2>/dev/null | sed -n 's/^ *Candidate: //p')"
if [ -z "$candidate" ] || [ "$candidate" = "(none)" ] || ! install_it; then
    $SUDO apt-get update -q >/dev/null
    install_it
fi
echo "install-chromium: $("$BROWSER" --version 2>/dev/null || echo "$BROWSER")"
