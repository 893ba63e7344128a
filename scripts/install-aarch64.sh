#!/usr/bin/env bash
# The project's patched llama.cpp for aarch64, cross-compiled and statically linked,
# and the check program that tests/e2e/test_aarch64.py runs under qemu-aarch64.
#
# Why: the devices this engine is for are nearly all ARM, and the patches
# (scripts/patches/) were written on x86. This builds the same sources as
# install-llama-cpp.sh (llama-cpp-python's vendored llama.cpp, the same patches)
# with Debian's cross toolchain and an ARMv8.2+ phone's features (dotprod, fp16
# vector arithmetic, i8mm: llama.cpp's android_armv8.6_1 variant), so a patch that
# breaks the ARM build, or the invariant kernels' promise there, turns `make test` red.
#
# Installs g++-aarch64-linux-gnu and qemu-user-static with apt when missing (a no-op
# when present). The libraries are cached in ~/.cache/edge-llm/aarch64/<key>, keyed by
# (version, flags, patches, this script's build steps); the check program beside them by
# its source.
# Prints the check program's path. Builds at nice 10 with LLAMA_CPP_BUILD_JOBS (2) jobs.
#
# usage: install-aarch64.sh VENV_PYTHON VERSION
set -euo pipefail

venv_python=${1:?usage: install-aarch64.sh VENV_PYTHON VERSION}
version=${2:?usage: install-aarch64.sh VENV_PYTHON VERSION}
here=$(cd "$(dirname "$0")" && pwd)
check_src="$here/../tests/aarch64/check.cpp"
arm_arch=${EDGE_LLM_ARM_ARCH:-armv8.2-a+dotprod+fp16+i8mm}
patch_dir=${EDGE_LLM_AARCH64_PATCHES:-$here/patches}
jobs=${LLAMA_CPP_BUILD_JOBS:-2}

install_tools() {
    if command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64-static >/dev/null; then
        return
    fi
    if ! command -v apt-get >/dev/null; then
        echo "install-aarch64: no apt-get; install an aarch64-linux-gnu g++ and qemu-aarch64-static" >&2
        exit 1
    fi
    local sudo="" pkgs="g++-aarch64-linux-gnu qemu-user-static"
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    export DEBIAN_FRONTEND=noninteractive
    # Other installs (install-chromium.sh) may hold dpkg's lock: wait for it.
    apt_install() {
        $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends $pkgs >/dev/null
    }
    echo "install-aarch64: installing $pkgs" >&2
    if ! apt_install; then
        $sudo apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null
        apt_install
    fi
}

cmake_flags() {
    echo "-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF"
    echo "-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64"
    echo "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++"
    echo "-DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=$arm_arch -DGGML_OPENMP=ON"
    echo "-DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF"
    echo "-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF"
    echo "-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF"
}

# The sdist as install-llama-cpp.sh takes it, its patches applied, cross-built into $1.
build_libraries() {
    local out=$1 tmp
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    echo "install-aarch64: cross-building llama.cpp $version for $arm_arch (10+ minutes on 2 cores)" >&2
    "$venv_python" -m pip download --quiet --no-deps --no-binary :all: -d "$tmp" \
        "llama-cpp-python==$version"
    tar -xzf "$tmp"/llama_cpp_python-"$version".tar.gz -C "$tmp"
    local src="$tmp/llama_cpp_python-$version"
    for patch in $patches; do
        echo "  applying $(basename "$patch")" >&2
        patch -p1 -d "$src" --quiet <"$patch"
    done
    # shellcheck disable=SC2046
    nice -n 10 cmake -S "$src/vendor/llama.cpp" -B "$tmp/build" -G Ninja $(cmake_flags) \
        -DCMAKE_INSTALL_PREFIX="$tmp/prefix" >"$tmp/cmake.log" 2>&1 ||
        { tail -n 40 "$tmp/cmake.log" >&2; exit 1; }
    nice -n 10 cmake --build "$tmp/build" --target llama -j "$jobs" >"$tmp/build.log" 2>&1 ||
        { grep -B2 -A12 -m5 'error' "$tmp/build.log" >&2 || tail -n 60 "$tmp/build.log" >&2; exit 1; }
    mkdir -p "$tmp/out/lib" "$tmp/out/include"
    find "$tmp/build" -name '*.a' -exec cp {} "$tmp/out/lib/" \;
    cp "$src"/vendor/llama.cpp/include/llama.h "$src"/vendor/llama.cpp/ggml/include/*.h "$tmp/out/include/"
    mkdir -p "$(dirname "$out")"
    rm -rf "$out"
    mv "$tmp/out" "$out"
    rm -rf "$tmp"
    trap - EXIT
}

install_tools
patches=$(ls "$patch_dir"/llama-cpp-python-"$version"-*.patch 2>/dev/null || true)
# The key: what the libraries are made of (this script's build steps, not its other lines).
key=$( (echo "$version"; declare -f cmake_flags build_libraries; cmake_flags
        [ -z "$patches" ] || cat $patches) | sha256sum | cut -c1-16)
cache=${EDGE_LLM_AARCH64_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edge-llm/aarch64}/$key
if [ ! -f "$cache/lib/libllama.a" ]; then
    build_libraries "$cache"
fi

check_key=$(sha256sum "$check_src" | cut -c1-16)
check="$cache/check-$check_key"
if [ ! -x "$check" ]; then
    libs="$cache/lib"
    # (The linker's warning about dlopen in a static binary is ggml's backend loader,
    # never called here: shown only when the link fails.)
    nice -n 10 aarch64-linux-gnu-g++ -O2 -std=c++17 -march="$arm_arch" -static -fopenmp \
        -I"$cache/include" "$check_src" -o "$check.tmp" \
        "$libs/libllama.a" "$libs/libggml.a" "$libs/libggml-cpu.a" "$libs/libggml-base.a" \
        -lpthread >"$check.log" 2>&1 || { cat "$check.log" >&2; exit 1; }
    mv "$check.tmp" "$check"
fi
# The test finds the program through the venv: this build's, whatever the cache holds.
ln -sfn "$check" "$("$venv_python" -c 'import sys; print(sys.prefix)')/bin/edge-llm-aarch64-check"
echo "$check"
