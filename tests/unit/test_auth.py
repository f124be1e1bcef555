"""Token files, names and scopes: what each scope reaches is one table, and names never repeat."""

from __future__ import annotations

from pathlib import Path

import pytest
from openengine_gateway.errors import ConfigurationError
from openengine_gateway.server.auth import RPC_ACCESS, Access, Grant, Scope, TokenAuth, read_tokens


def _metadata(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def test_a_token_file_line_is_a_token_or_a_name_and_a_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# tenants\nalice tok-a\ntok-b\n")
    path.chmod(0o600)
    assert read_tokens(path) == [("alice", "tok-a"), "tok-b"]
    path.write_text("alice tok-a extra\n")
    with pytest.raises(ConfigurationError, match="line 1") as error:
        read_tokens(path)
    assert "tok-a" not in str(error.value)


def test_names_label_tokens_and_must_be_unique() -> None:
    auth = TokenAuth([("alice", "a"), "b"], [("ops", "c")], ["d"])
    assert auth.grant(_metadata("a")) == Grant("alice", Scope.INFERENCE)
    assert auth.grant(_metadata("b")) == Grant("inference-2", Scope.INFERENCE)
    assert auth.grant(_metadata("c")) == Grant("ops", Scope.CONTROL)
    assert auth.grant(_metadata("d")) == Grant("observer-1", Scope.OBSERVER)
    assert auth.grant(_metadata("e")) is None
    assert "a" not in repr(auth).replace("TokenAuth", "").replace("inference", "").replace("and", "")
    with pytest.raises(ConfigurationError, match="used twice"):
        TokenAuth([("x", "a")], [("x", "b")])
    with pytest.raises(ConfigurationError, match="not 1-64"):
        TokenAuth([("no spaces allowed", "a")])


def test_without_a_control_token_inference_tokens_are_control_and_observers_stay_observers() -> None:
    auth = TokenAuth(["a", "b"], observer=["o"])
    assert auth.grant(_metadata("a")) == Grant("inference-1", Scope.CONTROL)
    assert auth.grant(_metadata("o")) == Grant("observer-1", Scope.OBSERVER)
    assert auth.tenants_share_control
    assert not TokenAuth(["a", "b"], ["c"]).tenants_share_control


def test_each_access_needs_a_token_once_a_token_granting_it_exists() -> None:
    observers_only = TokenAuth(observer=["o"])
    assert not observers_only.needs_token(Access.INFERENCE)
    assert observers_only.needs_token(Access.OBSERVE) and observers_only.needs_token(Access.CONTROL)
    control_only = TokenAuth(control=["c"])
    assert not control_only.needs_token(Access.OBSERVE) and control_only.needs_token(Access.CONTROL)


def test_every_rpc_of_the_services_has_an_access() -> None:
    from openengine_gateway import pb, pb_later, routes_pb
    from openengine_gateway.server.app import SERVED_SERVICES

    services = (pb.SERVICE_DESCRIPTOR, pb_later.INFERENCE_DESCRIPTOR, pb_later.CONTROL_DESCRIPTOR)
    services += (routes_pb.SERVICE_DESCRIPTOR,)
    assert [service.full_name for service in services] == list(SERVED_SERVICES)
    seed = [method.name for method in pb.SERVICE_DESCRIPTOR.methods]
    assert len(seed) == len(set(seed))  # the table is keyed by method name
    later = [method for service in services[1:3] for method in service.methods]
    for method in later:  # a later RPC named as a seed one is the same RPC, through the same rules
        if method.name in seed:
            assert method.input_type.name == pb.SERVICE_DESCRIPTOR.methods_by_name[method.name].input_type.name
    assert set(RPC_ACCESS) == {method.name for service in services for method in service.methods}


def test_abort_of_all_requests_is_control_in_either_layout() -> None:
    from openengine_gateway import pb, pb_later
    from openengine_gateway.server.auth import request_access

    for module in (pb, pb_later):
        assert request_access("Abort", module.AbortRequest(all_requests=module.AllRequests())) is Access.CONTROL
        assert request_access("Abort", module.AbortRequest(request_id="r")) is Access.INFERENCE
