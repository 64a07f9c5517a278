"""Every operation of docs/openapi.json, fuzzed against a real ``draftwatch serve`` over HTTP.

Schemathesis generates requests from the committed document (seeded: ``derandomize`` makes the
examples the same on every run) and fails on a 500 and on any status the operation does not
declare. The server has tokens and no decoder, so the decode operations answer the 503 they declare
for that (schemathesis' own server-error check would count it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import status_code_conformance

from tests.api.conftest import ADMIN, auth
from tests.serving import free_port, serve_process

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = schemathesis.openapi.from_path(ROOT / "docs" / "openapi.json")
EXAMPLES = 25  # per operation: 19 operations, about 20 s in all


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("fuzz")
    port = free_port()
    process = serve_process(home, f"sqlite:///{home / 'draftwatch.db'}", port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.slow
@SCHEMA.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_operation_answers_5xx_or_an_undeclared_status(case: schemathesis.Case, server: str) -> None:
    response = case.call_and_validate(
        base_url=server, headers=auth(ADMIN), checks=[status_code_conformance], timeout=30
    )
    assert response.status_code != 500, response.text
