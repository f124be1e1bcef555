"""What a complete Generate stream looks like, checked message by message."""

from __future__ import annotations

from dataclasses import dataclass, field

from openengine_gateway import pb


@dataclass
class Ending:
    """How one stream ended: per-output finish reasons, or its terminal error."""

    reasons: dict[int, int] = field(default_factory=dict)
    error: pb.EngineError | None = None
    tokens: int = 0
    usage: pb.Usage | None = None


def ending(responses: list[pb.GenerateResponse], *, outputs: int = 1) -> Ending:
    """Check the stream's invariants and say how it ended.

    Exactly one terminal event per output (or one request-scoped ``EngineError`` that ends
    everything), nothing after it, usage only on the final message, and (unless it failed)
    usage counting every token that was sent. Raises ``AssertionError`` naming the broken rule.
    """
    result = Ending()
    for position, response in enumerate(responses):
        last = position == len(responses) - 1
        assert result.error is None, "a message followed a terminal EngineError"
        assert response.HasField("usage") == last, f"usage on message {position} of {len(responses)}"
        kind = response.WhichOneof("event")
        if kind == "token":
            index = response.token.output_index
            assert index not in result.reasons, f"a token after output {index} finished"
            result.tokens += len(response.token.tokens)
        elif kind == "finished":
            index = response.finished.output_index
            assert index not in result.reasons, f"output {index} finished twice"
            result.reasons[index] = response.finished.reason
        elif kind == "error":
            result.error = response.error
    assert responses, "the stream sent nothing"
    result.usage = responses[-1].usage
    if result.error is None:
        assert sorted(result.reasons) == list(range(outputs)), f"outputs finished: {sorted(result.reasons)}"
        assert result.usage.completion_tokens == result.tokens, "usage disagrees with the tokens sent"
    return result


__all__ = ["Ending", "ending"]
