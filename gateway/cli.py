"""``openengine-gateway``: serve engines over OpenEngine, or list installed backends.

    openengine-gateway [serve] [--backend NAME] [--model M] [--served-model-name N]
                       [--alias A ...] [--host H] [--port P] [--config plugins.toml]
                       [--tls-cert F --tls-key F [--tls-client-ca F]]
                       [--auth-token-file F] [--control-token-file F] [--observer-token-file F]
                       [--metrics-port P]
                       [--<limit> N ...] [--log-format text|json] [--<driver-option> VALUE ...]
    openengine-gateway backends
    openengine-gateway conformance --target HOST:PORT [--model M] [--json FILE]
    openengine-gateway bench --target HOST:PORT/MODEL [--target ...] [--concurrency N | --request-rate R]
                       [--num-requests N] [--duration S] [--json FILE] [--report DIR] (--help for the rest)

Options the gateway does not know are the driver's: ``--backend mock --max-running-requests 8``
gives the mock ``max_running_requests="8"`` for its settings model to validate (a flag without a
value is ``true``; a repeated flag is a list). Without ``--backend`` the engines come from the
``[[engines]]`` tables of the configuration file. Every serving flag has a ``[gateway]`` key
of the same name (``--tls-cert`` is ``tls_cert_file``); the flag wins.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import logs
from .config import Config, EngineSection, GatewaySection, did_you_mean, load_config, with_flags
from .core.gateway import Gateway, GatewayOptions
from .errors import ConfigurationError, EngineStartError, SetupError
from .launch import start_engines
from .plugins import installed_backends, missing_packages
from .server.app import GatewayServer, ServerOptions, reserved
from .server.auth import TokenAuth
from .server.tls import TlsFiles

log = logging.getLogger("openengine_gateway")

DEFAULT_CONFIG = "plugins.toml"


def parse_driver_flags(tokens: Sequence[str]) -> dict[str, Any]:
    """``--key value`` / ``--key=value`` / ``--flag`` tokens as a driver options mapping."""
    options: dict[str, Any] = {}
    position = 0
    while position < len(tokens):
        token = tokens[position]
        if not token.startswith("--") or token == "--" or token.startswith("--="):
            raise ConfigurationError(f"unexpected argument {token!r}; driver options look like --name value")
        key, has_value, value = token[2:].partition("=")
        parsed: Any = value if has_value else True
        if not has_value and position + 1 < len(tokens) and not tokens[position + 1].startswith("--"):
            parsed = tokens[position + 1]
            position += 1
        key = key.replace("-", "_")
        if key in options:
            previous = options[key]
            options[key] = [*previous, parsed] if isinstance(previous, list) else [previous, parsed]
        else:
            options[key] = parsed
        position += 1
    return options


COMMANDS = {
    "serve": "serve engines over OpenEngine v1 gRPC (the default command; these options)",
    "backends": "list the installed backends, and which of them cannot start here and why",
    "conformance": "check any OpenEngine endpoint against the contract, rule by rule",
    "bench": "benchmark OpenEngine endpoints with one seeded workload, side by side",
}
"""The subcommands, each with the line ``--help`` shows for it."""

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _parser(prog: str = "openengine-gateway") -> argparse.ArgumentParser:
    """The ``serve`` command's parser (``prog`` names it as invoked: with ``serve`` or without)."""
    commands = "\n".join(f"  {name:<12} {line}" for name, line in COMMANDS.items())
    usage = "%(prog)s [options] [--DRIVER-OPTION VALUE ...]"
    if prog == "openengine-gateway":
        usage = "%(prog)s [serve] [options] [--DRIVER-OPTION VALUE ...]\n       %(prog)s COMMAND [options]"
    parser = argparse.ArgumentParser(
        prog=prog,
        usage=usage,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve the OpenEngine v1 gRPC contract in front of inference engines.\n\n"
        f"commands (openengine-gateway COMMAND --help):\n{commands}",
        epilog="Options the gateway does not know are the --backend's own (--backend mock --max-running-requests 8).\n"
        "Exit status: 0 after a graceful stop, 1 when an engine fails to start, 2 on a usage error.",
    )
    parser.add_argument("--backend", help="backend to serve (an entry point in openengine.backends)")
    parser.add_argument("--model", help="model path or id for the backend to load")
    parser.add_argument(
        "--served-model-name", help="the name clients use (default: the model, else the backend's name)"
    )
    parser.add_argument("--alias", action="append", default=[], help="another name for the model (repeatable)")
    parser.add_argument("--config", type=Path, help=f"configuration file (default: ./{DEFAULT_CONFIG} if present)")
    parser.add_argument("--host", help="address to bind (default 127.0.0.1: loopback only)")
    parser.add_argument("--port", type=int, help="port to bind (default 50051; 0 picks a free port)")
    parser.add_argument("--advertise-host", help="routable host to advertise instead of a wildcard bind address")
    parser.add_argument("--drain-timeout", type=float, help="seconds a SIGTERM drain waits before aborting")
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=os.environ.get("OPENENGINE_LOG_LEVEL", "INFO"),
        help="log level (default INFO, or $OPENENGINE_LOG_LEVEL)",
    )
    parser.add_argument("--log-format", choices=("text", "json"), help="log lines as text (default) or JSON")
    security = parser.add_argument_group("security")
    security.add_argument("--tls-cert", type=Path, help="PEM certificate chain: serve TLS")
    security.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    security.add_argument("--tls-client-ca", type=Path, help="PEM CA: require client certificates it signed (mTLS)")
    security.add_argument(
        "--auth-token-file", type=Path, help="bearer tokens for every RPC, one a line (also $OPENENGINE_AUTH_TOKENS)"
    )
    security.add_argument(
        "--control-token-file",
        type=Path,
        help="tokens for Abort(all), Drain and LoRA load/unload (also $OPENENGINE_CONTROL_TOKENS)",
    )
    security.add_argument(
        "--observer-token-file",
        type=Path,
        help="tokens for the KV and runtime event streams (also $OPENENGINE_OBSERVER_TOKENS)",
    )
    security.add_argument(
        "--lora-root", action="append", help="directory LoRA adapters must resolve into (repeatable; default any)"
    )
    limits = parser.add_argument_group(
        "limits (past them: RESOURCE_EXHAUSTED; a task batch over its advertised size: INVALID_ARGUMENT)"
    )
    for flag, what in (
        ("--max-in-flight", "concurrent requests (default 4096)"),
        ("--max-in-flight-per-token", "concurrent requests of one token (default: --max-in-flight)"),
        ("--max-subscriptions", "concurrent KV and runtime event subscriptions (default 1024)"),
        ("--max-prompt-chars", "characters of a text prompt or task input"),
        ("--max-prompt-tokens", "token ids of a token prompt or task input"),
        ("--max-task-items", "inputs of one Embed/Classify/Score call"),
        ("--max-message-bytes", "bytes of one gRPC message (default 64 MiB)"),
    ):
        limits.add_argument(flag, type=int, help=what)
    bounds = parser.add_argument_group("bounds on client-sized fields (past them: INVALID_ARGUMENT)")
    for flag, what in (
        (
            "--max-id-chars",
            "characters of a request, session, item or group id, lora_name, cache_salt, metadata key or value "
            "(default 1024)",
        ),
        ("--max-stop-conditions", "stop strings and stop token ids of one Generate (default 1024)"),
        ("--max-stop-chars", "characters of one stop string (default 4096)"),
        ("--max-guide-chars", "characters of a guided-decoding spec, or of all its choices (default 1048576)"),
        ("--max-candidate-ids", "token ids of an explicit candidate selection (default 4096)"),
        ("--max-num-sequences", "sequences of one Generate (narrows the advertised max_num_sequences) (default 128)"),
        ("--max-metadata-entries", "entries of a request's metadata map (default 64)"),
        ("--max-path-chars", "characters of a LoRA adapter's source_path (default 4096)"),
    ):
        bounds.add_argument(flag, type=int, help=what)
    metrics = parser.add_argument_group("metrics")
    metrics.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (0 picks one)")
    metrics.add_argument(
        "--metrics-host", help="address for the metrics port (default 127.0.0.1: loopback only, whatever --host)"
    )
    metrics.add_argument(
        "--metrics-tls",
        action="store_true",
        default=None,
        help="serve metrics over HTTPS with --tls-cert/--tls-key (and --tls-client-ca: client certificates)",
    )
    return parser


def _config_path(explicit: Path | None) -> Path | None:
    if explicit is not None:
        return explicit
    env = os.environ.get("OPENENGINE_GATEWAY_CONFIG")
    if env:
        return Path(env)
    default = Path(DEFAULT_CONFIG)
    return default if default.is_file() else None


def _engine_sections(args: argparse.Namespace, extra: Sequence[str], config: Config) -> list[EngineSection]:
    if args.backend is None:
        if extra:
            raise ConfigurationError(_unknown_options(extra))
        if args.model or args.served_model_name or args.alias:
            raise ConfigurationError("--model, --served-model-name, --alias and driver options need --backend")
        return list(config.engines)
    options = parse_driver_flags(extra)
    if args.model is not None:
        options["model"] = args.model
    return [
        EngineSection(
            backend=args.backend,
            served_model_name=args.served_model_name or "",
            aliases=list(args.alias),
            options=options,
        )
    ]


def _unknown_options(extra: Sequence[str]) -> str:
    """Options that are no gateway flag, with no --backend to take them as its own: a typo, most likely."""
    lines = ["unknown options (driver options need --backend):"]
    for option in (token.partition("=")[0] for token in extra if token.startswith("-")):
        hint = did_you_mean(option, gateway_flags())
        lines.append(f"  {option}{': ' + hint if hint else ''}")
    return "\n".join(lines)


def gateway_flags() -> list[str]:
    """Every ``--flag`` the gateway itself takes (a driver's options are the rest)."""
    return [flag for action in _parser()._actions for flag in action.option_strings if flag.startswith("--")]


def _gateway_section(args: argparse.Namespace, config: Config) -> GatewaySection:
    """``[gateway]`` with the flags over it: each flag is the key of the same name, validated alike."""
    return with_flags(
        config.gateway,
        {
            "host": args.host,
            "port": args.port,
            "advertise_host": args.advertise_host,
            "drain_timeout_s": args.drain_timeout,
            "log_format": args.log_format,
            "tls_cert_file": args.tls_cert,
            "tls_key_file": args.tls_key,
            "tls_client_ca_file": args.tls_client_ca,
            "auth_token_file": args.auth_token_file,
            "control_token_file": args.control_token_file,
            "observer_token_file": args.observer_token_file,
            "lora_roots": args.lora_root,
            "max_in_flight": args.max_in_flight,
            "max_in_flight_per_token": args.max_in_flight_per_token,
            "max_subscriptions": args.max_subscriptions,
            "max_prompt_chars": args.max_prompt_chars,
            "max_prompt_tokens": args.max_prompt_tokens,
            "max_task_items": args.max_task_items,
            "max_message_bytes": args.max_message_bytes,
            "max_id_chars": args.max_id_chars,
            "max_stop_conditions": args.max_stop_conditions,
            "max_stop_chars": args.max_stop_chars,
            "max_guide_chars": args.max_guide_chars,
            "max_candidate_ids": args.max_candidate_ids,
            "max_num_sequences": args.max_num_sequences,
            "max_metadata_entries": args.max_metadata_entries,
            "max_path_chars": args.max_path_chars,
            "metrics_port": args.metrics_port,
            "metrics_host": args.metrics_host,
            "metrics_tls": args.metrics_tls,
        },
    )


async def serve(args: argparse.Namespace, extra: Sequence[str]) -> int:
    """Hold the ports, start engines, then serve (a port in use is reported before any engine loads);
    stop gracefully on SIGINT/SIGTERM (one during startup stops
    the gateway once it has started, so that no engine is left half started, or quietly when the
    signal also stopped the engine starting)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    drain_timeout = 0.0

    def on_signal(signum: int) -> None:
        if stop.is_set():
            log.warning("second %s: stopping now", signal.Signals(signum).name)
            os._exit(1)
        log.info("%s: draining (up to %.0fs), then stopping", signal.Signals(signum).name, drain_timeout)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    config = load_config(_config_path(args.config))
    section = _gateway_section(args, config)
    logs.configure(args.log_level, section.log_format)
    sections = _engine_sections(args, extra, config)
    options = GatewayOptions(
        max_in_flight=section.max_in_flight,
        max_in_flight_per_token=section.max_in_flight_per_token,
        max_subscriptions=section.max_subscriptions,
        max_prompt_chars=section.max_prompt_chars,
        max_prompt_tokens=section.max_prompt_tokens,
        max_task_items=section.max_task_items,
        max_id_chars=section.max_id_chars,
        max_stop_conditions=section.max_stop_conditions,
        max_stop_chars=section.max_stop_chars,
        max_guide_chars=section.max_guide_chars,
        max_candidate_ids=section.max_candidate_ids,
        max_num_sequences=section.max_num_sequences,
        max_metadata_entries=section.max_metadata_entries,
        max_path_chars=section.max_path_chars,
        health_poll_s=section.health_poll_s,
        finished_window=section.finished_window,
        kv_replay_batches=section.kv_replay_batches,
        subscriber_queue=section.subscriber_queue,
        probe_timeout_s=section.probe_timeout_s,
        lora_roots=tuple(section.lora_roots),
        advertise_host=section.advertise_host or _routable(section.host),
    )
    drain_timeout = section.drain_timeout_s
    with reserved(_server_options(section)) as server_options:  # a port in use is refused before engines load
        try:
            engines = await start_engines(
                sections, config, command_line=args.backend is not None, gateway_flags=gateway_flags()
            )
        except EngineStartError as exc:
            if not stop.is_set():
                raise
            log.info("stopped during startup (%s)", exc)  # a terminal's Ctrl-C also reaches the engine's processes
            return 0
        server = GatewayServer(Gateway(engines, options), server_options)
        try:
            await server.start()
        except BaseException:
            await server.gateway.stop()
            raise
    log.debug("froze %d objects left by startup out of garbage collection", freeze_startup_objects())
    names = ", ".join(f"{e.served_name} ({e.facts.engine_name} {e.facts.engine_version})" for e in engines)
    tls = server_options.tls
    scheme = "plaintext" if tls is None else "mTLS" if tls.mutual else "TLS"
    metrics = f", metrics on port {server.metrics_port}" if server.metrics_port is not None else ""
    print(f"openengine-gateway serving {names} on {server.address} ({scheme}{metrics})", flush=True)
    await stop.wait()
    await server.stop(drain_timeout)
    log.info("stopped")
    return 0


def freeze_startup_objects() -> int:
    """Move everything allocated while starting out of the garbage collector's reach; returns how many.

    An engine's libraries leave the heap with hundreds of thousands of long-lived objects (about
    600,000 with vLLM, torch and transformers imported), and a full collection walks them all: about
    300 ms with the event loop, and so every stream, stalled. Frozen, they are never walked again;
    what requests allocate is collected as before. vLLM's own server does the same after it starts.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _server_options(section: GatewaySection) -> ServerOptions:
    """Transport options: TLS (its files checked now, before any engine starts), tokens, metrics, message size."""
    cert, key, client_ca = section.tls_cert_file, section.tls_key_file, section.tls_client_ca_file
    if (cert is None) != (key is None) or (client_ca is not None and cert is None):
        raise ConfigurationError("TLS needs both --tls-cert and --tls-key (and them for --tls-client-ca)")
    tls = TlsFiles(cert, key, client_ca) if cert is not None and key is not None else None
    if tls is not None:
        tls.check()
    auth = TokenAuth.from_sources(
        token_files=_listed(section.auth_token_file),
        control_token_files=_listed(section.control_token_file),
        observer_token_files=_listed(section.observer_token_file),
    )
    if section.metrics_tls and tls is None:
        raise ConfigurationError("--metrics-tls serves the gateway's certificate: it needs --tls-cert and --tls-key")
    host = section.host
    if section.metrics_port is not None and not section.metrics_tls and not _loopback(section.metrics_host):
        log.warning("metrics on %s in plaintext and without a token; add --metrics-tls", section.metrics_host)
    if auth is None and not _loopback(host):
        log.warning("serving on %s without authentication: anyone who reaches it can drain it", host)
    if auth is not None and auth.tenants_share_control:
        log.warning(
            "several inference tokens and no control token: each acts as a control token and reaches every "
            "client's requests; give the operator a --control-token-file"
        )
    return ServerOptions(
        host=host,
        port=section.port,
        max_message_bytes=section.max_message_bytes,
        tls=tls,
        auth=auth,
        metrics_port=section.metrics_port,
        metrics_host=section.metrics_host,
        metrics_tls=section.metrics_tls,
    )


def _loopback(host: str) -> bool:
    return host in ("127.0.0.1", "::1", "[::1]", "localhost")


def _listed(path: Path | None) -> list[Path]:
    return [path] if path is not None else []


def _routable(host: str) -> str:
    """A host to advertise for a bind address (the loopback default is routable locally)."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        import socket

        return socket.getfqdn()
    return host


def _backends_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="openengine-gateway backends",
        description="List the installed backends (entry points in openengine.backends) with their distribution, "
        "version and target, and for one whose engine is not installed here, what installs it. Nothing is imported.",
        epilog="Exit status: 0, or 1 when no backend is installed.",
    )


def list_backends() -> int:
    """Print installed backends with their distributions and versions, and why one cannot start here."""
    backends = installed_backends()
    if not backends:
        print("no backends installed")
        return 1
    width = max(len(b.name) for b in backends)
    for backend in backends:
        missing = missing_packages(backend)
        status = f"  cannot start here: needs {', '.join(missing)}; {backend.install_hint}" if missing else ""
        print(f"{backend.name:<{width}}  {backend.distribution} {backend.version}  ({backend.target}){status}")
    return 0


def _run(coroutine: Any) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        return asyncio.run(coroutine)  # type: ignore[no-any-return]
    return uvloop.run(coroutine)  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``openengine-gateway`` command."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["backends"]:
        _backends_parser().parse_args(arguments[1:])
        return list_backends()
    if arguments[:1] == ["conformance"]:
        from .conformance.cli import main as conformance

        return conformance(arguments[1:])
    if arguments[:1] == ["bench"]:
        from .bench.cli import main as bench

        return bench(arguments[1:])
    prog = "openengine-gateway"
    if arguments[:1] == ["serve"]:
        arguments, prog = arguments[1:], "openengine-gateway serve"
    args, extra = _parser(prog).parse_known_args(arguments)
    try:
        logs.configure(args.log_level, args.log_format or "text")
    except ValueError as exc:
        print(f"openengine-gateway: error: --log-level: {exc}", file=sys.stderr)
        return 2
    try:
        return _run(serve(args, extra))
    except (SetupError, OSError) as exc:  # OSError: a port in use, a file that cannot be read
        log.debug("startup failure", exc_info=exc)
        print(f"openengine-gateway: error: {exc}", file=sys.stderr)
        return exc.exit_code if isinstance(exc, SetupError) else 2


if __name__ == "__main__":
    raise SystemExit(main())
