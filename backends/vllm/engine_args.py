"""Driver settings → vLLM's ``AsyncEngineArgs`` keyword arguments, converted as vLLM's CLI would.

Part of the engine side: like ``engine.py`` it imports vLLM, and only inside its function, when
an engine starts (the names and the parser are vLLM's own).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from openengine_gateway.spi import ConfigurationError

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def engine_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    """Engine options as ``AsyncEngineArgs`` keyword arguments, converted as vLLM's CLI would.

    Raises ``ConfigurationError`` naming an option that is not an engine argument or whose value
    vLLM's parser rejects.
    """
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigurationError(f"vllm: unknown engine arguments: {', '.join(unknown)} (see vLLM's AsyncEngineArgs)")
    strings = {name: value for name, value in options.items() if isinstance(value, str)}
    kwargs = {name: value for name, value in options.items() if not isinstance(value, str)}
    if strings:
        kwargs.update(_parse_strings(strings))
    return kwargs


def _parse_strings(strings: Mapping[str, str]) -> dict[str, Any]:
    """Convert command-line strings with vLLM's own argument parser, option by option."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser(exit_on_error=False))
    actions = {action.dest: action for action in parser._actions if action.option_strings}
    converted: dict[str, Any] = {}
    for name, value in strings.items():
        action = actions.get(name)
        if action is None or (action.type is None and action.nargs is None and not action.choices):
            converted[name] = value
        elif type(action).__name__ == "BooleanOptionalAction":
            if value.lower() not in _TRUE | _FALSE:
                raise ConfigurationError(f"vllm: {name} takes true or false, not {value!r}")
            converted[name] = value.lower() in _TRUE
        else:
            try:
                namespace = parser.parse_args([action.option_strings[0], value])
            except (Exception, SystemExit) as exc:  # broad on purpose: argparse raises several kinds
                raise ConfigurationError(f"vllm: invalid value {value!r} for {name}: {exc}") from None
            converted[name] = getattr(namespace, name)
    return converted


__all__ = ["engine_kwargs"]
