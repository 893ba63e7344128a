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

cpu_flags() {
    local arch
    arch=$(uname -m)
    if [ "$arch" != "x86_64" ]; then
        echo "-DGGML_NATIVE=ON"
        return
    fi
    local have
    have=$(grep -m1 '^flags' /proc/cpuinfo || true)
    local args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    flag() { if grep -qw "$1" <<<"$have"; then args="$args -D$2=ON"; else args="$args -D$2=OFF"; fi; }
    flag avx GGML_AVX
    flag avx2 GGML_AVX2
    flag fma GGML_FMA
    flag f16c GGML_F16C
    flag bmi2 GGML_BMI2
    flag avx512f GGML_AVX512
    flag avx512_vnni GGML_AVX512_VNNI
    flag avx512vbmi GGML_AVX512_VBMI
    flag avx512_bf16 GGML_AVX512_BF16
    echo "$args"
}

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
