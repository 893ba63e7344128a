"""One result type for every check."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


class Status(enum.Enum):
    PASS = "pass"
    WARN = "warn"  # works, but something will bite (does not fail the run)
    FAIL = "fail"
    SKIP = "skip"  # could not run because an earlier check failed


@dataclass(frozen=True)
class CheckResult:
    """What a check found: a one-line ``summary`` and, unless it passed, a
    concrete ``fix``; ``details`` holds the measured values (JSON-serialisable)."""

    name: str
    status: Status
    summary: str
    fix: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "summary": self.summary,
            "fix": self.fix,
            "details": self.details,
        }


def passed(name: str, summary: str, **details: Any) -> CheckResult:
    return CheckResult(name, Status.PASS, summary, None, details)


def warned(name: str, summary: str, fix: str, **details: Any) -> CheckResult:
    return CheckResult(name, Status.WARN, summary, fix, details)


def failed(name: str, summary: str, fix: str, **details: Any) -> CheckResult:
    return CheckResult(name, Status.FAIL, summary, fix, details)


def skipped(name: str, reason: str) -> CheckResult:
    return CheckResult(name, Status.SKIP, f"skipped: {reason}")


def exit_code(results: Iterable[CheckResult]) -> int:
    """0 when nothing failed (warnings allowed), else 1."""
    return 1 if any(r.status is Status.FAIL for r in results) else 0
