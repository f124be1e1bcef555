"""What checks observe: collected Generate streams, calls held open, and well-formed tensors.

A check reads a stream through ``Stream`` (events by kind, each output's tokens, text and
finishes) instead of re-walking messages, and holds a request in flight with ``OpenCall``
(read the first event, then abort, cancel or drain while the engine still works). The
helpers raise ``CheckFailed`` with the rule's own words; none of them decides what a rule
requires.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import grpc
from google.protobuf.message import Message

from .. import pb
from ..client import OpenEngineClient, StatusError


class CheckFailed(AssertionError):
    """The server broke the rule; the message says how."""


@dataclass
class Stream:
    """Every response of one Generate call, with views by event kind and output."""

    request: pb.GenerateRequest
    messages: list[pb.GenerateResponse]

    def events(self, kind: str) -> list[pb.GenerateResponse]:
        """Responses whose ``event`` is ``kind`` (token, finished, prompt, prefill_ready, error)."""
        return [m for m in self.messages if m.WhichOneof("event") == kind]

    def tokens(self, index: int = 0) -> list[pb.TokenInfo]:
        """Output ``index``'s token records, in order."""
        return [t for m in self.events("token") if m.token.output_index == index for t in m.token.tokens]

    def token_ids(self, index: int = 0) -> list[int]:
        """Output ``index``'s token ids."""
        return [t.token_id for t in self.tokens(index)]

    def text(self, index: int = 0) -> str:
        """Output ``index``'s text."""
        return "".join(m.token.text for m in self.events("token") if m.token.output_index == index)

    def finishes(self, index: int = 0) -> list[pb.GenerationFinished]:
        """Every ``GenerationFinished`` of output ``index`` (one, in a conforming stream)."""
        return [m.finished for m in self.events("finished") if m.finished.output_index == index]

    def finished(self, index: int = 0) -> pb.GenerationFinished:
        """Output ``index``'s one ``GenerationFinished``."""
        finishes = self.finishes(index)
        if len(finishes) != 1:
            raise CheckFailed(f"output {index} has {len(finishes)} GenerationFinished events, expected exactly one")
        return finishes[0]

    @property
    def last(self) -> pb.GenerateResponse:
        """The final response."""
        if not self.messages:
            raise CheckFailed("the stream ended with status OK but no response")
        return self.messages[-1]

    @property
    def error(self) -> pb.EngineError | None:
        """The terminal ``EngineError``, if the stream failed."""
        errors = self.events("error")
        return errors[-1].error if errors else None

    @property
    def usage(self) -> pb.Usage:
        """The usage on the final response."""
        if not self.last.HasField("usage"):
            raise CheckFailed(f"the final response ({self.last.WhichOneof('event')}) carries no usage")
        return self.last.usage

    def succeeded(self) -> Stream:
        """This stream, after requiring that it did not end with an ``EngineError``."""
        error = self.error
        if error is not None:
            raise CheckFailed(f"the request failed: {pb.ErrorCode.Name(error.code)}: {error.message}")
        return self


class OpenCall:
    """A Generate call a check keeps in flight and reads at its own pace."""

    def __init__(self, client: OpenEngineClient, request: pb.GenerateRequest, timeout_s: float) -> None:
        self.request = request
        self.messages: list[pb.GenerateResponse] = []
        self._call = client.generate_call(request, timeout_s=timeout_s)

    async def _read(self) -> pb.GenerateResponse | None:
        try:
            message = await self._call.read()
        except grpc.aio.AioRpcError as error:
            raise StatusError.from_rpc_error(error) from None
        return None if message is grpc.aio.EOF else cast(pb.GenerateResponse, message)

    async def first(self) -> pb.GenerateResponse:
        """The first response (the request is accepted once it arrives)."""
        message = await self._read()
        if message is None:
            raise CheckFailed("the stream ended before its first response")
        self.messages.append(message)
        return message

    async def rest(self) -> Stream:
        """Read to the end; a non-OK status raises ``StatusError``."""
        while (message := await self._read()) is not None:
            self.messages.append(message)
        return Stream(self.request, self.messages)

    def cancel(self) -> None:
        """Cancel the call from the client side (a no-op once it has ended)."""
        self._call.cancel()

    async def close(self) -> None:
        """``cancel``, for ``Target.on_exit``."""
        self.cancel()


def present(message: Message, field: str) -> bool:
    """Whether ``field`` (named at run time) is set on ``message``."""
    return message.HasField(field)


def advertised(message: Message, field: str) -> bool:
    """A boolean capability is advertised only when present and true."""
    return present(message, field) and bool(getattr(message, field))


def denied(message: Message, field: str) -> bool:
    """A boolean capability is reported unsupported only when present and false (absent: unknown)."""
    return present(message, field) and not getattr(message, field)


def check_engine_error(error: pb.EngineError, where: str) -> None:
    """An ``EngineError`` names its code, and carries ``retry_after_ms`` only when retryable."""
    if error.code == pb.ERROR_CODE_UNSPECIFIED:
        raise CheckFailed(f"{where}: EngineError code is ERROR_CODE_UNSPECIFIED")
    if error.HasField("retry_after_ms") and not error.retryable:
        raise CheckFailed(f"{where}: retry_after_ms is present on a non-retryable EngineError")


def check_dense(tensor: pb.DenseFloatTensor, where: str) -> list[int]:
    """Positive dimensions, product of shape equals the value count, finite values; the shape."""
    shape = list(tensor.shape)
    if not shape or any(d <= 0 for d in shape):
        raise CheckFailed(f"{where}: dense shape {shape} must be non-empty with every dimension > 0")
    if math.prod(shape) != len(tensor.values):
        raise CheckFailed(f"{where}: shape {shape} holds {math.prod(shape)} values, got {len(tensor.values)}")
    if not all(map(math.isfinite, tensor.values)):
        raise CheckFailed(f"{where}: dense values must be finite")
    return shape


def check_sparse(tensor: pb.SparseFloatTensor, where: str) -> list[int]:
    """Equal lengths, unique strictly increasing in-range indices, finite values; the shape."""
    shape = list(tensor.shape)
    if not shape or any(d <= 0 for d in shape):
        raise CheckFailed(f"{where}: sparse shape {shape} must be non-empty with every dimension > 0")
    indices = list(tensor.indices)
    if len(indices) != len(tensor.values):
        raise CheckFailed(f"{where}: {len(indices)} sparse indices for {len(tensor.values)} values")
    if any(b <= a for a, b in itertools.pairwise(indices)):
        raise CheckFailed(f"{where}: sparse indices must be unique and strictly increasing")
    if indices and indices[-1] >= math.prod(shape):
        raise CheckFailed(f"{where}: sparse index {indices[-1]} is not below the shape's size {math.prod(shape)}")
    if not all(map(math.isfinite, tensor.values)):
        raise CheckFailed(f"{where}: sparse values must be finite")
    return shape


def rows(values: Sequence[float], shape: Sequence[int]) -> list[list[float]]:
    """A row-major tensor's vectors along its last dimension."""
    width = shape[-1]
    return [list(values[i : i + width]) for i in range(0, len(values), width)]


__all__ = [
    "CheckFailed",
    "OpenCall",
    "Stream",
    "advertised",
    "check_dense",
    "check_engine_error",
    "check_sparse",
    "present",
    "rows",
]
