# Sourced by the install scripts: cmake flags for ggml chosen from what this CPU
# reports. Never AMX: the default native build enables it and its first
# instruction faults inside some VMs (SIGSEGV on the first decode).
cpu_flags() {
    if [ "$(uname -m)" != "x86_64" ]; then
        echo "-DGGML_NATIVE=ON"
        return
    fi
    local have args
    have=$(grep -m1 '^flags' /proc/cpuinfo || true)
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
