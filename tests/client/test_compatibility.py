"""``client.check_compatible``: the client fails closed outside the range it was tested with."""

from __future__ import annotations

import pytest
from openengine_gateway import pb
from openengine_gateway.client import CLIENT_REVISION, IncompatibleServer, check_compatible


def info(**fields: object) -> pb.EngineInfo:
    values: dict[str, object] = {
        "schema_revision": pb.SCHEMA_REVISION,
        "minimum_client_revision": pb.MINIMUM_CLIENT_REVISION,
        "schema_release": pb.SCHEMA_RELEASE,
    }
    values.update(fields)
    return pb.EngineInfo(**values)  # type: ignore[arg-type]


def test_this_gateway_is_compatible() -> None:
    check_compatible(info())


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"schema_revision": 0}, "schema_revision 0, which is invalid"),
        ({"schema_revision": 2}, "revision 2 is outside the tested range 1..1"),
        ({"minimum_client_revision": CLIENT_REVISION + 1}, "requires client revision 2"),
        ({"schema_release": "main"}, "release 'main' was not tested"),
        ({"schema_release": ""}, "release '' was not tested"),
        ({"schema_release": "0" * 40}, "was not tested"),
    ],
    ids=["revision-zero", "newer-revision", "newer-client-required", "moving-branch", "no-release", "other-commit"],
)
def test_anything_else_is_refused(fields: dict[str, object], reason: str) -> None:
    with pytest.raises(IncompatibleServer, match=reason):
        check_compatible(info(**fields))
