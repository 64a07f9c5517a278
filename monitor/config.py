"""Settings: the sections every room declares, composed and read from the environment and ``draftwatch.toml``.

Precedence is environment variable, then the config file, then the default. Each setting is
declared once, as a field of its room's section (``monitor/<room>/settings.py``, made with
:func:`monitor.settings.fields.setting`); this module only composes them, so it is the shell's:
the rooms below read their own section and never this whole. The table of docs/configuration.md is
generated from the same fields (``python -m monitor.commands.settings_doc``) and a test keeps it current.

The dotted name is also the location in the TOML file: ``recorder.queue_size`` is the key
``queue_size`` of the ``[recorder]`` table; names without a dot are top-level keys.

>>> s = Settings.from_env({"HOME": "/home/ada", "DRAFTWATCH_RECORDER_BATCH_SIZE": "250"}, None)
>>> s.recorder.batch_size, s.database.url
(250, 'sqlite:////home/ada/.local/share/draftwatch/draftwatch.db')
>>> Settings.from_env({"HOME": "/h", "DRAFTWATCH_RECORDER_BATCH_SIZE": "many"}, None)
Traceback (most recent call last):
...
monitor.settings.parsers.ConfigError: DRAFTWATCH_RECORDER_BATCH_SIZE='many': expected an integer
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from decoder.holdout import HoldoutPolicy
from monitor.alerts.settings import AlertConfig, AlertSettings
from monitor.api.settings import ApiSettings, DecoderSettings
from monitor.drift.settings import DriftSettings
from monitor.ingest.settings import CaptureSettings, RecorderSettings, ScrapeSettings
from monitor.notify.settings import DeliverySettings
from monitor.proxy.settings import ProxySettings, RolloutSettings
from monitor.scheduler.settings import RetentionSettings, SchedulerSettings
from monitor.settings.fields import Lookup, Spec, resolve, specs
from monitor.settings.masking import quoted
from monitor.settings.parsers import ConfigError, parse_path
from monitor.store.settings import DatabaseSettings

__all__ = ["ConfigError", "Settings", "all_specs", "default_config_file"]

log = logging.getLogger(__name__)

DEFAULT_CONFIG_FILE: Final = "draftwatch.toml"
# The embedded decoder's own variables (decoder/models/fetch.py, decoder/models/loading.py, decoder/cpu/): read
# there, beside the code they steer, so they are not settings; named here so none is taken for a typo.
DECODER_VARIABLES: Final = (
    "DRAFTWATCH_CACHE_DIR", "DRAFTWATCH_CPU_KERNELS", "DRAFTWATCH_DEVICE", "DRAFTWATCH_DTYPE", "DRAFTWATCH_QUANTIZE",
)  # fmt: skip
CONFIG_FILE_ENV: Final = "DRAFTWATCH_CONFIG"
DATA_DIR: Final = Spec(
    "data_dir",
    parse_path,
    "directory for the default SQLite database, the recorder's spool and the opt-in prompt sample "
    "(default: $XDG_DATA_HOME/draftwatch or ~/.local/share/draftwatch)",
)
# Section attribute of Settings -> the room's section class, in the settings table's order.
SECTIONS: Final[Mapping[str, type[Any]]] = {
    "database": DatabaseSettings,
    "recorder": RecorderSettings,
    "scrape": ScrapeSettings,
    "api": ApiSettings,
    "decoder": DecoderSettings,
    "proxy": ProxySettings,
    "rollout": RolloutSettings,
    "capture": CaptureSettings,
    "drift": DriftSettings,
    "delivery": DeliverySettings,
    "alerts": AlertSettings,
    "scheduler": SchedulerSettings,
    "retention": RetentionSettings,
}


def all_specs() -> Iterator[tuple[tuple[str, ...], Spec]]:
    """(attribute path in :class:`Settings`, spec) of every setting, ``data_dir`` first, in the table's order."""
    yield ("data_dir",), DATA_DIR
    for section, cls in SECTIONS.items():
        for name, spec in specs(cls):
            yield (section, name), spec


def _default_data_dir(environ: Mapping[str, str]) -> Path:
    # XDG first, as Linux desktop tools do; HOME comes from the injected mapping so tests stay hermetic.
    if environ.get("XDG_DATA_HOME"):
        return Path(environ["XDG_DATA_HOME"]) / "draftwatch"
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    return home / ".local" / "share" / "draftwatch"


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Resolved settings, one section per room; build with :meth:`from_env`."""

    data_dir: Path
    database: DatabaseSettings
    recorder: RecorderSettings
    scrape: ScrapeSettings
    api: ApiSettings
    decoder: DecoderSettings
    proxy: ProxySettings
    rollout: RolloutSettings
    capture: CaptureSettings
    drift: DriftSettings
    delivery: DeliverySettings
    alerts: AlertSettings
    scheduler: SchedulerSettings
    retention: RetentionSettings

    @classmethod
    def from_env(cls, environ: Mapping[str, str], config_file: Path | None = None) -> Settings:
        """Resolve every setting from ``environ``, then ``config_file`` (TOML), then the defaults."""
        lookup = _lookup(environ, config_file)
        found = lookup(DATA_DIR)
        data_dir = _default_data_dir(environ) if found is None else _parse(DATA_DIR, *found)
        sections = {name: resolve(section, lookup, data_dir) for name, section in SECTIONS.items()}
        return cls(data_dir=data_dir, **sections)

    @property
    def holdout_policy(self) -> HoldoutPolicy:
        """The decoder's holdout: a floor share, and a target per workload and drift window."""
        return HoldoutPolicy(
            share=self.decoder.holdout_share,
            target=self.decoder.holdout_target,
            max_share=self.decoder.holdout_max_share,
            window_s=self.drift.current_window.total_seconds(),
        )

    @property
    def alert_config(self) -> AlertConfig:
        """What an alert evaluation needs: the rules, the receivers, and the API's address for links."""
        return AlertConfig(self.alerts, self.delivery.receivers, self.api.url)

    def with_values(self, changes: Mapping[str, Any]) -> Settings:
        """A copy with settings changed by dotted name, typed values (``{"api.tokens": ()}``): flags and tests."""
        paths = {spec.name: path for path, spec in all_specs()}
        result = self
        for name, value in changes.items():
            if name not in paths:
                raise KeyError(f"{name!r}: not a setting")
            path = paths[name]
            if len(path) == 1:
                result = dataclasses.replace(result, **{path[0]: value})
            else:
                section = dataclasses.replace(getattr(result, path[0]), **{path[1]: value})
                result = dataclasses.replace(result, **{path[0]: section})
        return result


def _lookup(environ: Mapping[str, str], config_file: Path | None) -> Lookup:
    """Where each setting's raw value comes from: the environment, then the file (whose unknown keys are errors)."""
    file_values = _read_config_file(config_file) if config_file is not None else {}
    known = {spec.name for _, spec in all_specs()}
    unknown = sorted(set(file_values) - known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"{config_file}: {unknown[0]}={quoted(file_values[unknown[0]])}: unknown setting{hint}")

    def lookup(spec: Spec) -> tuple[str, Any] | None:
        if spec.env in environ:
            return spec.env, environ[spec.env]
        for old in spec.renamed_from:
            if old in environ:
                log.warning("%s is deprecated and will stop working: rename it to %s", old, spec.env)
                return old, environ[old]
        if spec.name in file_values:
            return f"{config_file}: {spec.name}", file_values[spec.name]
        return None

    return lookup


def sources(environ: Mapping[str, str], config_file: Path | None) -> dict[str, str]:
    """Each setting's source by dotted name: its variable, ``FILE: name``, or ``default``."""
    lookup = _lookup(environ, config_file)
    return {spec.name: found[0] if (found := lookup(spec)) else "default" for _, spec in all_specs()}


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each ``DRAFTWATCH_*`` variable that names no setting, with the closest one.

    >>> unknown_variables({"DRAFTWATCH_PROXY_UPSTEAM": "http://x", "DRAFTWATCH_API_PORT": "1"})
    ['DRAFTWATCH_PROXY_UPSTEAM is not a draftwatch setting and is ignored: did you mean DRAFTWATCH_PROXY_UPSTREAM?']
    """
    known = {env for _, spec in all_specs() for env in (spec.env, *spec.renamed_from)}
    known |= {CONFIG_FILE_ENV, *DECODER_VARIABLES}
    warnings = []
    for name in sorted(environ):
        if name.startswith("DRAFTWATCH_") and name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]}?" if close else "`draftwatch config show` lists the settings"
            warnings.append(f"{name} is not a draftwatch setting and is ignored: {hint}")
    return warnings


def _parse(spec: Spec, source: str, raw: Any) -> Any:
    try:
        return spec.parse(raw)
    except ValueError as error:
        raise ConfigError(f"{source}={raw!r}: {error}") from None


def default_config_file(environ: Mapping[str, str], cwd: Path) -> Path | None:
    """The config file to read: ``$DRAFTWATCH_CONFIG`` if set, else ``./draftwatch.toml`` if it exists."""
    if environ.get(CONFIG_FILE_ENV):
        return Path(environ[CONFIG_FILE_ENV]).expanduser()
    candidate = cwd / DEFAULT_CONFIG_FILE
    return candidate if candidate.is_file() else None


def _read_config_file(path: Path) -> dict[str, Any]:
    """Flatten the TOML file into dotted names (``{"recorder": {"batch_size": 5}}`` -> ``recorder.batch_size``)."""
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the config file: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML: {error}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not a config file: its arrays or tables nest thousands deep") from None
    flat: dict[str, Any] = {}

    def walk(prefix: str, table: Mapping[str, Any]) -> None:
        for key, value in table.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(f"{name}.", value)
            else:
                flat[name] = value

    walk("", document)
    return flat
