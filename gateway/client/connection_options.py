"""The connection flags every client command takes (``--token``, ``--ca``, ``--tls``), defined once.

``add_connection_options`` puts them on a command's parser (``add_layout_option`` adds ``--layout`` to the
commands that speak either layout); ``connect_options`` turns the parsed
flags into ``OpenEngineClient.connect`` keywords, reading the CA file (an ``OSError`` when it
cannot be read, the command's usage error).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .layouts import LAYOUTS


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """Add the ``connection`` group: bearer token, a CA for TLS, or TLS with the system's roots."""
    group = parser.add_argument_group("connection")
    group.add_argument("--token", help="bearer token sent on every call, for a server that requires one")
    group.add_argument("--ca", type=Path, metavar="FILE", help="CA certificate (PEM) of a TLS server (implies --tls)")
    group.add_argument("--tls", action="store_true", help="TLS with the system's root certificates")


def add_layout_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--layout``: the seed's ``OpenEngine`` service, or upstream's later ``Inference``/``Control``."""
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="seed",
        help="the services to speak: the seed's openengine.v1.OpenEngine (default), or upstream's later "
        "openengine.v1.Inference and Control",
    )


def connect_options(args: argparse.Namespace) -> dict[str, Any]:
    """``token``, ``root_certificates`` and ``tls`` for ``OpenEngineClient.connect``."""
    ca: Path | None = args.ca
    return {"token": args.token, "root_certificates": ca.read_bytes() if ca else None, "tls": bool(args.tls)}


__all__ = ["add_connection_options", "add_layout_option", "connect_options"]
