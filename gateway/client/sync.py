"""A small synchronous wrapper: the async client on a private event loop thread.

with SyncClient("127.0.0.1:50051") as client:
    print(client.generate(text_request("Hello", max_tokens=8)).outputs[0].text)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from .. import pb
from .client import Completion, OpenEngineClient
from .errors import ClientError

T = TypeVar("T")


class SyncClient:
    """Blocking calls for scripts and notebooks; each call runs on the client's own loop."""

    def __init__(self, target: str, **connect_options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openengine-client", daemon=True)
        self._thread.start()
        try:
            self._client = self._run(OpenEngineClient.connect(target, **connect_options))
        except BaseException:
            self._stop_loop()
            raise

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed():
            coroutine.close()
            raise ClientError("this SyncClient is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    @property
    def engine_info(self) -> pb.EngineInfo | None:
        """What the server reported at connect time."""
        return self._client.engine_info

    def generate(self, request: pb.GenerateRequest, *, timeout_s: float | None = None) -> Completion:
        """Run a generation to its end."""
        return self._run(self._client.generate(request, timeout_s=timeout_s))

    def embed(self, request: pb.EmbedRequest, *, timeout_s: float | None = None) -> pb.EmbedResponse:
        """Embeddings for every input."""
        return self._run(self._client.embed(request, timeout_s=timeout_s))

    def classify(self, request: pb.ClassifyRequest, *, timeout_s: float | None = None) -> pb.ClassifyResponse:
        """Class scores for every input."""
        return self._run(self._client.classify(request, timeout_s=timeout_s))

    def score(self, request: pb.ScoreRequest, *, timeout_s: float | None = None) -> pb.ScoreResponse:
        """Scores for every candidate of every group."""
        return self._run(self._client.score(request, timeout_s=timeout_s))

    def model_info(self, model: str) -> pb.ModelInfo:
        """What ``model`` advertises."""
        return self._run(self._client.model_info(model))

    def health(self, request: pb.HealthRequest | None = None) -> pb.HealthResponse:
        """Health, optionally with an inference probe."""
        return self._run(self._client.health(request))

    def load(self, *, per_rank: bool = False) -> pb.LoadInfo:
        """A load snapshot."""
        return self._run(self._client.load(per_rank=per_rank))

    def abort(self, request: pb.AbortRequest) -> pb.AbortResponse:
        """Abort a request, a KV session, or everything."""
        return self._run(self._client.abort(request))

    def close(self) -> None:
        """Close the channel and stop the loop thread (again: nothing)."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._client.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["SyncClient"]
