"""Driver settings → keyword arguments of SGLang's ``Engine`` (its ``ServerArgs`` fields).

Part of the engine side: like ``engine.py`` it imports SGLang, and only inside its function, when
an engine starts. Field names are checked against ``ServerArgs``; command-line strings are
converted by SGLang's own argument parser, so ``--context-length 4096`` and ``--enable-lora
true`` mean what they mean to ``sglang serve``; so does a ``plugins.toml`` table given for an argument
SGLang reads as JSON text (``kv_events_config = { publisher = "zmq" }``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from openengine_gateway.spi import ConfigurationError

from .kv_publishers import check_kv_events_config

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def server_kwargs(model: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``Engine(**kwargs)`` for ``model`` and the driver's server options.

    Raises ``ConfigurationError`` naming an option that is not a server argument or whose value
    SGLang's parser rejects, or a KV-event publisher the gateway could not subscribe to.
    """
    from sglang.srt.server_args import ServerArgs

    unknown = sorted(set(options) - set(ServerArgs.__struct_fields__))
    if unknown:
        raise ConfigurationError(f"sglang: unknown server arguments: {', '.join(unknown)} (see SGLang's ServerArgs)")
    kwargs = {name: value for name, value in options.items() if not isinstance(value, str | Mapping)}
    strings = {name: value for name, value in options.items() if isinstance(value, str)}
    tables = {name: value for name, value in options.items() if isinstance(value, Mapping)}
    if strings or tables:
        parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
        ServerArgs.add_cli_args(parser)
        # A table means what its JSON text means on SGLang's command line: SGLang reads such arguments
        # (--kv-events-config, --json-model-override-args...) as JSON text, and a dict given as it is
        # passes ServerArgs only to fail in SGLang's scheduler (KVEventsConfig.from_cli).
        flags = {action.dest for action in parser._actions if action.option_strings}
        strings.update({name: json.dumps(value) for name, value in tables.items() if name in flags})
        kwargs.update({name: value for name, value in tables.items() if name not in flags})
        kwargs.update(parse_strings(parser, model, strings))
    kwargs["model_path"] = model
    check_kv_events_config(kwargs.get("kv_events_config"))
    return kwargs


def parse_strings(parser: argparse.ArgumentParser, model: str, strings: Mapping[str, str]) -> dict[str, Any]:
    """Command-line strings as SGLang's parser reads them; its flags take ``true``/``false``."""
    actions = {action.dest: action for action in parser._actions if action.option_strings}
    argv = ["--model-path", model]
    converted: dict[str, Any] = {}
    for name, value in strings.items():
        action = actions.get(name)
        if action is None:  # a field without a command-line form takes the string as it is
            converted[name] = value
        elif action.nargs == 0:
            if value.lower() not in _TRUE | _FALSE:
                raise ConfigurationError(f"sglang: {name} takes true or false, not {value!r}")
            converted[name] = value.lower() in _TRUE
        else:
            argv += [action.option_strings[0], value]
    try:
        namespace = parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as exc:  # argparse reports a bad value either way
        raise ConfigurationError(f"sglang: invalid server argument: {exc}") from None
    return {**{name: getattr(namespace, name) for name in strings if name not in converted}, **converted}


__all__ = ["parse_strings", "server_kwargs"]
