"""Property test: malformed and hostile bodies at /v1/events and the adapters never cause a 5xx or a partial batch."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from monitor.api.app import create_app
from monitor.store.engine import create_engine
from monitor.store.models import RequestRow
from tests.api.conftest import INGEST, auth, bodies, make_settings, records
from tests.api.test_api_adapters import LLAMACPP, SGLANG, VLLM

H = {**auth(INGEST), "Content-Type": "application/json"}
_ids = itertools.count()

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from(["", "\x00", "\ud800", "2026-13-45T99:99:99", "9" * 5000, "<script>", "'; DROP TABLE requests;--"]),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=20,
)


@st.composite
def record_like(draw: st.DrawFn) -> dict[str, Any]:
    """A valid record, then perhaps a few fields replaced, removed or added."""
    body = bodies(records(1, prefix=f"p{next(_ids)}"))[0]
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        action = draw(st.sampled_from(["replace", "remove", "add"]))
        key = draw(st.sampled_from(sorted(body))) if body else "x"
        if action == "replace":
            body[key] = draw(json_values)
        elif action == "remove":
            body.pop(key, None)
        else:
            body[draw(st.text(max_size=10))] = draw(json_values)
    return body


@st.composite
def stack_response(draw: st.DrawFn) -> tuple[str, Any]:
    stack, base = draw(st.sampled_from([("vllm", VLLM), ("llamacpp", LLAMACPP), ("sglang", SGLANG)]))
    body: dict[str, Any] = json.loads(json.dumps(base))
    body |= {"workload": "chat", "request_id": f"a{next(_ids)}", "target_model": "m"}
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        # Reach into the nested objects as well: timings, meta_info, metrics.speculative_decoding.
        target = body
        for key in ("timings", "meta_info", "metrics", "speculative_decoding"):
            if isinstance(target.get(key), dict) and draw(st.booleans()):
                target = target[key]
        target[draw(st.sampled_from(sorted(target) or ["x"]))] = draw(json_values)
    return stack, draw(st.sampled_from([body, {"events": [body]}, {"events": [body, body]}]))


SEEN: set[int] = set()


def _check(client: TestClient, count: Callable[[], int], path: str, content: bytes) -> None:
    before = count()
    response = client.post(path, content=content, headers=H)
    SEEN.add(response.status_code)
    assert response.status_code < 500, response.text
    assert response.status_code in (202, 400, 413, 422), response.status_code
    after = count()
    if response.status_code == 202:
        assert after - before == response.json()["stored"]
        assert response.json()["stored"] + response.json()["duplicates"] == response.json()["received"]
    else:
        assert after == before, "a refused batch stored something"
        assert set(response.json()) <= {"error", "message", "detail"}


def test_hostile_bodies(tmp_path: Path, sqlite_url: str) -> None:
    engine = create_engine(sqlite_url)

    def count() -> int:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(RequestRow)).scalar_one())

    profile = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    with TestClient(create_app(make_settings(tmp_path, sqlite_url))) as client:

        @profile
        @given(st.one_of(record_like(), st.lists(record_like(), max_size=4).map(lambda e: {"events": e}), json_values))
        def events(body: Any) -> None:
            _check(client, count, "/v1/events", json.dumps(body).encode())

        @profile
        @given(stack_response())
        def adapters(case: tuple[str, Any]) -> None:
            stack, body = case
            _check(client, count, f"/v1/events/{stack}", json.dumps(body).encode())

        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(st.binary(max_size=200), st.sampled_from(["/v1/events", "/v1/events/vllm", "/v1/events/sglang"]))
        def raw_bytes(content: bytes, path: str) -> None:
            _check(client, count, path, content)

        events()
        adapters()
        raw_bytes()
    engine.dispose()
    assert {202, 400, 422} <= SEEN  # the strategies reach acceptance as well as every refusal
