"""The sidecar's speculation controller decides each request's mode and survives a restart."""

from __future__ import annotations

import json
import time
from pathlib import Path

from fastapi.testclient import TestClient

from monitor.api.app import create_app
from monitor.api.decoding.controller_state import STATE_FILE
from tests.api.conftest import INGEST, auth, make_settings
from tests.api.test_api_decode import PROMPT, tiny_decoder


def test_controller_state_is_saved_and_resumed(tmp_path: Path, sqlite_url: str) -> None:
    # No holdout at all (share and target 0): each request is the controller's own choice.
    no_holdout = {"DRAFTWATCH_DECODER_HOLDOUT_SHARE": "0", "DRAFTWATCH_DECODER_HOLDOUT_TARGET": "0"}
    settings = make_settings(tmp_path, sqlite_url, **no_holdout)
    first = tiny_decoder()
    with TestClient(create_app(settings, decoder=first)) as client:
        for workload in ("code", "code", "chat"):
            body = {"prompt": PROMPT, "workload": workload, "max_new_tokens": 8}
            response = client.post("/v1/generate", json=body, headers=auth(INGEST))
            assert response.status_code == 200, response.text
            assert response.json()["record"]["mode"] in ("speculative", "plain")
    assert first.controller is not None
    (saved,) = json.loads((settings.data_dir / STATE_FILE).read_text())["arms"].values()
    assert saved["workloads"]["code"]["requests"] == 2 and saved["workloads"]["chat"]["requests"] == 1

    second = tiny_decoder()
    with TestClient(create_app(settings, decoder=second)):
        assert second.controller is not None
        assert second.controller.summary()["code"]["requests"] == 2
        assert second.controller.estimates("code") == first.controller.estimates("code")


def test_unreadable_state_starts_afresh(tmp_path: Path, sqlite_url: str) -> None:
    settings = make_settings(tmp_path, sqlite_url)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    (settings.data_dir / STATE_FILE).write_text("{not json")
    decoder = tiny_decoder()
    with TestClient(create_app(settings, decoder=decoder)) as client:
        response = client.post("/v1/generate", json={"prompt": PROMPT, "max_new_tokens": 4}, headers=auth(INGEST))
        assert response.status_code == 200
    assert decoder.controller is not None and decoder.controller.summary()["default"]["requests"] == 1


def test_the_pair_is_timed_at_start_before_any_request(tmp_path: Path, sqlite_url: str) -> None:
    """The worker times the pair's costs at start (decoder/speculation/calibration.py) and saves them for restarts."""
    settings = make_settings(tmp_path, sqlite_url)
    decoder = tiny_decoder()
    with TestClient(create_app(settings, decoder=decoder)):
        assert decoder.controller is not None
        deadline = time.monotonic() + 60
        while not (settings.data_dir / STATE_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        saved = json.loads((settings.data_dir / STATE_FILE).read_text())["arms"][decoder.labels[0]]
        assert not decoder.controller.needs_calibration
    assert saved["workloads"] == {}  # no request has run
    assert saved["costs"]["verify_passes"] > 0 and saved["costs"]["single_passes"] > 0
    assert set(saved["costs"]["sized_passes"]) == {str(k) for k in range(1, decoder.controller.gamma_max + 1)}
