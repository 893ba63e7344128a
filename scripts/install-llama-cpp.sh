#!/usr/bin/env bash
# Install llama-cpp-python into the given venv, built with CPU flags that work on this host.
#
# Why: PyPI ships only the source, and the default (GGML_NATIVE) build enables AMX,
# whose first instruction faults inside some VMs (SIGSEGV on the first decode).
# We pick AVX flags from /proc/cpuinfo and never AMX, apply the project's patches
# (scripts/patches/llama-cpp-python-VERSION-*.patch, each saying why at its top),
# and cache the built wheel per (version, flags, patches) so a fresh venv on the same
# machine does not rebuild llama.cpp.
set -euo pipefail

venv_python=${1:?usage: install-llama-cpp.sh VENV_PYTHON VERSION}
version=${2:?usage: install-llama-cpp.sh VENV_PYTHON VERSION}

# shellcheck source=scripts/cpu-flags.sh
source "$(dirname "$0")/cpu-flags.sh"

patches=$(ls "$(dirname "$0")"/patches/llama-cpp-python-"$version"-*.patch 2>/dev/null || true)
export CMAKE_ARGS="$(cpu_flags)"
key=$( (echo "$version $CMAKE_ARGS"; [ -z "$patches" ] || cat $patches) | sha256sum | cut -c1-16)
prefix=$("$venv_python" -c 'import sys; print(sys.prefix)')
stamp="$prefix/.llama-cpp-python-$key"
if [ -f "$stamp" ]; then
    exit 0
fi

cache=${EDGE_LLM_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edge-llm/wheels}/$key
wheel=$(ls "$cache"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -n1 || true)

if [ -z "$wheel" ]; then
    echo "building llama-cpp-python $version (about 4 minutes) with: $CMAKE_ARGS" >&2
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$venv_python" -m pip download --quiet --no-deps --no-binary :all: -d "$tmp" \
        "llama-cpp-python==$version"
    tar -xzf "$tmp"/llama_cpp_python-"$version".tar.gz -C "$tmp"
    src="$tmp/llama_cpp_python-$version"
    for patch in $patches; do
        echo "  applying $(basename "$patch")" >&2
        patch -p1 -d "$src" --quiet < "$patch"
    done
    # nice and at most LLAMA_CPP_BUILD_JOBS (2) compile jobs: the build shares small machines.
    CMAKE_BUILD_PARALLEL_LEVEL=${LLAMA_CPP_BUILD_JOBS:-2} nice -n 10 \
        "$venv_python" -m pip wheel --quiet --no-deps --no-cache-dir -w "$tmp/wheel" "$src"
    mkdir -p "$cache"
    mv "$tmp"/wheel/llama_cpp_python-*.whl "$cache"/
    wheel=$(ls "$cache"/llama_cpp_python-"$version"-*.whl | head -n1)
fi

"$venv_python" -m pip install --quiet --no-deps --force-reinstall "$wheel"
rm -f "$prefix"/.llama-cpp-python-*
touch "$stamp"
