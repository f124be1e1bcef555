"""``extra.detokenize`` on the later layout's Generate: read by the edge for every engine, never refused or ignored.

Dynamo 1.6.1's sidecar sends ``extra {"detokenize": false}`` with every request (its frontend detokenizes);
TensorRT-LLM's servicer reads the key as a boolean. ``false`` leaves the text out, the token ids stay.
"""

from __future__ import annotations

import grpc
import pytest
from openengine_gateway import pb_later
from openengine_gateway.testing import serve_backends

from .conftest import mock


def _request(**extra: object) -> pb_later.GenerateRequest:
    request = pb_later.GenerateRequest(request_id="", model="model", token_ids=pb_later.TokenIds(ids=list(b"hello")))
    request.stopping.max_tokens = 6
    request.sampling.temperature = 0.0
    if extra:
        request.extra.update(extra)
    return request


async def _tokens(inference: pb_later.InferenceStub, request: pb_later.GenerateRequest) -> tuple[list[int], str]:
    events = [event async for event in inference.Generate(request)]
    outputs = [event.token for event in events if event.HasField("token")]
    return [t.token_id for output in outputs for t in output.tokens], "".join(output.text for output in outputs)


async def test_detokenize_false_leaves_out_the_text_and_keeps_the_tokens() -> None:
    async with serve_backends([("model", mock())]) as running:
        inference = pb_later.InferenceStub(running.channel)
        ids, text = await _tokens(inference, _request())
        assert (ids, text) == await _tokens(inference, _request(detokenize=True))
        assert (ids, "") == await _tokens(inference, _request(detokenize=False))
    assert len(ids) == 6 and text


@pytest.mark.parametrize("value", ["false", 0, None])
async def test_detokenize_must_be_a_boolean(value: object) -> None:
    async with serve_backends([("model", mock())]) as running:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await _tokens(pb_later.InferenceStub(running.channel), _request(detokenize=value))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "extra.detokenize must be a boolean" in (error.value.details() or "")
