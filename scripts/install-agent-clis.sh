#!/usr/bin/env bash
# Install the coding-agent CLIs the end-to-end tests drive (Claude Code, Codex) from
# the npm registry into a cache outside the repository, and link it from the venv.
#
# Why a cache: the two packages are large (native binaries); a fresh clone on the
# same machine reuses them, and the second run costs one file test. The cache is
# keyed by the pinned versions and node's major version, so a version bump installs
# next to the old one. When npm or the registry is missing, the install is skipped
# (exit 0) and the reason is written where the tests read it, so they skip saying why;
# in CI (CI=true) it fails instead (exit 1), so that CI never passes without the CLIs.
set -euo pipefail

venv=${1:?usage: install-agent-clis.sh VENV_DIR}
packages=(@anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0)

link="$venv/agent-clis"
skip="$venv/agent-clis.skip"

skip_with() {
    echo "$1" >"$skip"
    rm -f "$link"
    if [ "${CI:-}" = true ]; then
        echo "agent CLIs not installed: $1 (CI=true: the Claude Code / Codex tests need them)" >&2
        exit 1
    fi
    echo "agent CLIs not installed: $1 (the Claude Code / Codex tests will be skipped)" >&2
    exit 0
}

command -v npm >/dev/null 2>&1 || skip_with "npm is not on PATH"
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null) || skip_with "node does not run"
key=$(echo "${packages[*]} node$node_major" | sha256sum | cut -c1-16)
cache=${EDGE_LLM_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edge-llm/npm}/$key

if [ ! -f "$cache/.complete" ]; then
    echo "installing ${packages[*]} into $cache" >&2
    mkdir -p "${cache%/*}"
    tmp=$(mktemp -d "${cache%/*}/.tmp.XXXXXX")
    if ! npm install --prefix "$tmp" --no-audit --no-fund --no-save --loglevel=error \
        --fetch-retries=1 --fetch-timeout=60000 "${packages[@]}" >&2; then
        rm -rf "$tmp"
        skip_with "npm install ${packages[*]} failed (registry unreachable?)"
    fi
    touch "$tmp/.complete"
    rm -rf "$cache"
    mv "$tmp" "$cache"
fi

rm -f "$skip"
ln -sfn "$cache" "$link"
