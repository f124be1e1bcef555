"""``core.stream_end``: how a Generate stream ended, from what it recorded."""

from __future__ import annotations

import pytest
from openengine_gateway import pb
from openengine_gateway.core.stream_end import Ending, StreamEnd
from openengine_gateway.core.telemetry import OUTCOMES

FINISHED = pb.GenerateResponse(finished=pb.GenerationFinished(reason=pb.FINISH_REASON_LENGTH))
ERROR = pb.GenerateResponse(error=pb.EngineError(code=pb.ERROR_CODE_INTERNAL))
TOKEN = pb.GenerateResponse(token=pb.TokenOutput(text="a"))


def ended(final: pb.GenerateResponse | None, *, read: bool, complete: bool, aborted: bool = False) -> Ending:
    end = StreamEnd(final=final)
    if read:
        end.read_all(complete=complete)
    return end.ending(aborted=aborted)


def test_a_complete_stream_read_to_its_end_finished() -> None:
    assert ended(FINISHED, read=True, complete=True) is Ending.FINISHED


@pytest.mark.parametrize(
    ("final", "read", "complete", "aborted", "expected"),
    [
        (ERROR, True, True, False, Ending.FAILED),  # its final message is an EngineError
        (ERROR, True, True, True, Ending.FAILED),  # a failure outranks the abort that came with it
        (FINISHED, True, True, True, Ending.ABORTED),  # cancelled outputs after an Abort
        (TOKEN, False, False, True, Ending.ABORTED),
        (TOKEN, False, False, False, Ending.CANCELLED),  # the client left mid-stream
        (FINISHED, False, True, False, Ending.CANCELLED),  # ... or while its final message was written
        (None, False, False, False, Ending.CANCELLED),  # ... or before any message
        (TOKEN, True, False, False, Ending.CANCELLED),  # read to an end that was not the final message
    ],
)
def test_every_other_ending(
    final: pb.GenerateResponse | None, read: bool, complete: bool, aborted: bool, expected: Ending
) -> None:
    assert ended(final, read=read, complete=complete, aborted=aborted) is expected


def test_a_rejection_outranks_everything() -> None:
    end = StreamEnd(rejected=True)
    assert end.ending(aborted=True) is Ending.REJECTED


def test_the_accepted_endings_are_the_telemetry_outcomes() -> None:
    assert {ending.value for ending in Ending if ending is not Ending.REJECTED} == set(OUTCOMES)
