"""``openengine-gateway routes``: the table an operator reads, its help and its exit statuses."""

from __future__ import annotations

import socket

import pytest
from openengine_gateway import cli, routes_pb
from openengine_gateway.routes_cli import render


def test_the_table_shows_each_splits_shares_and_each_mirror() -> None:
    routes = routes_pb.RouteTable(
        splits=[
            routes_pb.Split(
                name="chat",
                aliases=["default"],
                engines=[
                    routes_pb.SplitEngine(engine="small", weight=1),
                    routes_pb.SplitEngine(engine="big", weight=3),
                ],
                sticky=["metadata.user"],
            )
        ],
        mirrors=[routes_pb.Mirror(name="chat", shadow="next", percent=12.5, max_in_flight=8)],
    )
    assert render(routes).splitlines() == [
        "split chat (aliases default), sticky by metadata.user",
        "  small  weight    1   25.0%",
        "  big    weight    3   75.0%",
        "mirror chat -> next: 12.5% of requests, at most 8 in flight",
    ]
    assert render(routes_pb.RouteTable()) == "no splits or mirrors: every name is served by its own engine"


def test_help_states_the_exit_statuses_and_the_connection_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["routes", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith("usage: openengine-gateway routes")
    assert "1 when the gateway refused" in text and "2 on a usage error or when the gateway cannot be reached" in text
    for flag in ("--reload", "--token", "--ca FILE", "--tls "):
        assert flag in text


def test_a_gateway_that_cannot_be_reached_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: connections are refused
        assert cli.main(["routes", "--target", f"127.0.0.1:{port}"]) == 2
    assert capsys.readouterr().err.startswith("openengine-gateway routes: UNAVAILABLE: ")
