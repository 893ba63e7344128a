"""``doctor``'s memory check: the ledger's cap, the weights and the runtime against
the machine's memory, read from ``/debug/streams``."""

from __future__ import annotations

from typing import Any

from edge_llm.doctor.kv import RUNTIME_BYTES, diagnose_memory

MIB = 1 << 20


def document(cap_mb: int | None, machine_mb: int | None) -> dict[str, Any]:
    return {
        "memory_ledger": {
            "cap_bytes": cap_mb * MIB if cap_mb is not None else None,
            "total_bytes": 180 * MIB,
            "weights_bytes": 94 * MIB,
            "machine_bytes": machine_mb * MIB if machine_mb is not None else None,
        }
    }


def test_caps_the_machine_cannot_hold_are_a_warning_naming_the_key() -> None:
    result = diagnose_memory(document(4096, 2048))
    assert result is not None and result.status.value == "warn"
    assert result.fix is not None and "max_kv_cache_mb" in result.fix
    assert "2048.0" in result.fix
    assert result.details["need_bytes"] == 94 * MIB + 4096 * MIB + RUNTIME_BYTES


def test_caps_that_fit_pass_with_the_ledger_in_the_summary() -> None:
    result = diagnose_memory(document(256, 8192))
    assert result is not None and result.status.value == "pass"
    assert "memory ledger 180.0/256.0 MiB" in result.summary
    assert "of the machine's 8192.0" in result.summary


def test_exactly_the_machine_passes_one_byte_more_warns() -> None:
    need_mb = 94 + 256 + RUNTIME_BYTES // MIB
    assert diagnose_memory(document(256, need_mb)).status.value == "pass"  # type: ignore[union-attr]
    tight = document(256, need_mb)
    tight["memory_ledger"]["machine_bytes"] -= 1
    assert diagnose_memory(tight).status.value == "warn"  # type: ignore[union-attr]


def test_other_servers_and_unknown_machines() -> None:
    assert diagnose_memory({"streams": []}) is None
    unknown = diagnose_memory(document(256, None))
    assert unknown is not None and unknown.status.value == "pass"
    apart = diagnose_memory(document(None, 2048))
    assert apart is not None and "no common cap" in apart.summary


def test_every_served_models_weights_count_beside_the_one_cap() -> None:
    several = document(256, 1024)
    several["models"] = {"smol": {"weights_bytes": 94 * MIB}, "gemma": {"weights_bytes": 241 * MIB}}
    result = diagnose_memory(several)
    assert result is not None and "weights of 2 models 335.0" in result.summary
    assert result.details["need_bytes"] == 335 * MIB + 256 * MIB + RUNTIME_BYTES
    assert result.status.value == "pass"
    several["memory_ledger"]["machine_bytes"] = 700 * MIB  # one model would fit, two not
    assert diagnose_memory(several).status.value == "warn"  # type: ignore[union-attr]
