"""Generation through the backend: stops, limits, logprobs, prompt logprobs, n > 1, seeds, UTF-8."""

from __future__ import annotations

import math

import pytest
from openengine_backends.mock.tokenizer import EOS, VOCAB_SIZE, decode, encode, piece
from openengine_gateway import pb
from openengine_gateway.errors import InvalidArgument
from openengine_gateway.spi import CandidateSelection, LogprobRequest, Sampling, Stopping, UsageReport

from .support import engine, generate

GREEDY = Sampling(temperature=0.0)
TOP_N = pb.CANDIDATE_TOKEN_SELECTION_MODE_TOP_N


async def test_greedy_is_deterministic_and_ends_on_eos() -> None:
    async with engine() as backend:
        first = await generate(backend, sampling=GREEDY)
        second = await generate(backend, sampling=GREEDY)
    assert first.tokens == second.tokens
    assert first.tokens[0][-1] == EOS
    assert first.finished[0].reason == pb.FINISH_REASON_STOP
    assert first.finished[0].stop is not None and first.finished[0].stop.eos_token_id == EOS
    assert first.text[0] == decode(first.tokens[0])


async def test_events_follow_the_protocol() -> None:
    async with engine() as backend:
        result = await generate(backend, sampling=Sampling(seed=1, num_sequences=3))
    kinds = [type(event).__name__ for event in result.events]
    assert kinds.count("OutputFinished") == 3
    assert kinds.count("UsageReport") == 2  # once the prompt is computed, then before the last finish
    assert kinds[-2:] == ["UsageReport", "OutputFinished"]
    assert result.usage == UsageReport(5 + 15, sum(len(t) for t in result.tokens.values()), 0)


async def test_seed_reproduces_and_outputs_differ() -> None:
    async with engine() as backend:
        first = await generate(backend, sampling=Sampling(seed=11, num_sequences=4, temperature=1.2))
        second = await generate(backend, sampling=Sampling(seed=11, num_sequences=4, temperature=1.2))
        other = await generate(backend, sampling=Sampling(seed=12, num_sequences=4, temperature=1.2))
    assert first.tokens == second.tokens
    assert len({tuple(t) for t in first.tokens.values()}) == 4
    assert first.tokens != other.tokens


async def test_max_tokens_and_ignore_eos() -> None:
    async with engine() as backend:
        result = await generate(backend, sampling=GREEDY, stopping=Stopping(max_tokens=300, ignore_eos=True))
        capped = await generate(backend, sampling=GREEDY, stopping=Stopping(max_tokens=3))
    assert len(result.tokens[0]) == 300
    assert EOS in result.tokens[0]  # generated and ignored
    assert result.finished[0].reason == pb.FINISH_REASON_LENGTH
    assert len(capped.tokens[0]) == 3 and capped.finished[0].reason == pb.FINISH_REASON_LENGTH


async def test_unlimited_output_stays_within_the_context() -> None:
    async with engine(max_context_length=64, max_output_tokens=40, total_kv_blocks=8, kv_block_size=16) as backend:
        result = await generate(backend, prompt="x" * 40, stopping=Stopping(ignore_eos=True))
    assert len(result.tokens[0]) == 64 - 41
    with pytest.raises(InvalidArgument, match="context"):
        async with engine(max_context_length=64, max_output_tokens=40, total_kv_blocks=8) as backend:
            await generate(backend, prompt="x" * 63)


async def test_min_tokens_holds_off_eos() -> None:
    async with engine() as backend:
        plain = await generate(backend, sampling=GREEDY)
        held = await generate(backend, sampling=GREEDY, stopping=Stopping(min_tokens=len(plain.tokens[0]) + 5))
    assert len(held.tokens[0]) > len(plain.tokens[0]) + 5
    assert EOS not in held.tokens[0][:-1]
    assert held.finished[0].stop is not None


async def test_stop_token_with_and_without_its_text() -> None:
    async with engine() as backend:
        plain = await generate(backend, sampling=GREEDY)
        stop_id = plain.tokens[0][2]
        cut = await generate(backend, sampling=GREEDY, stopping=Stopping(stop_token_ids=(stop_id,)))
        kept = await generate(
            backend, sampling=GREEDY, stopping=Stopping(stop_token_ids=(stop_id,), include_stop_in_output=True)
        )
        late = await generate(backend, sampling=GREEDY, stopping=Stopping(stop_token_ids=(stop_id,), min_tokens=3))
    at = plain.tokens[0].index(stop_id)
    assert cut.tokens[0] == plain.tokens[0][:at]
    assert kept.tokens[0] == plain.tokens[0][: at + 1]
    assert cut.finished[0].stop is not None and cut.finished[0].stop.stop_token_id == stop_id
    assert cut.text[0] == decode(plain.tokens[0][:at])
    assert kept.text[0] == decode(plain.tokens[0][: at + 1])
    assert stop_id not in late.tokens[0][:3]


async def test_a_stop_string_that_completes_past_min_tokens_ends_the_output() -> None:
    """Even when it began before ``min_tokens`` (vLLM's rule: only the text of a token past
    ``min_tokens`` completes one); one that completed at the ``min_tokens``-th token or before does not."""
    long = Stopping(max_tokens=24, ignore_eos=True)
    async with engine() as backend:
        text = (await generate(backend, sampling=GREEDY, stopping=long)).text[0]
        stop = text[3:7]  # tokens 4-7 (one byte each): completes at the 7th token
        straddling = Stopping(max_tokens=24, ignore_eos=True, min_tokens=6, stop_texts=(stop,))
        cut = await generate(backend, sampling=GREEDY, stopping=straddling)
        late = Stopping(max_tokens=24, ignore_eos=True, min_tokens=7, stop_texts=(stop,))  # completes at the 7th
        ignored = await generate(backend, sampling=GREEDY, stopping=late)
    assert text.count(stop) == 1 and text.isascii()
    assert (cut.text[0], cut.finished[0].reason) == (text[:3], pb.FINISH_REASON_STOP)
    assert (ignored.text[0], ignored.finished[0].reason) == (text, pb.FINISH_REASON_LENGTH)


async def test_a_stop_token_outside_the_vocabulary_is_refused() -> None:
    """Before ``min_tokens`` stop tokens are banned from sampling: an id past the vocabulary would index nothing."""
    async with engine() as backend:
        with pytest.raises(InvalidArgument, match="vocabulary"):
            await generate(backend, stopping=Stopping(stop_token_ids=(VOCAB_SIZE,), min_tokens=1, max_tokens=4))
        assert (await generate(backend, stopping=Stopping(max_tokens=2, min_tokens=1))).finished


async def test_stop_text_is_cut_or_kept() -> None:
    async with engine() as backend:
        plain = await generate(backend, sampling=GREEDY, stopping=Stopping(max_tokens=30, ignore_eos=True))
        stop = plain.text[0][4:6]
        cut = await generate(backend, sampling=GREEDY, stopping=Stopping(stop_texts=(stop,), ignore_eos=True))
        kept = await generate(
            backend,
            sampling=GREEDY,
            stopping=Stopping(stop_texts=(stop,), ignore_eos=True, include_stop_in_output=True),
        )
    head = plain.text[0][: plain.text[0].index(stop)]
    assert cut.text[0] == head and kept.text[0] == head + stop
    assert cut.finished[0].stop is not None and cut.finished[0].stop.stop_text == stop
    assert cut.tokens == kept.tokens  # the stop string's tokens were generated either way


async def test_text_deltas_are_whole_utf8_characters() -> None:
    async with engine(seed=5) as backend:
        result = await generate(
            backend,
            sampling=Sampling(seed=2, temperature=1.5),
            stopping=Stopping(max_tokens=600, ignore_eos=True),
        )
    tokens = result.tokens[0]
    assert any(t >= 0xC2 for t in tokens if t < 256), "expected some multi-byte characters"
    # deltas are cut only at character boundaries: joined they equal the one-shot decode
    assert "".join(result.deltas[0]) == decode(tokens)


def _assert_exact(backend_model: object, context: list[int], records: list, top_n: int = 0) -> None:
    from openengine_backends.mock.model import PseudoModel

    assert isinstance(backend_model, PseudoModel)
    for record in records:
        row = backend_model.row(context)
        assert record.logprob == backend_model.logprob(row, record.token_id)
        assert record.rank == backend_model.rank(row, record.token_id)
        assert record.token == piece(record.token_id)
        assert [c.token_id for c in record.candidates] == backend_model.top(row, top_n)
        assert [c.rank for c in record.candidates] == list(range(1, top_n + 1))
        context = [*context, record.token_id]


async def test_output_logprobs_are_the_raw_distribution() -> None:
    async with engine() as backend:
        result = await generate(
            backend,
            sampling=Sampling(temperature=0.7, top_k=5, seed=4),
            output_logprobs=LogprobRequest(CandidateSelection(TOP_N, top_n=4)),
        )
        _assert_exact(backend.model, encode("The quick brown fox"), result.records[0], top_n=4)


async def test_candidate_selection_modes() -> None:
    ids = (ord("a"), EOS, 3)
    async with engine() as backend:
        chosen = await generate(
            backend,
            stopping=Stopping(max_tokens=3),
            output_logprobs=LogprobRequest(
                CandidateSelection(pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS, token_ids=ids)
            ),
        )
        every = await generate(
            backend,
            stopping=Stopping(max_tokens=2),
            output_logprobs=LogprobRequest(CandidateSelection(pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL)),
        )
        with pytest.raises(InvalidArgument, match="vocabulary"):
            await generate(
                backend,
                output_logprobs=LogprobRequest(
                    CandidateSelection(pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS, token_ids=(VOCAB_SIZE,))
                ),
            )
    record = chosen.records[0][0]
    assert [c.token_id for c in record.candidates] == list(ids)
    full = every.records[0][0].candidates
    assert len(full) == VOCAB_SIZE
    assert [c.rank for c in full] == list(range(1, VOCAB_SIZE + 1))
    assert math.isclose(sum(math.exp(c.logprob) for c in full), 1.0)


async def test_prompt_logprobs_from_a_start_position() -> None:
    prompt = encode("The quick brown fox")
    async with engine() as backend:
        whole = await generate(backend, prompt_logprobs=LogprobRequest(), stopping=Stopping(max_tokens=1))
        tail = await generate(
            backend,
            prompt_logprobs=LogprobRequest(CandidateSelection(TOP_N, top_n=2)),
            prompt_logprob_start=5,
            stopping=Stopping(max_tokens=1),
        )
        model = backend.model
        none = await generate(backend, stopping=Stopping(max_tokens=1))
    assert whole.prompt is not None and tail.prompt is not None and none.prompt is None
    first, *rest = whole.prompt.tokens
    assert (first.token_id, first.logprob, first.rank, list(first.candidates)) == (prompt[0], None, None, [])
    _assert_exact(model, prompt[:1], rest)
    assert [r.token_id for r in tail.prompt.tokens] == prompt[5:]
    _assert_exact(model, prompt[:5], tail.prompt.tokens, top_n=2)
    assert whole.events[0] is whole.prompt


async def test_validation_before_acceptance() -> None:
    async with engine(max_context_length=64, max_output_tokens=32, total_kv_blocks=8) as backend:
        with pytest.raises(InvalidArgument, match="vocabulary"):
            await generate(backend, prompt_token_ids=[1, 999])
        with pytest.raises(InvalidArgument, match="exceeds the context"):
            await generate(backend, prompt="x" * 40, stopping=Stopping(max_tokens=30))
        with pytest.raises(InvalidArgument, match="prompt_logprob_start"):
            await generate(backend, prompt="hi", prompt_logprobs=LogprobRequest(), prompt_logprob_start=3)
        with pytest.raises(InvalidArgument, match="KV blocks"):
            await generate(
                backend, prompt="x" * 10, sampling=Sampling(num_sequences=8), stopping=Stopping(max_tokens=30)
            )
