"""``openengine-gateway``: serve engines over OpenEngine, or list installed backends.

    openengine-gateway [serve] [--backend NAME] [--model M] [--served-model-name N]
                       [--alias A ...] [--host H] [--port P] [--config plugins.toml]
                       [--tls-cert F --tls-key F [--tls-client-ca F]]
                       [--auth-token-file F] [--control-token-file F] [--observer-token-file F]
                       [--metrics-port P]
                       [--<limit> N ...] [--log-format text|json] [--<driver-option> VALUE ...]
    openengine-gateway backends
    openengine-gateway conformance --target HOST:PORT [--model M] [--json FILE]
    openengine-gateway routes --target HOST:PORT [--reload]
    openengine-gateway bench --target HOST:PORT/MODEL [--target ...] [--concurrency N | --request-rate R]
                       [--num-requests N] [--duration S] [--json FILE] [--report DIR] (--help for the rest)

Options the gateway does not know are the driver's: ``--backend mock --max-running-requests 8``
gives the mock ``max_running_requests="8"`` for its settings model to validate (a flag without a
value is ``true``; a repeated flag is a list). Without ``--backend`` the engines come from the
``[[engines]]`` tables of the configuration file. Every serving flag has a ``[gateway]`` key
of the same name (``--tls-cert`` is ``tls_cert_file``); the flag wins. SIGHUP reloads the file's
``[[splits]]`` and ``[[mirrors]]`` while serving (``reload``).
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
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

from pydantic.fields import FieldInfo

from . import logs
from .config import (
    Config,
    CoreSettings,
    EngineSection,
    GatewaySection,
    did_you_mean,
    flag_of,
    load_config,
    with_flags,
)
from .core.gateway import Gateway, GatewayOptions
from .errors import ConfigurationError, EngineStartError, SetupError
from .launch import start_engines
from .plugins import installed_backends, missing_packages, verdict
from .reload import HangupReload, RouteReloader
from .server.app import GatewayServer, ServerOptions, reserved, serving_line
from .server.auth import TokenAuth
from .server.tls import TlsFiles

if TYPE_CHECKING:
    from .frontends import Frontend

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
    "routes": "show a running gateway's splits and mirrors, or reload them from its configuration file",
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
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=os.environ.get("OPENENGINE_LOG_LEVEL", "INFO"),
        help="log level (default INFO, or $OPENENGINE_LOG_LEVEL)",
    )
    _add_gateway_flags(parser)
    return parser


FLAG_GROUPS = {
    "security": "security",
    "limits": "limits (past them: RESOURCE_EXHAUSTED; a task batch over its advertised size: INVALID_ARGUMENT)",
    "bounds": "bounds on client-sized fields (past them: INVALID_ARGUMENT)",
    "metrics": "metrics",
}
"""The ``--help`` groups a ``[gateway]`` key's ``Flag`` may name, with their titles ("" lists it with the rest)."""


def _add_gateway_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ``[gateway]`` key that declares one, named, typed and described by its field.

    Every flag defaults to None, "not given", so that ``with_flags`` lays only the given ones over
    the file; ``--help`` shows the key's own default instead.
    """
    groups = {"": parser, **{name: parser.add_argument_group(title) for name, title in FLAG_GROUPS.items()}}
    for key, field in GatewaySection.model_fields.items():
        flag = flag_of(field)
        if flag is not None:
            name = flag.spelled(key)
            groups[flag.group].add_argument(name, dest=key, help=_help(field), **_flag_kind(name, field.annotation))


def _help(field: FieldInfo) -> str:
    """A key's ``--help`` line: its description, and its default unless that is unset (None, off, empty)."""
    if field.default is None or field.default is False or field.default == []:
        return f"{field.description}"
    return f"{field.description} (default {field.default})"


def _flag_kind(name: str, annotation: Any) -> dict[str, Any]:
    """How argparse takes a key of this type: a switch, a choice, or a typed value (repeatable for a list)."""
    if annotation is bool:
        return {"action": "store_true", "default": None}
    if get_origin(annotation) is Literal:
        return {"choices": get_args(annotation)}
    metavar = name.removeprefix("--").replace("-", "_").upper()
    if get_origin(annotation) is list:
        return {"action": "append", "metavar": metavar}
    (kind,) = [arg for arg in get_args(annotation) if arg is not type(None)] or [annotation]
    return {"type": kind, "metavar": metavar}


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
    """``[gateway]`` with the flags over it: each flag is its key, validated alike."""
    flagged = (key for key, field in GatewaySection.model_fields.items() if flag_of(field) is not None)
    return with_flags(config.gateway, {key: getattr(args, key) for key in flagged})


async def serve(args: argparse.Namespace, extra: Sequence[str], frontend: Frontend | None = None) -> int:
    """Hold the ports, start engines, then serve (a port in use is reported before any engine loads);
    stop gracefully on SIGINT/SIGTERM (one during startup stops
    the gateway once it has started, so that no engine is left half started, or quietly when the
    signal also stopped the engine starting); reload the routes on SIGHUP. With ``--frontends``
    above 1, supervise that many frontend processes instead (``frontends``); ``frontend``: this is
    one of them."""
    config_file = _config_path(args.config)
    config = load_config(config_file)
    section = _gateway_section(args, config)
    logs.configure(args.log_level, section.log_format)
    sections = _engine_sections(args, extra, config)
    if section.frontends > 1 and frontend is None:
        from .frontends import supervise

        return await supervise(
            args,
            extra,
            config,
            sections,
            _server_options(section),
            count=section.frontends,
            drain_timeout_s=section.drain_timeout_s,
            command_line=args.backend is not None,
            gateway_flags=gateway_flags(),
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    drain_timeout = section.drain_timeout_s

    def on_signal(signum: int) -> None:
        if stop.is_set():
            log.warning("second %s: stopping now", signal.Signals(signum).name)
            os._exit(1)
        log.info("%s: draining (up to %.0fs), then stopping", signal.Signals(signum).name, drain_timeout)
        stop.set()

    def handle_signals() -> None:
        for signum in (signal.SIGTERM,) if frontend is not None else (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, on_signal, signum)

    handle_signals()
    if frontend is not None:
        from .frontends import watch_supervisor

        watch_supervisor(stop.set)
    hangup = HangupReload()
    loop.add_signal_handler(signal.SIGHUP, hangup)
    options = GatewayOptions(
        **section.model_dump(include=set(CoreSettings.model_fields)),
        advertise_host=section.advertise_host or _routable(section.host),
    )
    held = reserved(_server_options(section)) if frontend is None else nullcontext(_server_options(section))
    with held as server_options:  # a port in use is refused before engines load
        if frontend is not None:
            server_options = frontend.server_options(server_options)
        try:
            engines = await start_engines(
                sections,
                config,
                command_line=args.backend is not None,
                gateway_flags=gateway_flags(),
                attachments=frontend.attachments if frontend is not None else None,
            )
        except EngineStartError as exc:
            if not stop.is_set():
                raise
            log.info("stopped during startup (%s)", exc)  # a terminal's Ctrl-C also reaches the engine's processes
            return 0
        handle_signals()  # again: an engine's library may have put its own on the loop (SGLang's does)
        siblings = frontend.siblings() if frontend is not None else None
        if frontend is not None:
            options = frontend.gateway_options(options, engines)
        gateway = Gateway(engines, options, splits=config.splits, mirrors=config.mirrors, siblings=siblings)
        reloader = RouteReloader(gateway, config_file, config, command_line=args.backend is not None)
        server = GatewayServer(gateway, server_options, reloader)
        try:
            await server.start()
        except BaseException:
            await server.gateway.stop()
            raise
    log.debug("froze %d objects left by startup out of garbage collection", freeze_startup_objects())
    names = ", ".join(f"{e.served_name} ({e.facts.engine_name} {e.facts.engine_version})" for e in engines)
    peers = None
    if frontend is None:
        line = serving_line(names, server_options, server.port, server.metrics_port)
        print(line, flush=True)
    else:
        peers = await frontend.serve_peers(gateway, reloader, server.metrics.registry)
        log.info("frontend %d of %d serving %s on %s", frontend.index + 1, frontend.count, names, server.address)
    hangup.serving(reloader)
    await stop.wait()
    await server.stop(drain_timeout)
    if peers is not None:
        await peers.stop()
    if siblings is not None:
        await siblings.close()
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
        max_streams_per_connection=section.max_streams_per_connection,
        max_health_watches=section.max_health_watches,
        max_health_watches_per_connection=section.max_health_watches_per_connection,
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
        "version and target; the backend SPI revision each targets and whether it is served natively, through the "
        "compatibility layer (with its deprecations) or refused, and why; and for one whose engine is not installed "
        "here, what installs it. Third-party plugins are imported to read the revision they declare; the in-tree "
        "drivers and their engines are not.",
        epilog="Exit status: 0, or 1 when no backend is installed or the output was closed early.",
    )


def list_backends() -> int:
    """Print installed backends with their distributions, versions and SPI revisions, and why one cannot start
    here; a reader that stops early (``| head -1``) ends the listing quietly."""
    try:
        return _print_backends()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that flush does not fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _print_backends() -> int:
    backends = installed_backends()
    if not backends:
        print("no backends installed")
        return 1
    width = max(len(b.name) for b in backends)
    for backend in backends:
        missing = missing_packages(backend)
        status = f"  cannot start here: needs {', '.join(missing)}; {backend.install_hint}" if missing else ""
        served = verdict(backend)
        print(
            f"{backend.name:<{width}}  {backend.distribution} {backend.version}  ({backend.target})  "
            f"{served.summary}{status}",
            flush=True,
        )
        for deprecation in served.deprecations:
            print(f"{'':<{width}}    deprecated: {deprecation}", flush=True)
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
    if arguments[:1] == ["routes"]:
        from .routes_cli import main as routes

        return routes(arguments[1:])
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
        return run_serve(args, extra)
    except (SetupError, OSError) as exc:  # OSError: a port in use, a file that cannot be read
        return report_failure(exc)


def run_serve(args: argparse.Namespace, extra: Sequence[str], frontend: Frontend | None = None) -> int:
    """``serve`` on its own event loop (uvloop where available)."""
    return _run(serve(args, extra, frontend))


def report_failure(exc: SetupError | OSError) -> int:
    """Say why the gateway could not start; the exit status that goes with it."""
    log.debug("startup failure", exc_info=exc)
    print(f"openengine-gateway: error: {exc}", file=sys.stderr)
    return exc.exit_code if isinstance(exc, SetupError) else 2


if __name__ == "__main__":
    raise SystemExit(main())
