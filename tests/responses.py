"""Reading a Generate stream back in tests: every response, and each output's tokens, text and end."""

from __future__ import annotations

from openengine_gateway import pb


async def collect(stub: pb.OpenEngineStub, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    """Every response of one Generate stream."""
    return [response async for response in stub.Generate(request)]


def tokens(responses: list[pb.GenerateResponse], index: int = 0) -> list[pb.TokenInfo]:
    """The token records of output ``index``, in order."""
    return [t for r in responses if r.HasField("token") and r.token.output_index == index for t in r.token.tokens]


def text(responses: list[pb.GenerateResponse], index: int = 0) -> str:
    """The text of output ``index``."""
    return "".join(r.token.text for r in responses if r.HasField("token") and r.token.output_index == index)


def finished(responses: list[pb.GenerateResponse]) -> dict[int, pb.GenerationFinished]:
    """Each output's ``GenerationFinished``."""
    return {r.finished.output_index: r.finished for r in responses if r.HasField("finished")}
