"""``edge-llm doctor``: diagnoses why a client cannot stream from an endpoint.

Each check is a small function returning one :class:`CheckResult` (pass, warn,
fail or skip, with a concrete fix); :func:`run_checks` runs them in order.
Warnings do not fail the run: the exit code is 0 unless a check failed.
"""

from edge_llm.client.address import Setting
from edge_llm.doctor.result import CheckResult, Status, exit_code
from edge_llm.doctor.runner import run_checks
from edge_llm.doctor.settings import DoctorSettings, resolve

__all__ = [
    "CheckResult",
    "DoctorSettings",
    "Setting",
    "Status",
    "exit_code",
    "resolve",
    "run_checks",
]
