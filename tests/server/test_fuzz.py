"""Schema fuzzing over the server's own OpenAPI document: no request makes it answer 5xx or crash.

Schemathesis draws requests from /openapi.json, both valid ones (which the
engine really runs) and invalid ones (which must be refused as 4xx).
"""
from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_no_request_gets_a_server_error(server, mode):
    api = schemathesis.openapi.from_url(server.base_url + "/openapi.json")

    @given(case=api.as_strategy(mode))
    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def check(case):
        response = case.call(base_url=server.base_url, timeout=120)
        case.validate_response(response, checks=[not_a_server_error])
        assert response.status_code < 500, response.text  # 503 included: a request must not take the worker down

    check()
    assert httpx.get(server.base_url + "/health").status_code == 200
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200
