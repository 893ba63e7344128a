"""Schemathesis fuzzes the served OpenAPI document: no input may cause a 5xx.

Driven through hypothesis directly: schemathesis' pytest plugin does not support
pytest 9 yet.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

pytestmark = pytest.mark.e2e

EXAMPLES_PER_OPERATION = 40


def test_no_input_produces_a_server_error(engine_factory) -> None:
    # No TTFT timeout: its 504 is not a bad-input answer, and a long fuzzed prompt
    # can take more than 10 s to prefill on a loaded machine.
    engine = engine_factory(
        "--max-tokens-cap", "4", "--default-max-tokens", "4", "--ttft-timeout-ms", "0"
    )
    schema = schemathesis.openapi.from_url(engine.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 5
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def call(case: schemathesis.Case) -> None:
            # Generous: a long fuzzed prompt prefills slowly on a loaded machine.
            response = case.call(timeout=300)
            what = f"{case.method} {case.path} {case.body!r}"
            assert response.status_code < 500, f"{what}: {response.text[:300]}"
            if response.status_code >= 400:
                assert "error" in response.json()

        call()
