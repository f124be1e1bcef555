"""Request ids are namespaced per token: one tenant's ids neither collide with nor reveal another's.

Alice and Bob (inference tokens) use the same id at the same time; the operator (control) reaches
both. Without tokens there is one namespace, as the contract's conformance kit checks.
"""

from __future__ import annotations

import grpc
from openengine_gateway import pb
from openengine_gateway.core.callers import Caller
from openengine_gateway.server.app import ServerOptions
from openengine_gateway.server.auth import TokenAuth

from tests.ops.support import gateway

ALICE, BOB, OPERATOR = "alice-tok-1a2b3c", "bob-tok-4d5e6f", "operator-tok-7a8b9c"


def _as(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def _abort(stub: pb.OpenEngineStub, request_id: str, token: str) -> str:
    try:
        response = await stub.Abort(pb.AbortRequest(request_id=request_id), metadata=_as(token), timeout=5)
    except grpc.aio.AioRpcError as error:
        return error.code().name
    return pb.AbortStatus.Name(response.status)


def _long(request_id: str) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request_id, model="mock", prompt="hi", stopping=pb.StoppingOptions(max_tokens=500)
    )


async def test_two_tenants_share_an_id_without_seeing_each_other() -> None:
    auth = TokenAuth([("alice", ALICE), ("bob", BOB)], [("operator", OPERATOR)])
    async with gateway(server=ServerOptions(auth=auth), decode_time_per_step_s=0.02) as running:
        stub = running.stub
        alice = stub.Generate(_long("r1"), metadata=_as(ALICE))
        assert (await anext(aiter(alice))).request_id == "r1"
        bob = stub.Generate(_long("r1"), metadata=_as(BOB))  # not ALREADY_EXISTS: nothing tells Bob r1 is taken
        assert (await anext(aiter(bob))).request_id == "r1"
        embedded = await stub.Embed(
            pb.EmbedRequest(
                context=pb.TaskRequestContext(request_id="r2", model="mock"),
                inputs=[pb.TaskInput(item_id="a", text="x")],
            ),
            metadata=_as(BOB),
        )
        assert embedded.request_id == "r2"
        assert await _abort(stub, "r1", BOB) == "ABORT_STATUS_ABORTED"  # his own
        assert not running.gateway.registry.find("r1", Caller("alice", sees_all=False)).aborted  # type: ignore[union-attr]
        assert await _abort(stub, "r1", ALICE) == "ABORT_STATUS_ABORTED"  # hers, still running
        for stream in (alice, bob):
            stream.cancel()
        # Bob reusing the finished id leaves Alice's answers as they were.
        again = pb.GenerateRequest(request_id="r1", model="mock", prompt="hi")
        assert [r async for r in stub.Generate(again, metadata=_as(BOB))][-1].HasField("finished")
        assert await _abort(stub, "r1", ALICE) == "ABORT_STATUS_ALREADY_FINISHED"
        assert await _abort(stub, "r1", OPERATOR) == "ABORT_STATUS_ALREADY_FINISHED"
        assert await _abort(stub, "r2", ALICE) == "NOT_FOUND"  # Bob's task id: not hers
