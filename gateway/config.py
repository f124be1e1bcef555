"""``plugins.toml``: which plugins may load, which engines to serve, with what options.

The file has four tables, all optional::

    [plugins]
    allow = ["mock", "vllm"]          # backends that may load; omit to allow all installed

    [gateway]
    host = "127.0.0.1"                # any GatewaySection field
    port = 50051

    [backends.vllm]                   # default options for a backend, whatever engine uses it
    enforce_eager = true

    [[engines]]                       # engines served when the command line names no backend
    backend = "mock"
    served_model_name = "mock"
    aliases = ["default"]
    options = { model = "mock-model" }

An engine's options are its backend's defaults overlaid with its own ``options``, validated
by the driver's settings model; every error names the offending key.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ConfigurationError
from .spi.backend import BackendSettings


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PluginsSection(_Strict):
    """Which backend plugins may be loaded."""

    allow: list[str] | None = None


class GatewaySection(_Strict):
    """Engine-neutral serving options (command-line flags override them)."""

    host: str = "127.0.0.1"
    port: int = Field(default=50051, ge=0, le=65535)
    advertise_host: str | None = None
    max_in_flight: int | None = Field(default=4096, gt=0)
    max_in_flight_per_token: int | None = Field(default=None, gt=0)
    max_subscriptions: int | None = Field(default=1024, gt=0)
    max_prompt_chars: int | None = Field(default=None, gt=0)
    max_prompt_tokens: int | None = Field(default=None, gt=0)
    max_task_items: int | None = Field(default=None, gt=0)
    max_id_chars: int = Field(default=1024, gt=0)
    max_stop_conditions: int = Field(default=1024, gt=0)
    max_stop_chars: int = Field(default=4096, gt=0)
    max_guide_chars: int = Field(default=1024 * 1024, gt=0)
    max_candidate_ids: int = Field(default=4096, gt=0)
    max_num_sequences: int = Field(default=128, gt=0)
    max_metadata_entries: int = Field(default=64, gt=0)
    max_path_chars: int = Field(default=4096, gt=0)
    health_poll_s: float = Field(default=1.0, gt=0)
    finished_window: int = Field(default=65536, gt=0)
    kv_replay_batches: int = Field(default=4096, gt=0)
    subscriber_queue: int = Field(default=1024, gt=0)
    probe_timeout_s: float = Field(default=30.0, gt=0)
    drain_timeout_s: float = Field(default=30.0, ge=0)
    lora_roots: list[str] = []
    max_message_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    auth_token_file: Path | None = None
    control_token_file: Path | None = None
    observer_token_file: Path | None = None
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    metrics_tls: bool = False
    log_format: Literal["text", "json"] = "text"


GATEWAY_PATH_FIELDS = tuple(
    name for name, field in GatewaySection.model_fields.items() if field.annotation == Path | None
)
"""The ``[gateway]`` keys that name a file."""


class EngineSection(_Strict):
    """One engine to serve."""

    backend: str
    served_model_name: str = ""
    aliases: list[str] = []
    options: dict[str, Any] = {}


class Config(_Strict):
    """The whole configuration file."""

    plugins: PluginsSection = PluginsSection()
    gateway: GatewaySection = GatewaySection()
    backends: dict[str, dict[str, Any]] = {}
    engines: list[EngineSection] = []


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``did you mean 'X'?`` for the choice closest to a misspelt ``word``, or ``""`` when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"did you mean {close[0]!r}?" if close else ""


def _describe(error: ValidationError, source: str, notes: Mapping[str, str] | None = None) -> str:
    """One line per error, naming its key (with its note from ``notes``: where it was set, what it may mean)."""
    lines = [f"{source}: invalid configuration"]
    for item in error.errors():
        loc = item["loc"]
        message = item["msg"].removeprefix("Value error, ")
        note = (notes or {}).get(str(loc[0])) if loc else None
        where = f" ({note})" if note else ""
        lines.append(f"  {'.'.join(str(part) for part in loc)}: {message}{where}" if loc else f"  {message}")
    return "\n".join(lines)


def looks_like_path(model: str) -> bool:
    """Whether a model value can only be a filesystem path, never a hub id.

    A hub id is ``name`` or ``owner/name`` and cannot start with ``/``, ``~`` or ``.``; so a value
    that starts with one of them (``/m``, ``~/m``, ``./m``, ``../m``, ``.models/m``) or has more
    than one ``/`` is a path. Anything else (``gpt2``, ``org/model``) is left to the engine to
    find, locally or on the hub.
    """
    return model.startswith(("/", "~", ".")) or model.count("/") > 1


def load_config(path: Path | None) -> Config:
    """Read and validate ``path``; no path means every default."""
    if path is None:
        return Config()
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigurationError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"{path}: not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{path}: not valid TOML: {exc}") from None
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigurationError(_describe(exc, str(path))) from None
    return _anchored(config, path.absolute().parent)


PATH_SUFFIXES = ("_file", "_path", "_dir")
"""An option whose name ends so holds a filesystem path (``ca_file``, ``download_dir``)."""
MAYBE_PATH_KEYS = frozenset({"model", "tokenizer"})
"""Options holding a path or a hub id: a path only when ``looks_like_path`` says so."""


def _anchored(config: Config, base: Path) -> Config:
    """``config`` with every relative path it holds made relative to ``base``, the file's directory.

    A file names paths from where it lies, so the gateway finds them whatever directory it was
    started from: the ``[gateway]`` files and LoRA roots, and every engine option (nested ones
    too) that is a path by its name (``PATH_SUFFIXES``) or by its value (``MAYBE_PATH_KEYS``).
    """
    gateway = config.gateway
    files = {
        name: Path(_anchor(str(value), base))
        for name in GATEWAY_PATH_FIELDS
        if (value := getattr(gateway, name)) is not None
    }
    return config.model_copy(
        update={
            "gateway": gateway.model_copy(
                update={**files, "lora_roots": [_anchor(root, base) for root in gateway.lora_roots]}
            ),
            "backends": {name: _anchor_options(options, base) for name, options in config.backends.items()},
            "engines": [
                engine.model_copy(update={"options": _anchor_options(engine.options, base)})
                for engine in config.engines
            ],
        }
    )


def _anchor_options(options: Mapping[str, Any], base: Path) -> dict[str, Any]:
    anchored: dict[str, Any] = {}
    for key, value in options.items():
        if isinstance(value, Mapping):
            value = _anchor_options(value, base)
        elif isinstance(value, str) and (
            key.endswith(PATH_SUFFIXES) or (key in MAYBE_PATH_KEYS and looks_like_path(value))
        ):
            value = _anchor(value, base)
        anchored[key] = value
    return anchored


def _anchor(value: str, base: Path) -> str:
    """``value`` joined to ``base`` when it is a relative path; absolute and ``~`` paths as given."""
    if not value or value.startswith("~") or Path(value).is_absolute():
        return value
    return str(base / value)


def with_flags(section: GatewaySection, flags: Mapping[str, Any]) -> GatewaySection:
    """``section`` with the command line's values over it (None = not given), validated as keys of
    ``[gateway]``: a flag takes exactly the values its key does."""
    given = {key: value for key, value in flags.items() if value is not None}
    try:
        return GatewaySection.model_validate({**section.model_dump(), **given})
    except ValidationError as exc:
        raise ConfigurationError(_describe(exc, "command line")) from None


def engine_settings(
    settings_model: type[BackendSettings],
    options: Mapping[str, Any],
    source: str,
    notes: Mapping[str, str] | None = None,
) -> BackendSettings:
    """Validate a driver's options with its own settings model; errors name the key, with its note
    from ``notes`` when it has one (``set in [backends.NAME]``, ``did you mean '--port'?``)."""
    try:
        return settings_model.model_validate(dict(options))
    except ValidationError as exc:
        raise ConfigurationError(_describe(exc, source, notes)) from None


__all__ = [
    "Config",
    "EngineSection",
    "GatewaySection",
    "PluginsSection",
    "did_you_mean",
    "engine_settings",
    "load_config",
    "looks_like_path",
    "with_flags",
]
