#!/usr/bin/env bash
# Install llama-cpp-python into the given venv, built with CPU flags that work on this host.
#
# Why: PyPI ships only the source, and the default (GGML_NATIVE) build enables AMX,
# whose first instruction faults inside some VMs (SIGSEGV on the first decode).
# We pick AVX flags from /proc/cpuinfo and never AMX, and cache the built wheel per
# (version, flags) so a fresh venv on the same machine does not rebuild llama.cpp.
set -euo pipefail

venv_python=${1:?usage: install-llama-cpp.sh VENV_PYTHON VERSION}
version=${2:?usage: install-llama-cpp.sh VENV_PYTHON VERSION}

if "$venv_python" - "$version" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if version("llama_cpp_python") == sys.argv[1] else 1)
PY
then
    exit 0
fi

# shellcheck source=scripts/cpu-flags.sh
source "$(dirname "$0")/cpu-flags.sh"

export CMAKE_ARGS="$(cpu_flags)"
key=$(echo "$version $CMAKE_ARGS" | sha256sum | cut -c1-16)
cache=${EDGE_LLM_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edge-llm/wheels}/$key
wheel=$(ls "$cache"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -n1 || true)

if [ -z "$wheel" ]; then
    echo "building llama-cpp-python $version (about 4 minutes) with: $CMAKE_ARGS" >&2
    tmp=$(mktemp -d)
    "$venv_python" -m pip wheel --quiet --no-deps --no-cache-dir -w "$tmp" "llama-cpp-python==$version"
    mkdir -p "$cache"
    mv "$tmp"/llama_cpp_python-*.whl "$cache"/
    rm -rf "$tmp"
    wheel=$(ls "$cache"/llama_cpp_python-"$version"-*.whl | head -n1)
fi

"$venv_python" -m pip install --quiet --no-deps "$wheel"
