"""``openengine-gateway``: serve engines over OpenEngine, or list installed backends.

    openengine-gateway [serve] [--backend NAME] [--model M] [--served-model-name N]
                       [--alias A ...] [--host H] [--port P] [--config plugins.toml]
                       [--<driver-option> VALUE ...]
    openengine-gateway backends
    openengine-gateway conformance --target HOST:PORT [--model M] [--json FILE]

Options the gateway does not know are the driver's: ``--max-running-requests 8`` becomes
``max_running_requests="8"`` for the driver's settings model to validate (a flag without a
value is ``true``; a repeated flag is a list). Without ``--backend`` the engines come from the
``[[engines]]`` tables of the configuration file.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config import Config, ConfigError, EngineSection, load_config
from .core.gateway import Gateway, GatewayOptions
from .engines import ConfigurationError
from .launch import start_engines
from .plugins import PluginError, installed_backends
from .server.app import GatewayServer, ServerOptions

log = logging.getLogger("openengine_gateway")

DEFAULT_CONFIG = "plugins.toml"


def parse_driver_flags(tokens: Sequence[str]) -> dict[str, Any]:
    """``--key value`` / ``--key=value`` / ``--flag`` tokens as a driver options mapping."""
    options: dict[str, Any] = {}
    position = 0
    while position < len(tokens):
        token = tokens[position]
        if not token.startswith("--") or token == "--" or token.startswith("--="):
            raise ConfigError(f"unexpected argument {token!r}; driver options look like --name value")
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openengine-gateway",
        allow_abbrev=False,
        description="Serve the OpenEngine v1 gRPC contract in front of inference engines.",
        epilog="Unknown --options are passed to the selected backend. 'openengine-gateway backends' lists backends.",
    )
    parser.add_argument("--backend", help="backend to serve (an entry point in openengine.backends)")
    parser.add_argument("--model", help="model path or id for the backend to load")
    parser.add_argument("--served-model-name", help="the name clients use (default: --model)")
    parser.add_argument("--alias", action="append", default=[], help="another name for the model (repeatable)")
    parser.add_argument("--config", type=Path, help=f"configuration file (default: ./{DEFAULT_CONFIG} if present)")
    parser.add_argument("--host", help="address to bind (default 127.0.0.1: loopback only)")
    parser.add_argument("--port", type=int, help="port to bind (default 50051; 0 picks a free port)")
    parser.add_argument("--advertise-host", help="routable host to advertise instead of a wildcard bind address")
    parser.add_argument("--max-in-flight", type=int, help="concurrent requests before RESOURCE_EXHAUSTED")
    parser.add_argument("--drain-timeout", type=float, help="seconds a SIGTERM drain waits before aborting")
    parser.add_argument("--log-level", default=os.environ.get("OPENENGINE_LOG_LEVEL", "INFO"))
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
        if extra or args.model or args.served_model_name or args.alias:
            raise ConfigError("--model, --served-model-name, --alias and driver options need --backend")
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


async def serve(args: argparse.Namespace, extra: Sequence[str]) -> int:
    """Start engines and the server; stop gracefully on SIGINT/SIGTERM."""
    config = load_config(_config_path(args.config))
    section = config.gateway
    host = args.host if args.host is not None else section.host
    port = args.port if args.port is not None else section.port
    sections = _engine_sections(args, extra, config)
    options = GatewayOptions(
        max_in_flight=args.max_in_flight if args.max_in_flight is not None else section.max_in_flight,
        finished_window=section.finished_window,
        kv_replay_batches=section.kv_replay_batches,
        subscriber_queue=section.subscriber_queue,
        probe_timeout_s=section.probe_timeout_s,
        lora_roots=tuple(section.lora_roots),
        advertise_host=args.advertise_host or section.advertise_host or _routable(host),
    )
    drain_timeout = args.drain_timeout if args.drain_timeout is not None else section.drain_timeout_s
    engines = await start_engines(sections, config)
    server = GatewayServer(Gateway(engines, options), ServerOptions(host, port, section.max_message_bytes))
    try:
        await server.start()
    except BaseException:
        await server.gateway.stop()
        raise
    names = ", ".join(f"{e.served_name} ({e.facts.engine_name} {e.facts.engine_version})" for e in engines)
    print(f"openengine-gateway serving {names} on {server.address}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            log.warning("second %s: stopping now", signal.Signals(signum).name)
            os._exit(1)
        log.info("%s: draining (up to %.0fs), then stopping", signal.Signals(signum).name, drain_timeout)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    await stop.wait()
    await server.stop(drain_timeout)
    log.info("stopped")
    return 0


def _routable(host: str) -> str:
    """A host to advertise for a bind address (the loopback default is routable locally)."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        import socket

        return socket.getfqdn()
    return host


def list_backends() -> int:
    """Print installed backends with their distributions and versions."""
    backends = installed_backends()
    if not backends:
        print("no backends installed")
        return 1
    width = max(len(b.name) for b in backends)
    for backend in backends:
        print(f"{backend.name:<{width}}  {backend.distribution} {backend.version}  ({backend.target})")
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
        return list_backends()
    if arguments[:1] == ["conformance"]:
        from .conformance.cli import main as conformance

        return conformance(arguments[1:])
    if arguments[:1] == ["serve"]:
        arguments = arguments[1:]
    args, extra = _parser().parse_known_args(arguments)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return _run(serve(args, extra))
    except (ConfigError, ConfigurationError, PluginError, OSError) as exc:
        print(f"openengine-gateway: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
