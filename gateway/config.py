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
by the driver's settings model; every error names the offending key. Each ``[gateway]`` key is
declared once, as a field of ``GatewaySection``: its default, bounds, ``--help`` line and flag
(``Flag``), from which the command line and the core's ``GatewayOptions`` are derived.
"""

from __future__ import annotations

import difflib
import itertools
import tomllib
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator
from pydantic.fields import FieldInfo

from .contract.bounds import DEFAULT_BOUNDS
from .core.unread import PER_CALLER, PER_STREAM
from .errors import ConfigurationError
from .spi.backend import BackendSettings


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PluginsSection(_Strict):
    """Which backend plugins may be loaded."""

    allow: list[str] | None = None


@dataclass(frozen=True)
class Flag:
    """The command-line flag of a ``[gateway]`` key: the ``--help`` group it is listed in, and its
    name where it is not the key's (``--tls-cert`` for ``tls_cert_file``). A key without one is
    set in the file only."""

    group: str = ""
    name: str = ""

    def spelled(self, key: str) -> str:
        """The flag as typed: its own name, else the key's with dashes (``--max-in-flight``)."""
        return self.name or "--" + key.replace("_", "-")


def flag_of(field: FieldInfo) -> Flag | None:
    """The ``Flag`` a ``[gateway]`` key declares, or None for a key the file alone sets."""
    return next((item for item in field.metadata if isinstance(item, Flag)), None)


class CoreSettings(_Strict):
    """The ``[gateway]`` keys the gateway core applies (``core.gateway.GatewayOptions``): admission
    limits, bounds on client-sized fields, retention and polling. Each field is declared here once:
    its default, its constraint, its flag and its ``--help`` line (the description)."""

    max_in_flight: Annotated[int | None, Flag("limits")] = Field(default=4096, gt=0, description="concurrent requests")
    max_in_flight_per_token: Annotated[int | None, Flag("limits")] = Field(
        default=None, gt=0, description="concurrent requests of one token (default: --max-in-flight)"
    )
    max_subscriptions: Annotated[int | None, Flag("limits")] = Field(
        default=1024, gt=0, description="concurrent KV and runtime event subscriptions"
    )
    max_memory_mib: Annotated[int | None, Flag("limits")] = Field(
        default=None,
        gt=0,
        description="resident memory budget of the gateway process in MiB: new requests, probes and streams are "
        "refused (RESOURCE_EXHAUSTED, retry-after-ms) from nine tenths of it (default: no budget)",
    )
    max_unread_per_stream: Annotated[int, Flag("limits")] = Field(
        default=PER_STREAM,
        gt=0,
        description="tokens and candidates (one entry each) a Generate stream may hold unread for a slow client "
        "before it is ended with OVERLOADED and aborted",
    )
    max_unread_per_caller: Annotated[int, Flag("limits")] = Field(
        default=PER_CALLER,
        gt=0,
        description="the same over all streams of one caller (a token, or a connection without one)",
    )
    max_prompt_chars: Annotated[int | None, Flag("limits")] = Field(
        default=None, gt=0, description="characters of a text prompt or task input"
    )
    max_prompt_tokens: Annotated[int | None, Flag("limits")] = Field(
        default=None, gt=0, description="token ids of a token prompt or task input"
    )
    max_task_items: Annotated[int | None, Flag("limits")] = Field(
        default=None, gt=0, description="inputs of one Embed/Classify/Score call"
    )
    max_id_chars: Annotated[int, Flag("bounds")] = Field(
        default=DEFAULT_BOUNDS.max_id_chars,
        gt=0,
        description="characters of a request, session, item or group id, lora_name, cache_salt, metadata key or value",
    )
    max_stop_conditions: Annotated[int, Flag("bounds")] = Field(
        default=DEFAULT_BOUNDS.max_stop_conditions, gt=0, description="stop strings and stop token ids of one Generate"
    )
    max_stop_chars: Annotated[int, Flag("bounds")] = Field(
        default=DEFAULT_BOUNDS.max_stop_chars, gt=0, description="characters of one stop string"
    )
    max_guide_chars: Annotated[int, Flag("bounds")] = Field(
        default=DEFAULT_BOUNDS.max_guide_chars,
        gt=0,
        description="characters of a guided-decoding spec, or of all its choices",
    )
    max_candidate_ids: Annotated[int, Flag("bounds")] = Field(
        default=DEFAULT_BOUNDS.max_candidate_ids, gt=0, description="token ids of an explicit candidate selection"
    )
    max_num_sequences: Annotated[int, Flag("bounds")] = Field(
        default=DEFAULT_BOUNDS.max_num_sequences,
        gt=0,
        description="sequences of one Generate (narrows the advertised max_num_sequences)",
    )
    max_metadata_entries: Annotated[int, Flag("bounds")] = Field(
        default=DEFAULT_BOUNDS.max_metadata_entries, gt=0, description="entries of a request's metadata map"
    )
    max_path_chars: Annotated[int, Flag("bounds")] = Field(
        default=DEFAULT_BOUNDS.max_path_chars, gt=0, description="characters of a LoRA adapter's source_path"
    )
    health_poll_s: float = Field(
        default=1.0, gt=0, description="how often each engine's health and load are checked in the background"
    )
    finished_window: int = Field(
        default=65536, gt=0, description="finished request ids remembered, so that `Abort` of one says ALREADY_FINISHED"
    )
    kv_replay_batches: int = Field(
        default=4096, gt=0, description="KV event batches retained per rank for replay (`start_sequence_number`)"
    )
    subscriber_queue: int = Field(
        default=1024,
        gt=0,
        description="events a KV or runtime event subscriber may fall behind by before it is ended (retryable)",
    )
    max_probes_per_s: Annotated[float, Flag("limits")] = Field(
        default=1.0,
        gt=0,
        description="inference probes (Health with include_inference_probe) one caller, a token or else a client "
        "address, may start per second, after a burst of 5; each also holds an in-flight slot while it runs",
    )
    probe_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="how long a Health inference probe may take before the engine is reported NOT_READY",
    )
    lora_roots: Annotated[list[str], Flag("security", "--lora-root")] = Field(
        default=[], description="directory LoRA adapters must resolve into (repeatable; default any)"
    )


class GatewaySection(CoreSettings):
    """``[gateway]``: engine-neutral serving options; the command line's flags, derived from these
    fields, override them."""

    host: Annotated[str, Flag()] = Field(default="127.0.0.1", description="address to bind; loopback only unless set")
    port: Annotated[int, Flag()] = Field(default=50051, ge=0, le=65535, description="port to bind; 0 picks a free port")
    advertise_host: Annotated[str | None, Flag()] = Field(
        default=None, description="routable host to advertise instead of a wildcard bind address"
    )
    frontends: Annotated[int, Flag()] = Field(
        default=1,
        ge=1,
        le=256,
        description="gateway processes serving the address in front of the engines, each engine started once "
        "(above 1: the command supervises them; the backend must support it)",
    )
    drain_timeout_s: Annotated[float, Flag(name="--drain-timeout")] = Field(
        default=30.0, ge=0, description="seconds a SIGTERM drain waits before aborting"
    )
    log_format: Annotated[Literal["text", "json"], Flag()] = Field(
        default="text", description="log lines as text or JSON"
    )
    max_message_bytes: Annotated[int, Flag("limits")] = Field(
        default=64 * 1024 * 1024, gt=0, description="bytes of one gRPC message"
    )
    max_streams_per_connection: Annotated[int, Flag("limits")] = Field(
        default=4096,
        gt=0,
        description="HTTP/2 streams open at once on one connection, reset ones included until released: what a "
        "rapid-reset flood can hold (lower it, to 256 say, where clients keep fewer streams per connection)",
    )
    max_health_watches: Annotated[int, Flag("limits")] = Field(
        default=4096, gt=0, description="grpc.health.v1 Watch streams open at once (they need no token)"
    )
    max_health_watches_per_connection: Annotated[int, Flag("limits")] = Field(
        default=16, gt=0, description="grpc.health.v1 Watch streams open on one connection"
    )
    tls_cert_file: Annotated[Path | None, Flag("security", "--tls-cert")] = Field(
        default=None, description="PEM certificate chain: serve TLS"
    )
    tls_key_file: Annotated[Path | None, Flag("security", "--tls-key")] = Field(
        default=None, description="PEM private key of --tls-cert"
    )
    tls_client_ca_file: Annotated[Path | None, Flag("security", "--tls-client-ca")] = Field(
        default=None, description="PEM CA: require client certificates it signed (mTLS)"
    )
    auth_token_file: Annotated[Path | None, Flag("security")] = Field(
        default=None, description="bearer tokens for every RPC, one a line (also $OPENENGINE_AUTH_TOKENS)"
    )
    control_token_file: Annotated[Path | None, Flag("security")] = Field(
        default=None, description="tokens for Abort(all), Drain and LoRA load/unload (also $OPENENGINE_CONTROL_TOKENS)"
    )
    observer_token_file: Annotated[Path | None, Flag("security")] = Field(
        default=None, description="tokens for the KV and runtime event streams (also $OPENENGINE_OBSERVER_TOKENS)"
    )
    metrics_port: Annotated[int | None, Flag("metrics")] = Field(
        default=None, ge=0, le=65535, description="serve Prometheus metrics on this port (0 picks one)"
    )
    metrics_host: Annotated[str, Flag("metrics")] = Field(
        default="127.0.0.1", description="address for the metrics port; loopback only unless set, whatever --host"
    )
    metrics_tls: Annotated[bool, Flag("metrics")] = Field(
        default=False,
        description="serve metrics over HTTPS with --tls-cert/--tls-key (and --tls-client-ca: client certificates)",
    )


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


STICKY_SOURCES = ("cache_salt", "metadata.KEY")
"""Where a split finds a request's sticky key: ``kv.cache_salt``, or one entry of its ``metadata``."""


class LatencyLimit(_Strict):
    """A latency limit of a canary: the candidate's percentile at most ``max_ratio`` times the baseline's
    (failing only where the Mann-Whitney U test also finds it slower, ``judge``)."""

    percentile: float = Field(default=90.0, gt=0, lt=100)
    max_ratio: float = Field(default=1.2, ge=1)


class AnalysisLimits(_Strict):
    """What a canary's candidate must hold at every step: a latency or agreement limit omitted is not
    judged; the error rate always is."""

    ttft: LatencyLimit | None = None
    itl: LatencyLimit | None = None
    error_rate_delta: float | None = Field(default=0.01, ge=0, le=1)
    """The most the candidate's error rate may exceed the baseline's (the difference's interval must not lie above)."""
    agreement: float | None = Field(default=None, gt=0, le=1)
    """The least share of greedy outputs identical on both, from a mirror of the split to the candidate."""


class AnalysisSection(_Strict):
    """A split's canary (``[splits.analysis]``): the gateway steps the candidate's weight up while the
    verdict against the baseline holds, and rolls it back to 0 when a limit fails (``core.canary``)."""

    baseline: str = Field(min_length=1)
    candidate: str = Field(min_length=1)
    steps: list[int] = Field(default=[5, 25, 50, 100], min_length=1)
    """The candidate's weight (percent of the two engines' traffic) at each step, rising, ending at 100."""
    step_s: float = Field(default=60.0, gt=0)
    """The least time a step lasts before it is judged."""
    step_requests: int = Field(default=0, ge=0)
    """The least requests the candidate answers in a step before it is judged."""
    min_samples: int = Field(default=20, ge=2)
    """Observations each side needs for a verdict; below it the step waits for more traffic."""
    alpha: float = Field(default=0.01, gt=0, lt=1)
    """The significance level of the latency test."""
    confidence: float = Field(default=0.95, gt=0, lt=1)
    """Of the error-rate difference's interval."""
    paused: bool = False
    """Hold the current step (a reload pauses or resumes the canary with it)."""
    limits: AnalysisLimits = AnalysisLimits()

    @field_validator("steps")
    @classmethod
    def _steps(cls, steps: list[int]) -> list[int]:
        if any(not 0 < step <= 100 for step in steps) or any(a >= b for a, b in itertools.pairwise(steps)):
            raise ValueError("steps rise strictly, each from 1 to 100")
        if steps[-1] != 100 or len(steps) < 2:
            raise ValueError("the last step is 100 (the candidate promoted), after at least one below it")
        return steps


class SplitSection(_Strict):
    """One name served by several engines (``[[splits]]``): each request goes to one of them, chosen
    by weight, or by its sticky key when it has one (``routes``)."""

    name: str = Field(min_length=1)
    aliases: list[str] = []
    engines: dict[str, int] = Field(min_length=1)
    """Engine (served name) -> weight: its share of requests is its weight over the sum. A weight may
    be 0 (the engine takes no new requests, its sticky keys move), but not all of them."""
    sticky: list[str] = ["metadata.session", "cache_salt"]
    """Sticky key sources (``STICKY_SOURCES``), the first a request has wins: the same key always
    reaches the same engine while the weights stay, so a conversation keeps its prefix cache."""
    analysis: AnalysisSection | None = None
    """A canary: the baseline's and the candidate's weights are then the canary's, not ``engines``'."""

    @field_validator("engines")
    @classmethod
    def _weights(cls, engines: dict[str, int]) -> dict[str, int]:
        if any(not 0 <= weight <= 1_000_000 for weight in engines.values()):
            raise ValueError("a weight must be from 0 to 1000000")
        if not sum(engines.values()):
            raise ValueError("at least one engine needs a weight above 0")
        return engines

    @field_validator("sticky")
    @classmethod
    def _sources(cls, sticky: list[str]) -> list[str]:
        for source in sticky:
            if source != "cache_salt" and not (source.startswith("metadata.") and len(source) > len("metadata.")):
                raise ValueError(f"sticky source {source!r} is neither 'cache_salt' nor 'metadata.KEY'")
        return sticky


class MirrorSection(_Strict):
    """Copies of one name's Generate requests sent to a shadow engine (``[[mirrors]]``): the client is
    answered by the name's engine alone, the shadow's stream is compared with it and dropped."""

    name: str = Field(min_length=1)
    """A served name: an engine's, an alias, or a split's."""
    shadow: str = Field(min_length=1)
    """The engine (served name) that receives the copies."""
    percent: float = Field(default=100.0, gt=0, le=100)
    """The share of the name's requests copied."""
    max_in_flight: int = Field(default=32, gt=0, le=65536)
    """Copies running at once; a request past it is not copied (shed, and counted)."""


class Config(_Strict):
    """The whole configuration file."""

    plugins: PluginsSection = PluginsSection()
    gateway: GatewaySection = GatewaySection()
    backends: dict[str, dict[str, Any]] = {}
    engines: list[EngineSection] = []
    splits: list[SplitSection] = []
    mirrors: list[MirrorSection] = []
    _directory: Path | None = PrivateAttr(None)

    @property
    def directory(self) -> Path | None:
        """The file's directory, which its relative paths are written from (None: no file)."""
        return self._directory


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
    anchored = _anchored(config, path.absolute().parent)
    anchored._directory = path.absolute().parent
    return anchored


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


def anchor_typed_paths(
    settings_model: type[BaseModel], options: Mapping[str, Any], base: Path | None
) -> dict[str, Any]:
    """``options`` with each relative path a driver's settings model types as ``pathlib.Path``
    (``corpus: Path``, ``Path | None``) joined to ``base``, the configuration file's directory: the
    driver's own word for which options are paths, beside the name rule ``load_config`` applies."""
    fields = settings_model.model_fields
    return {
        key: _anchor(value, base)
        if base is not None and isinstance(value, str) and key in fields and _is_path(fields[key].annotation)
        else value
        for key, value in options.items()
    }


def _is_path(annotation: object) -> bool:
    """Whether a field's type is a ``Path``, or a union with one."""
    if isinstance(annotation, type):
        return issubclass(annotation, PurePath)
    return any(_is_path(arg) for arg in typing.get_args(annotation))


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
    "STICKY_SOURCES",
    "AnalysisLimits",
    "AnalysisSection",
    "Config",
    "CoreSettings",
    "EngineSection",
    "Flag",
    "GatewaySection",
    "LatencyLimit",
    "MirrorSection",
    "PluginsSection",
    "SplitSection",
    "anchor_typed_paths",
    "did_you_mean",
    "engine_settings",
    "flag_of",
    "load_config",
    "looks_like_path",
    "with_flags",
]
