"""scripts/cpu-flags.sh: ggml's build flags from a CPU's /proc/cpuinfo (fake ones here)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cpu-flags.sh"

# Features lines as these boards' Linux kernels print them.
PI4_A72 = "fp asimd evtstrm crc32 cpuid"
PI5_A76 = (
    "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop "
    "asimddp"
)
PHONE_X3 = (
    "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma "
    "lrcpc dcpop sha3 sm3 sm4 asimddp sha512 asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg "
    "dcpodp flagm2 frint i8mm bf16 bti"
)  # a Cortex-X3 phone: SVE2 is fused off on most, so it is not in the line either


def cpu_flags(machine: str, cpuinfo: Path) -> str:
    command = f'source "{SCRIPT}"; cpu_flags "$0" "$1"'
    done = subprocess.run(
        ["bash", "-c", command, machine, str(cpuinfo)], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def fake_cpuinfo(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "cpuinfo"
    # Two cores, as an arm64 kernel prints them: the Features line once per core.
    core = f"processor\t: {{n}}\nBogoMIPS\t: 108.00\n{line}\nCPU implementer\t: 0x41\n\n"
    path.write_text(core.format(n=0) + core.format(n=1))
    return path


@pytest.mark.parametrize(
    ("features", "arch"),
    [
        (PI4_A72, "armv8-a"),
        (PI5_A76, "armv8.2-a+dotprod+fp16"),
        (PHONE_X3, "armv8.2-a+dotprod+fp16+i8mm"),
    ],
    ids=["raspberry-pi-4", "raspberry-pi-5", "phone"],
)
def test_aarch64_flags_come_from_the_features_line(
    tmp_path: Path, features: str, arch: str
) -> None:
    cpuinfo = fake_cpuinfo(tmp_path, f"Features\t: {features}")
    assert cpu_flags("aarch64", cpuinfo) == f"-DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH={arch}"


def test_a_feature_named_inside_another_word_is_not_taken(tmp_path: Path) -> None:
    """Whole words only: `asimddp_x` or `noi8mm` would not mean the feature."""
    cpuinfo = fake_cpuinfo(tmp_path, "Features\t: fp asimd asimddpx xi8mm")
    assert cpu_flags("aarch64", cpuinfo) == "-DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8-a"


def test_without_a_features_line_aarch64_builds_for_the_baseline(tmp_path: Path) -> None:
    cpuinfo = fake_cpuinfo(tmp_path, "Hardware\t: some board")
    assert cpu_flags("arm64", cpuinfo) == "-DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8-a"


def test_x86_flags_still_come_from_the_flags_line_and_never_amx(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c bmi2 amx_tile\n")
    flags = cpu_flags("x86_64", cpuinfo).split()
    assert "-DGGML_AVX2=ON" in flags and "-DGGML_AVX512=OFF" in flags
    assert "-DGGML_AMX_TILE=OFF" in flags and "-DGGML_NATIVE=OFF" in flags


def test_other_machines_build_natively(tmp_path: Path) -> None:
    assert cpu_flags("riscv64", tmp_path / "absent") == "-DGGML_NATIVE=ON"
