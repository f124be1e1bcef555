"""The echo engine through its SPI, without a gateway: what it generates and when it stops."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from openengine_echo import EchoBackend, EchoSettings
from openengine_gateway import pb
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import GenerationRequest, OutputFinished, StopMatch, Stopping, TokenDelta, UsageReport


@pytest.fixture
async def engine() -> AsyncIterator[EchoBackend]:
    backend = EchoBackend(EchoSettings(max_context_length=64))
    await backend.start()
    yield backend
    await backend.stop()


async def echo(backend: EchoBackend, prompt: str = "abc", **stopping: Any) -> tuple[str, list[int], Any, Any]:
    """The output text, token ids, usage and finish of one request."""
    request = GenerationRequest("r", "echo", prompt=prompt, stopping=Stopping(**stopping))
    text, ids, usage, finish = "", [], None, None
    async for event in backend.generate(request):
        if isinstance(event, TokenDelta):
            text += event.text
            ids += [t.token_id for t in event.tokens]
        elif isinstance(event, UsageReport):
            usage = event
        elif isinstance(event, OutputFinished):
            finish = event
    return text, ids, usage, finish


async def test_echoes_the_prompt_then_ends_with_eos(engine: EchoBackend) -> None:
    text, ids, usage, finish = await echo(engine)
    assert text == "abc" and ids == [97, 98, 99, 0]  # EOS stays in the records, without text
    assert (usage.prompt_tokens, usage.completion_tokens) == (3, 4)
    assert finish == OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.eos(0))


async def test_repeat_and_length() -> None:
    backend = EchoBackend(EchoSettings(repeat=2))
    assert (await echo(backend, "ab"))[0] == "abab"
    text, _, _, finish = await echo(backend, "ab", max_tokens=3)
    assert text == "aba" and finish.reason == pb.FINISH_REASON_LENGTH


@pytest.mark.parametrize(("include", "expected"), [(False, "hello"), (True, "hello,")])
async def test_stop_strings(engine: EchoBackend, include: bool, expected: str) -> None:
    text, _, _, finish = await echo(engine, "hello, world", stop_texts=(", ",), include_stop_in_output=include)
    assert text == expected.replace(",", ", ") if include else text == expected
    assert finish.stop == StopMatch.text(", ")


async def test_stop_token_and_min_tokens(engine: EchoBackend) -> None:
    text, ids, _, finish = await echo(engine, "a.b.", stop_token_ids=(ord("."),))
    assert (text, ids, finish.stop) == ("a", [97], StopMatch.token(46))  # the stop token is dropped
    text, _, _, finish = await echo(engine, "a.b.", stop_token_ids=(ord("."),), min_tokens=2)
    assert text == "a.b" and finish.stop == StopMatch.token(46)  # nothing ends the output before min_tokens
    text, _, _, finish = await echo(engine, "ab", ignore_eos=True, max_tokens=5)
    assert text == "ababa" and finish.reason == pb.FINISH_REASON_LENGTH


async def test_invalid_requests_are_refused_before_acceptance(engine: EchoBackend) -> None:
    with pytest.raises(InvalidArgument, match="not characters"):
        engine.generate(GenerationRequest("r", "echo", prompt_token_ids=[65, 0xD800]))
    with pytest.raises(InvalidArgument, match="context"):
        engine.generate(GenerationRequest("r", "echo", prompt="x" * 64))
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):  # the gateway does not know its size
        engine.generate(GenerationRequest("r", "echo", prompt="x", stopping=Stopping(stop_token_ids=(0x110000,))))


def test_settings_name_the_offending_key() -> None:
    with pytest.raises(ValueError, match="repeat"):
        EchoSettings(repeat=0)
    with pytest.raises(ValueError, match="repaet"):
        EchoSettings.model_validate({"repaet": 2})
