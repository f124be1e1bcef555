"""SIGTERM under load to a gateway process serving SGLang: it drains, refuses what comes after, exits 0.

Shared by the fake's process test and the real-class one (whose engine starts through SGLang's real
``TokenizerManager``): both send the signal while streams run and check the same things.
"""

from __future__ import annotations

import asyncio
import signal

import grpc
from openengine_gateway import pb

from tests.process import GatewayProcess


async def _wait_for_line(gateway: GatewayProcess, line: str, within_s: float) -> None:
    for _ in range(int(within_s / 0.05)):
        if line in gateway.log.read_text():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the gateway never logged {line!r}:\n{gateway.log.read_text()}")


async def check_drain_under_load(gateway: GatewayProcess, model: str, *, streams: int = 3, tokens: int = 40) -> None:
    """Streams in flight at SIGTERM end with all their tokens; one sent once the gateway heard the signal is
    UNAVAILABLE; the process exits 0."""
    channel = grpc.aio.insecure_channel(gateway.address)
    stub = pb.OpenEngineStub(channel)
    stopping = pb.StoppingOptions(max_tokens=tokens, ignore_eos=True)
    calls = [stub.Generate(pb.GenerateRequest(model=model, prompt="say", stopping=stopping)) for _ in range(streams)]
    try:
        first = [await call.read() for call in calls]  # each stream accepted, its first token out
        assert all(isinstance(r, pb.GenerateResponse) and r.WhichOneof("event") != "error" for r in first), first
        gateway.process.send_signal(signal.SIGTERM)
        await _wait_for_line(gateway, "SIGTERM: draining", within_s=10)
        late = stub.Generate(pb.GenerateRequest(model=model, prompt="say", stopping=stopping))
        try:
            answer = await late.read()
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
        else:
            raise AssertionError(f"a request sent after the signal was admitted: {answer}")
        for opening, call in zip(first, calls, strict=True):
            responses = [opening]
            while (response := await call.read()) is not grpc.aio.EOF:
                responses.append(response)
            finished = [r.finished for r in responses if r.WhichOneof("event") == "finished"]
            assert [f.reason for f in finished] == [pb.FINISH_REASON_LENGTH], responses[-3:]
            assert sum(len(r.token.tokens) for r in responses if r.WhichOneof("event") == "token") == tokens
        assert await asyncio.wait_for(gateway.process.wait(), 60) == 0, gateway.log.read_text()
    finally:
        await channel.close()
    assert "stopped" in gateway.log.read_text()
