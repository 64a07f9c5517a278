"""Settings: defaults, precedence, the TOML file, and errors that quote key and value."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from monitor.config import SECTIONS, ConfigError, Settings, all_specs, default_config_file, unknown_variables
from monitor.settings.fields import Spec
from monitor.settings.parsers import parse_int

HOME = {"HOME": "/home/ada"}


def test_defaults_live_under_the_data_dir() -> None:
    s = Settings.from_env(HOME, None)
    assert s.data_dir == Path("/home/ada/.local/share/draftwatch")
    assert s.database.url == "sqlite:////home/ada/.local/share/draftwatch/draftwatch.db"
    assert s.recorder.spool_dir == s.data_dir / "spool"
    assert s.recorder.full_queue_policy == "block_then_spool"


def test_data_dir_moves_the_derived_defaults() -> None:
    s = Settings.from_env({**HOME, "DRAFTWATCH_DATA_DIR": "/srv/dw"}, None)
    assert s.database.url == "sqlite:////srv/dw/draftwatch.db"
    assert s.recorder.spool_dir == Path("/srv/dw/spool")
    assert Settings.from_env({**HOME, "XDG_DATA_HOME": "/x"}, None).data_dir == Path("/x/draftwatch")


def test_environment_beats_file_beats_default(tmp_path: Path) -> None:
    config = tmp_path / "draftwatch.toml"
    config.write_text(
        'data_dir = "/from/file"\n[database]\nurl = "postgresql+psycopg://u@h/db"\n'
        "[recorder]\nbatch_size = 64\nflush_interval_s = 0.5\n"
    )
    s = Settings.from_env({**HOME, "DRAFTWATCH_RECORDER_BATCH_SIZE": "128"}, config)
    assert s.recorder.batch_size == 128
    assert s.recorder.flush_interval_s == 0.5
    assert s.database.url == "postgresql+psycopg://u@h/db"
    assert s.recorder.spool_dir == Path("/from/file/spool")


@pytest.mark.parametrize(
    ("env", "quoted"),
    [
        ({"DRAFTWATCH_RECORDER_QUEUE_SIZE": "0"}, "DRAFTWATCH_RECORDER_QUEUE_SIZE='0'"),
        ({"DRAFTWATCH_RECORDER_FLUSH_INTERVAL_S": "soon"}, "DRAFTWATCH_RECORDER_FLUSH_INTERVAL_S='soon'"),
        ({"DRAFTWATCH_RECORDER_FULL_QUEUE_POLICY": "drop"}, "DRAFTWATCH_RECORDER_FULL_QUEUE_POLICY='drop'"),
        ({"DRAFTWATCH_DATABASE_URL": "mysql://x"}, "DRAFTWATCH_DATABASE_URL='mysql://x'"),
        ({"DRAFTWATCH_DATABASE_UPGRADE_ON_START": "maybe"}, "DRAFTWATCH_DATABASE_UPGRADE_ON_START='maybe'"),
    ],
)
def test_bad_environment_values_are_quoted(env: dict[str, str], quoted: str) -> None:
    with pytest.raises(ConfigError, match=quoted.replace("(", r"\(")):
        Settings.from_env({**HOME, **env}, None)


def test_bad_file_values_and_unknown_keys_are_quoted(tmp_path: Path) -> None:
    config = tmp_path / "draftwatch.toml"
    config.write_text("[recorder]\nbatch_size = -3\n")
    with pytest.raises(ConfigError, match=r"recorder\.batch_size=-3: expected an integer >= 1"):
        Settings.from_env(HOME, config)
    config.write_text("[recorder]\nbatch_sise = 3\n")
    with pytest.raises(ConfigError, match=r"recorder\.batch_sise=3: unknown setting"):
        Settings.from_env(HOME, config)
    config.write_text("[recorder\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Settings.from_env(HOME, config)
    with pytest.raises(ConfigError, match="cannot read"):
        Settings.from_env(HOME, tmp_path / "missing.toml")


def test_each_setting_is_declared_once_in_its_own_section() -> None:
    rows = list(all_specs())
    assert len({spec.name for _, spec in rows}) == len({spec.env for _, spec in rows}) == len(rows) == 115
    assert all(spec.env.startswith("DRAFTWATCH_") and spec.help for _, spec in rows)
    # A dotted name's table is the section that declares it (two lists of tables are top-level keys).
    for path, spec in rows[1:]:
        section, _, key = spec.name.rpartition(".")
        assert (section, key) == (path[0], path[1]) or spec.name in ("webhooks", "scrape"), spec.name
    assert set(SECTIONS) == {name for name, *_ in (path for path, _ in rows[1:])}


def test_every_variable_is_its_setting_name_upper_cased_with_dots_as_underscores() -> None:
    for _, spec in all_specs():
        assert spec.env == "DRAFTWATCH_" + spec.name.upper().replace(".", "_"), spec.name
    assert Spec("x.hold_share", parse_int(0), "a share").env == "DRAFTWATCH_X_HOLD_SHARE"


def test_a_renamed_variable_is_still_read_with_a_warning_naming_the_new_one(caplog: pytest.LogCaptureFixture) -> None:
    rules = '[{"name": "acceptance_drop", "severity": "critical"}]'
    old = {"DRAFTWATCH_HOLDOUT_TARGET": "7", "DRAFTWATCH_ALERT_RULES": rules}
    with caplog.at_level(logging.WARNING, logger="monitor.config"):
        s = Settings.from_env({**HOME, **old}, None)
    assert s.decoder.holdout_target == 7
    assert {r.name: r.severity for r in s.alerts.rules}["acceptance_drop"] == "critical"
    new = "DRAFTWATCH_DECODER_HOLDOUT_TARGET"
    assert f"DRAFTWATCH_HOLDOUT_TARGET is deprecated and will stop working: rename it to {new}" in caplog.messages
    assert any("DRAFTWATCH_ALERT_RULES" in m and "DRAFTWATCH_ALERTS_RULES" in m for m in caplog.messages)
    assert unknown_variables(old) == []  # a renamed variable is not a typo
    both = {**HOME, "DRAFTWATCH_HOLDOUT_TARGET": "7", "DRAFTWATCH_DECODER_HOLDOUT_TARGET": "9"}
    assert Settings.from_env(both, None).decoder.holdout_target == 9  # the new name wins


def test_the_prompt_sample_is_off_by_default_and_kept_apart_in_the_data_directory() -> None:
    s = Settings.from_env(HOME, None)
    assert (s.capture.share, s.capture.max_per_workload, s.capture.retention_days) == (0.0, 200, 7)
    assert s.capture.path == s.data_dir / "prompt-sample.db" != Path(s.database.url.removeprefix("sqlite:///"))
    with pytest.raises(ConfigError, match="DRAFTWATCH_CAPTURE_SHARE='1.5': expected a share between 0 and 1"):
        Settings.from_env({**HOME, "DRAFTWATCH_CAPTURE_SHARE": "1.5"})
    with pytest.raises(ConfigError, match="DRAFTWATCH_CAPTURE_RETENTION_DAYS='0': expected an integer >= 1"):
        Settings.from_env({**HOME, "DRAFTWATCH_CAPTURE_RETENTION_DAYS": "0"})


def test_with_values_changes_settings_by_dotted_name() -> None:
    s = Settings.from_env(HOME, None).with_values({"api.tokens": (), "database.url": "sqlite:///x.db", "webhooks": ()})
    assert (s.api.tokens, s.database.url, s.delivery.receivers) == ((), "sqlite:///x.db", ())
    assert s.recorder == Settings.from_env(HOME, None).recorder
    with pytest.raises(KeyError, match="'api.token': not a setting"):
        s.with_values({"api.token": ()})


def test_parsers_of_the_right_domain() -> None:
    # A relative floor is not a number of seconds; label names are not host names (kept as written).
    s = Settings.from_env(
        {**HOME, "DRAFTWATCH_DRIFT_LATENCY_FLOOR": "1.5", "DRAFTWATCH_ALERTS_GROUP_BY": "Workload,pair"}
    )
    assert (s.drift.latency_floor, s.alerts.group_by) == (1.5, ("Workload", "pair"))
    with pytest.raises(ConfigError, match="DRAFTWATCH_DRIFT_LATENCY_FLOOR='0': expected a positive relative change"):
        Settings.from_env({**HOME, "DRAFTWATCH_DRIFT_LATENCY_FLOOR": "0"})


def test_config_file_discovery(tmp_path: Path) -> None:
    assert default_config_file({}, tmp_path) is None
    (tmp_path / "draftwatch.toml").write_text("")
    assert default_config_file({}, tmp_path) == tmp_path / "draftwatch.toml"
    assert default_config_file({"DRAFTWATCH_CONFIG": "/etc/dw.toml"}, tmp_path) == Path("/etc/dw.toml")
