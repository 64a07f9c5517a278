"""`draftwatch serve`'s banner says what mode the sidecar runs in."""

from __future__ import annotations

import pytest

from monitor.commands.main import main
from monitor.commands.serve import mode_of
from monitor.config import Settings
from monitor.proxy.settings import ModelRoute


def settings(**values: object) -> Settings:
    return Settings.from_env({"HOME": "/nonexistent"}).with_values(values)


def test_the_banner_names_the_mode() -> None:
    assert mode_of(settings(), None).startswith("ingest only")
    alone = mode_of(settings(**{"proxy.upstream": ("http://spec:8080",)}), None)
    assert alone == "proxy mode: 1 speculative upstream(s), no plain baseline (speedup not measured; add " \
                    "--baseline-upstream)"  # fmt: skip
    paired = settings(**{"proxy.upstream": ("http://a:1", "http://b:1"), "proxy.baseline_upstream": ("http://p:1",),
                         "proxy.on_net_loss": "route"})  # fmt: skip
    assert mode_of(paired, None) == "proxy mode: 2 speculative upstream(s), 1 plain baseline(s) by share, on a net " \
                                    "loss: route"  # fmt: skip


def test_a_baseline_without_an_upstream_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--baseline-upstream", "http://127.0.0.1:9"]) == 2
    assert "--baseline-upstream needs --upstream" in capsys.readouterr().err


def test_a_candidate_needs_a_speculative_upstream_and_is_named_in_the_banner(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["serve", "--candidate-upstream", "http://127.0.0.1:9"]) == 2
    assert "--candidate-upstream needs --upstream" in capsys.readouterr().err
    for declared in ("baseline", "candidate"):  # the pool behind --upstream said to be another pool
        monkeypatch.setenv("DRAFTWATCH_PROXY_SPECULATIVE", declared)
        assert main(["serve", "--upstream", "http://127.0.0.1:9", "--candidate-upstream", "http://127.0.0.1:10"]) == 2
        assert f"proxy.speculative={declared} with a candidate drafter" in capsys.readouterr().err
    staged = settings(**{"proxy.upstream": ("http://a:1",), "proxy.candidate_upstream": ("http://c:1",)})
    assert mode_of(staged, None).startswith("proxy mode: 1 speculative upstream(s), 1 candidate drafter upstream(s)")


def test_routes_without_a_default_upstream_are_refused_and_named_in_the_banner(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTWATCH_PROXY_ROUTES", '[{"model": "qwen*", "upstream": "http://127.0.0.1:9"}]')
    assert main(["serve"]) == 2
    assert "proxy.routes needs --upstream (proxy.upstream)" in capsys.readouterr().err
    routed = settings(**{"proxy.upstream": ("http://a:1",), "proxy.routes": (ModelRoute("q", ("http://q:1",)),)})
    assert mode_of(routed, None).startswith("proxy mode: 1 speculative upstream(s), 1 model route(s), no plain")
