# Sourced by the install scripts: cmake flags for ggml chosen from what this CPU
# reports, so the cached wheel's key (install-llama-cpp.sh) names the features it
# was built for and a wheel is never reused on a CPU that lacks them.
# x86-64: never AMX: the default native build enables it and its first instruction
# faults inside some VMs (SIGSEGV on the first decode).
# aarch64: the features of /proc/cpuinfo's `Features` line that
# scripts/install-aarch64.sh builds and checks under emulation (dotprod, fp16
# vector arithmetic, i8mm); SVE and SME are left off (not checked).
# usage: cpu_flags [MACHINE [CPUINFO]] (defaults: uname -m, /proc/cpuinfo; the
# arguments are for tests/unit/test_cpu_flags.py)
cpu_flags() {
    local machine=${1:-$(uname -m)} cpuinfo=${2:-/proc/cpuinfo}
    case "$machine" in
        x86_64) cpu_flags_x86 "$cpuinfo" ;;
        aarch64 | arm64) cpu_flags_aarch64 "$cpuinfo" ;;
        *) echo "-DGGML_NATIVE=ON" ;;
    esac
}

cpu_flags_x86() {
    local have args
    have=$(grep -m1 '^flags' "$1" || true)
    args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
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

# ARMv8.0 (Raspberry Pi 4's Cortex-A72) has none of the three; dotprod and fp16 came
# with ARMv8.2 (Pi 5's Cortex-A76, Jetson Orin's A78AE), i8mm with ARMv8.6 (phones
# since Cortex-X2/A710). gcc accepts each as an extension of armv8.2-a.
cpu_flags_aarch64() {
    local have arch=armv8-a extensions=""
    have=$(grep -m1 '^Features' "$1" || true)
    feature() { if grep -qw "$1" <<<"$have"; then arch=armv8.2-a extensions="$extensions+$2"; fi; }
    feature asimddp dotprod
    feature asimdhp fp16
    feature i8mm i8mm
    echo "-DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=$arch$extensions"
}
