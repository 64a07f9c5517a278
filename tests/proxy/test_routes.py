"""Several deployments behind one proxy ([[proxy.routes]]): a request's model picks its upstream pool and the
stack it is read as, the rest goes to proxy.upstream, a pool shares its load by least outstanding requests,
and /v1/models answers for all of them (issue 32, item 3). Stand-in upstreams on real ports."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from monitor.config import ConfigError, Settings
from tests.proxy.engine import Engine, flushed, rows, sidecar
from tests.proxy.upstream import Upstream, serving
from tests.serving import free_port
from tests.serving import serving as serving_app

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'proxy.db'}"


@pytest.fixture
def stubs() -> Iterator[list[tuple[Upstream, str]]]:
    """Three stand-in engines (vLLM's answers), each on its own port."""
    with ExitStack() as stack:
        made = [Upstream() for _ in range(3)]
        yield [(stub, stack.enter_context(serving(stub))) for stub in made]


def routes(*tables: dict[str, Any]) -> str:
    """``[[proxy.routes]]`` as the environment carries it (a JSON list of the same tables)."""
    return json.dumps(list(tables))


def models_seen(stub: Upstream) -> list[str]:
    return [body["model"] for path, _, body in stub.seen if path == "/v1/chat/completions" and body]


def test_a_model_reaches_its_route_by_exact_name_or_glob_is_read_as_its_kind_and_the_rest_goes_to_the_default(
    tmp_path: Path, db_url: str, stubs: list[tuple[Upstream, str]]
) -> None:
    (default, default_url), (exact, exact_url), (glob, glob_url) = stubs
    table = routes(
        {"model": "llama-3-8b", "upstream": exact_url, "kind": "sglang"},
        {"model": "qwen-*", "upstream": [glob_url]},
        {"model": "llama-*", "upstream": glob_url},  # llama-3-8b matched the route above first
    )
    with sidecar(tmp_path, db_url, default_url, DRAFTWATCH_PROXY_ROUTES=table) as (url, app):
        with httpx.Client(base_url=url, timeout=30) as client:
            for model in ("llama-3-8b", "qwen-coder", "qwen-max", "mistral", "Qwen-max"):
                for stub in (default, exact, glob):  # one record each: the engine's id is the record's
                    stub.chat = {**stub.chat, "id": f"chatcmpl-{model}"}
                response = client.post("/v1/chat/completions", json={"model": model, **CHAT})
                assert response.status_code == 200, model
        flushed(app)
    assert models_seen(exact) == ["llama-3-8b"]
    assert models_seen(glob) == ["qwen-coder", "qwen-max"]
    assert models_seen(default) == ["mistral", "Qwen-max"]  # globs match case and all
    # The sglang route is asked for SGLang's counts; the others get the body as the client wrote it.
    assert exact.seen[0][2]["return_meta_info"] is True  # type: ignore[index]
    assert all("return_meta_info" not in body for _, _, body in (*glob.seen, *default.seen) if body)
    # Each recorded under its own model, read as its deployment's stack.
    recorded = {row["target_model"]: row["source"] for row in rows(db_url)}
    assert recorded == {"llama-3-8b": "proxy:sglang"} | dict.fromkeys(
        ("qwen-coder", "qwen-max", "mistral", "Qwen-max"), "proxy:vllm"
    )


def test_the_engines_unrecorded_routes_follow_the_model_too(tmp_path: Path, db_url: str) -> None:
    default, routed = Engine(), Engine()
    with serving_app(default.app()) as default_url, serving_app(routed.app()) as routed_url:
        table = routes({"model": "bge-*", "upstream": routed_url})
        with sidecar(tmp_path, db_url, default_url, DRAFTWATCH_PROXY_ROUTES=table) as (url, _):
            embedded = httpx.post(f"{url}/v1/embeddings", json={"model": "bge-m3", "input": "hi"}, timeout=30)
            tokenized = httpx.post(f"{url}/tokenize", json={"content": "hi"}, timeout=30)  # names no model
    assert embedded.json() == {"path": "/v1/embeddings", "method": "POST"} and tokenized.status_code == 200
    assert [(m, p) for m, p, _, _ in routed.seen] == [("POST", "/v1/embeddings")]
    assert [(m, p) for m, p, _, _ in default.seen] == [("POST", "/tokenize")]


def test_the_docs_routes_example_is_a_valid_configuration(tmp_path: Path) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs/proxy.md").read_text()
    (example,) = [block for block in re.findall(r"```toml\n(.*?)```", page, re.S) if "[[proxy.routes]]" in block]
    (tmp_path / "draftwatch.toml").write_text(example)
    proxy = Settings.from_env({"HOME": str(tmp_path)}, tmp_path / "draftwatch.toml").proxy
    assert [(r.model, len(r.upstream), r.kind, len(r.baseline_upstream)) for r in proxy.routes] == [
        ("Qwen/Qwen2.5-Coder-*", 2, "vllm", 0),
        ("meta-llama/Llama-3.1-8B-Instruct", 1, "sglang", 1),
    ]


def test_a_pool_sends_each_request_to_the_replica_with_the_fewest_in_flight(
    tmp_path: Path, db_url: str, stubs: list[tuple[Upstream, str]]
) -> None:
    (default, default_url), (a, a_url), (b, b_url) = stubs
    for stub in (a, b):
        stub.stream_pause_s = 0.4  # a stream stays in flight for about two seconds
    table = routes({"model": "qwen-*", "upstream": [a_url, b_url]})
    quick = {"model": "qwen-coder", **CHAT}

    async def run(url: str) -> tuple[int, int]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            body = {"model": "qwen-coder", "stream": True, **CHAT}
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                events = response.aiter_raw()
                await anext(events)  # in flight at one replica
                busy, idle = (a, b) if a.seen else (b, a)
                for _ in range(3):
                    assert (await client.post("/v1/chat/completions", json=quick)).status_code == 200
                shared = (len(busy.seen), len(idle.seen))
                async for _ in events:
                    pass
            return shared

    with sidecar(tmp_path, db_url, default_url, DRAFTWATCH_PROXY_ROUTES=table) as (url, _):
        # While one replica holds a stream, the other takes every request.
        assert asyncio.run(run(url)) == (1, 3)
        with httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(6):
                assert client.post("/v1/chat/completions", json=quick).status_code == 200
    # Idle, they take turns: three more each.
    assert (len(a.seen) + len(b.seen), abs(len(a.seen) - len(b.seen))) == (10, 2) and not default.seen


def test_v1_models_lists_every_deployments_models_once_and_skips_one_that_fails(
    tmp_path: Path, db_url: str, stubs: list[tuple[Upstream, str]], caplog: pytest.LogCaptureFixture
) -> None:
    (default, default_url), (qwen, qwen_url), (llama, llama_url) = stubs
    default.models = [{"id": "mistral", "object": "model", "owned_by": "d"}, {"id": "shared", "owned_by": "d"}]
    qwen.models = [{"id": "qwen-coder", "object": "model", "owned_by": "q"}, {"id": "shared", "owned_by": "q"}]
    llama.models = [{"id": "llama-3", "object": "model", "owned_by": "l"}]
    dead = f"http://127.0.0.1:{free_port()}"
    table = routes(
        {"model": "qwen-*", "upstream": qwen_url},
        {"model": "gone-*", "upstream": dead},
        {"model": "llama-*", "upstream": llama_url},
    )
    with sidecar(tmp_path, db_url, default_url, DRAFTWATCH_PROXY_ROUTES=table) as (url, _):
        listed = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer engine-key"}, timeout=30)
    assert listed.status_code == 200 and listed.headers["content-type"] == "application/json"
    # Route order, the default last; a model two deployments name is the first one's.
    assert listed.json() == {
        "object": "list",
        "data": [*qwen.models[:1], {"id": "shared", "owned_by": "q"}, *llama.models, default.models[0]],
    }
    # Each deployment was asked with the client's credentials; the one that is down was skipped and said so.
    assert all(headers["authorization"] == "Bearer engine-key" for _, headers, _ in (*qwen.seen, *default.seen))
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("/v1/models: upstream")]
    assert skipped == [f"/v1/models: upstream {dead.removeprefix('http://')} skipped: ConnectError"]


def test_v1_models_is_a_502_in_openai_shape_when_no_deployment_answers_and_a_pass_through_with_one(
    tmp_path: Path, db_url: str, stubs: list[tuple[Upstream, str]]
) -> None:
    (default, default_url), *_ = stubs
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    with sidecar(tmp_path, db_url, dead[0], DRAFTWATCH_PROXY_ROUTES=routes({"model": "x", "upstream": dead[1]})) as (
        url,
        _,
    ):
        failed = httpx.get(f"{url}/v1/models", timeout=30)
    assert failed.status_code == 502
    assert failed.json() == {
        "error": {"message": "no upstream answered /v1/models", "type": "upstream_unavailable", "code": 502}
    }
    default.models = [{"id": "m", "created": 1, "object": "model", "owned_by": "vllm", "root": "m"}]
    direct = httpx.get(f"{default_url}/v1/models", timeout=30)
    with sidecar(tmp_path, db_url, default_url) as (url, _):
        passed = httpx.get(f"{url}/v1/models", timeout=30)
    assert (passed.status_code, passed.content) == (200, direct.content)


def config_error(tmp_path: Path, toml: str) -> str:
    path = tmp_path / "draftwatch.toml"
    path.write_text('[proxy]\nupstream = "http://127.0.0.1:8000"\n' + toml)
    with pytest.raises(ConfigError) as raised:
        Settings.from_env({"HOME": str(tmp_path)}, path)
    # "FILE: proxy.routes=[...]: route N: ...": where the value came from, then what is wrong with it.
    where, _, what = str(raised.value).partition(": route ")
    assert where.startswith(f"{path}: proxy.routes=[")
    return "route " + what


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ('[[proxy.routes]]\nmodel = "a"\nupstream = "http://h:1"\n[[proxy.routes]]\nmodel = "b"\nupstream = "h:2"\n',
         "route 2: upstream='h:2': expected an http:// or https:// base URL, such as http://127.0.0.1:8080"),
        ('[[proxy.routes]]\nmodel = "a"\nupstream = "http://h:1"\nkind = "tgi"\n',
         "route 1: kind='tgi': expected one of auto, vllm, sglang, llamacpp, openai"),
        ('[[proxy.routes]]\nmodel = "a"\nupstreams = "http://h:1"\n',
         "route 1: unknown key 'upstreams' (did you mean upstream?): the keys are model, upstream, kind, "
         "baseline_upstream, candidate_upstream"),
        ('[[proxy.routes]]\nupstream = "http://h:1"\n',
         "route 1: model is missing: each route needs model and upstream"),
        ('[[proxy.routes]]\nmodel = 7\nupstream = "http://h:1"\n',
         "route 1: model=7: expected a model name or a glob such as 'qwen*'"),
        ('[[proxy.routes]]\nmodel = "a"\nupstream = []\n', "route 1: upstream=[]: expected at least one base URL"),
        ('[[proxy.routes]]\nmodel = "a"\nupstream = "http://h:1"\nbaseline_upstream = ["http://b:1", "http://b:1"]\n',
         "route 1: baseline_upstream=['http://b:1', 'http://b:1']: expected each base URL once"),
    ],
)  # fmt: skip
def test_a_bad_route_is_refused_naming_its_number_key_and_value(tmp_path: Path, toml: str, expected: str) -> None:
    assert config_error(tmp_path, toml) == expected


def test_routes_come_from_the_file_in_order_with_their_kinds_and_pools(tmp_path: Path) -> None:
    path = tmp_path / "draftwatch.toml"
    path.write_text(
        '[proxy]\nupstream = "http://d:1"\nkind = "vllm"\n'
        '[[proxy.routes]]\nmodel = "qwen*"\nupstream = ["http://a:1", "http://b:1/"]\n'
        '[[proxy.routes]]\nmodel = "llama"\nupstream = "http://c:1"\nkind = "sglang"\nbaseline_upstream = "http://e:1"\n'
    )
    (qwen, llama) = Settings.from_env({"HOME": str(tmp_path)}, path).proxy.routes
    assert (qwen.model, qwen.upstream, qwen.kind, qwen.baseline_upstream) == ("qwen*", ("http://a:1", "http://b:1"),
                                                                              None, ())  # fmt: skip
    assert (llama.upstream, llama.kind, llama.baseline_upstream) == (("http://c:1",), "sglang", ("http://e:1",))
    assert str(qwen) == "qwen* -> [http://a:1 http://b:1] (proxy.kind)"


def test_v1_models_of_one_id_goes_to_the_deployment_that_models_route_names(tmp_path: Path, db_url: str) -> None:
    default, qwen, org = Engine(), Engine(), Engine()
    with (
        serving_app(default.app()) as default_url,
        serving_app(qwen.app()) as qwen_url,
        serving_app(org.app()) as org_url,
    ):
        table = routes({"model": "qwen-*", "upstream": qwen_url}, {"model": "Org/*", "upstream": org_url})
        with sidecar(tmp_path, db_url, default_url, DRAFTWATCH_PROXY_ROUTES=table) as (url, _):
            for model in ("qwen-coder", "Org/Model-7B", "Org%2FModel-7B", "mistral"):
                assert httpx.get(f"{url}/v1/models/{model}", timeout=30).status_code == 200, model
    assert [p for _, p, _, _ in qwen.seen] == ["/v1/models/qwen-coder"]
    assert [p for _, p, _, _ in org.seen] == ["/v1/models/Org/Model-7B"] * 2  # an escaped slash names it too
    assert [p for _, p, _, _ in default.seen] == ["/v1/models/mistral"]
