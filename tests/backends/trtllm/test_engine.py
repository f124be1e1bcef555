"""The driver on the fake TensorRT-LLM behind a real in-process gateway, feature by feature."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
import regex
from openengine_backends.trtllm import TrtllmBackend, TrtllmSettings
from openengine_backends.trtllm.mapping import trt_priority
from openengine_gateway import pb
from openengine_gateway.errors import ConfigurationError

from tests.responses import collect, finished, text

from ..fake_serving import MODEL, serving
from . import fake_llm
from .conftest import request, token_ids, trtllm
from .fake_api import Installed, SamplingParams, SchedulingParams, install

pytestmark = pytest.mark.usefixtures("fake")

STOP = pb.StoppingOptions
LORA_CONFIG = {"max_loras": 4, "lora_target_modules": ["attn_q", "attn_k", "attn_v", "attn_dense"]}
"""docs/backends/trtllm.md's example: TensorRT-LLM needs the target modules unless ``lora_dir`` names one adapter."""


def greedy(prompt: list[int], count: int, lora_id: int = 0) -> list[int]:
    """The fake model's greedy continuation (EOS ignored)."""
    context, out = list(prompt), []
    for _ in range(count):
        scores = fake_llm.logprobs(context, lora_id)
        token = max([fake_llm.EOS, *range(3, len(fake_llm.PIECES))], key=lambda t: (scores[t], -t))
        context.append(token)
        out.append(token)
    return out


def pieces(ids: list[int]) -> str:
    return fake_llm.Tokenizer().decode(ids, skip_special_tokens=True)


PROMPT = fake_llm.Tokenizer().encode("The fox")


async def rejected(running: object, message: pb.GenerateRequest) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await collect(running.stub, message)  # type: ignore[arg-type]
    return error.value.code()


async def test_text_and_token_prompts_stream_the_greedy_deltas() -> None:
    async with serving(trtllm()) as running:
        by_text = await collect(running.stub, request("The fox", stopping=STOP(max_tokens=8)))
        by_ids = await collect(running.stub, request(PROMPT, stopping=STOP(max_tokens=8)))
    expected = greedy(PROMPT, 8)
    assert token_ids(by_text) == token_ids(by_ids) == expected
    assert text(by_text) == pieces(expected)
    assert finished(by_text)[0].reason == pb.FINISH_REASON_LENGTH
    assert by_text[-1].usage.prompt_tokens == len(PROMPT) and by_text[-1].usage.completion_tokens == 8


async def test_without_max_tokens_the_budget_is_the_rest_of_the_context(fake: Installed) -> None:
    async with serving(trtllm(max_seq_len=40)) as running:
        responses = await collect(running.stub, request(PROMPT, stopping=STOP(ignore_eos=True)))
    assert len(token_ids(responses)) == 40 - len(PROMPT)
    assert fake.llm_class is fake_llm.LLM


async def test_the_advertised_context_is_what_the_executor_enforces(fake: Installed) -> None:
    """``args.max_seq_len`` stays None; the executor cuts the model's 256 positions to its KV pool (64 x 2)."""
    async with serving(trtllm(kv_cache_config={"tokens_per_block": 2})) as running:
        info = await running.stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))
        responses = await collect(running.stub, request(PROMPT, stopping=STOP(ignore_eos=True)))
        over = await rejected(running, request(tokens(128), stopping=STOP(max_tokens=1)))
    engine = fake.engines[-1]
    assert engine.args.max_seq_len is None and info.max_context_length == engine.max_seq_len == 128
    assert len(token_ids(responses)) == 128 - len(PROMPT)
    assert over == grpc.StatusCode.INVALID_ARGUMENT


def tokens(count: int) -> list[int]:
    """A prompt of ``count`` token ids the fake model knows."""
    return [3 + n % 70 for n in range(count)]


@pytest.mark.parametrize("version", ["1.2.1", "1.3.0rc29"])
@pytest.mark.parametrize("chunked", [False, True], ids=["no-chunked-prefill", "chunked-prefill"])
@pytest.mark.parametrize("max_num_tokens", [16, 100, None], ids=lambda n: f"max_num_tokens={n}")
@pytest.mark.parametrize("max_seq_len", [None, 40], ids=lambda n: f"max_seq_len={n}")
async def test_the_advertised_context_is_exactly_what_the_executor_accepts(
    monkeypatch: pytest.MonkeyPatch, max_seq_len: int | None, max_num_tokens: int | None, chunked: bool, version: str
) -> None:
    """A prompt one token short of ``max_context_length`` runs; one of that length is refused before
    submission, and TensorRT-LLM would have refused it too (``llm.py`` ``_check_arguments`` over
    ``max_num_tokens`` without chunked prefill; ``_deduce_max_tokens`` over the executor's ``max_seq_len``,
    which 1.2.1 only warns about and 1.3 raises for)."""
    installed = install(monkeypatch, version=version)
    options: dict[str, object] = {"kv_cache_config": {"tokens_per_block": 2}, "enable_chunked_prefill": chunked}
    options.update(
        {name: value for name, value in (("max_seq_len", max_seq_len), ("max_num_tokens", max_num_tokens)) if value}
    )
    async with serving(trtllm(**options)) as running:
        limit = (await running.stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))).max_context_length
        longest = await collect(running.stub, request(tokens(limit - 1), stopping=STOP(max_tokens=1, ignore_eos=True)))
        over = await rejected(running, request(tokens(limit), stopping=STOP(max_tokens=1, ignore_eos=True)))
        engine = installed.engines[-1]
        if version != "1.2.1":  # 1.2.1 only warns over its max_seq_len (the fake does not model what follows)
            with pytest.raises((ValueError, fake_llm.RequestError)):
                await engine.generate_async({"prompt_token_ids": tokens(limit)}, SamplingParams(max_tokens=1))
    bound = min(max_seq_len or 256, 128)  # given, else the model's 256 positions; cut to the 64 x 2 pool
    if max_num_tokens is not None and not chunked:
        bound = min(bound, max_num_tokens + 1)
    assert limit == bound and len(token_ids(longest)) == 1
    assert over == grpc.StatusCode.INVALID_ARGUMENT and engine.worker_error is None


async def test_a_decode_engine_advertises_the_context_of_its_handoffs(fake: Installed) -> None:
    """``_check_arguments`` skips generation-only requests (all a decode engine takes): a handoff longer
    than the decode engine's ``max_num_tokens`` resumes, so its context is the executor's ``max_seq_len``."""
    transceiver = {"cache_transceiver_config": {"backend": "UCX"}, "kv_cache_config": {"tokens_per_block": 2}}
    async with (
        serving(trtllm(role="prefill", enable_chunked_prefill=True, **transceiver)) as prefill,
        serving(trtllm(role="decode", max_num_tokens=16, **transceiver)) as decode,
    ):
        info = await decode.stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))
        ready = await collect(prefill.stub, request(tokens(40), stopping=STOP(max_tokens=3, ignore_eos=True)))
        resumed = request(tokens(40), stopping=STOP(max_tokens=3, ignore_eos=True))
        resumed.kv.session.CopyFrom(ready[-1].prefill_ready.kv_session)
        decoded = await collect(decode.stub, resumed)
    assert info.max_context_length == 128 and len(token_ids(decoded)) == 3


async def test_a_refusal_tensorrt_llm_reports_while_the_result_is_read_is_still_a_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker wraps an enqueue failure in ``RequestError``, read with the result before any output
    (a prompt its ``max_seq_len`` cannot hold is one on 1.3; 1.2.1 only warns)."""
    install(monkeypatch, version="1.3.0rc29")
    async with serving(trtllm()) as running:
        monkeypatch.setattr(fake_llm.LLM, "max_seq_len", property(lambda _: 4))  # the executor's own, tighter limit
        too_long = await rejected(running, request(PROMPT, stopping=STOP(max_tokens=2)))

        def wedged(self: fake_llm.RequestOutput, llm: fake_llm.LLM) -> None:
            raise fake_llm.RequestError("the executor is wedged")

        monkeypatch.setattr(fake_llm.RequestOutput, "_first_step", wedged)
        internal = await rejected(running, request(PROMPT, stopping=STOP(max_tokens=2)))
    assert too_long == grpc.StatusCode.INVALID_ARGUMENT and internal == grpc.StatusCode.INTERNAL


async def test_eos_ends_the_output_as_a_record_without_text() -> None:
    async with serving(trtllm()) as running:
        responses = await collect(running.stub, request("Hi.", stopping=STOP(max_tokens=8)))
    end = finished(responses)[0]
    assert end.reason == pb.FINISH_REASON_STOP and end.stop_match.eos_token_id == fake_llm.EOS
    assert token_ids(responses) == [fake_llm.EOS] and text(responses) == ""
    assert responses[-1].usage.completion_tokens == 1


async def test_stop_tokens_are_dropped_unless_included() -> None:
    expected = greedy(PROMPT, 6)
    stop = expected[3]
    condition = pb.StopCondition(stop_token_id=stop)
    async with serving(trtllm()) as running:
        dropped = await collect(running.stub, request(PROMPT, stopping=STOP(max_tokens=6, conditions=[condition])))
        kept = await collect(
            running.stub,
            request(PROMPT, stopping=STOP(max_tokens=6, conditions=[condition], include_stop_in_output=True)),
        )
    assert token_ids(dropped) == expected[:3] and text(dropped) == pieces(expected[:3])
    assert finished(dropped)[0].stop_match.stop_token_id == stop
    assert token_ids(kept) == expected[:4] and text(kept) == pieces(expected[:4])
    assert dropped[-1].usage.completion_tokens == kept[-1].usage.completion_tokens == 4


async def test_stop_strings_are_matched_by_the_driver_and_the_engine_stops(fake: Installed) -> None:
    expected = pieces(greedy(PROMPT, 12))
    stop = expected[4:6]
    condition = pb.StopCondition(stop_text=stop)
    async with serving(trtllm()) as running:
        cut = await collect(running.stub, request(PROMPT, stopping=STOP(max_tokens=12, conditions=[condition])))
        kept = await collect(
            running.stub,
            request(PROMPT, stopping=STOP(max_tokens=12, conditions=[condition], include_stop_in_output=True)),
        )
    assert text(cut) == expected[: expected.find(stop)] and text(kept) == expected[: expected.find(stop) + 2]
    assert finished(cut)[0].stop_match.stop_text == stop
    submitted = fake.engines[-1].submitted
    assert all(not handle.sampling_params.stop for handle in submitted)  # never handed to TensorRT-LLM
    assert [handle.aborted() for handle in submitted[1:]] == [True, True]  # stopped once the string matched


async def test_several_outputs_are_one_request_each() -> None:
    """TensorRT-LLM finishes an output only with its whole request (result.py): one output a request."""
    async with serving(trtllm()) as running:
        info = await running.stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))
        several = pb.SamplingParams(num_sequences=2, temperature=1.0)
        code = await rejected(running, request(PROMPT, sampling=several, stopping=STOP(max_tokens=5)))
    assert info.generation.max_num_sequences == 1
    assert code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "knob",
    [{"seed": 11}, {"min_p": 0.2}, {"repetition_penalty": 1.3}, {"presence_penalty": 0.4}, {"frequency_penalty": 0.4}],
    ids=lambda knob: next(iter(knob)),
)
async def test_knobs_torch_sampler_ignores_are_refused_and_the_trtllm_sampler_takes_them(
    fake: Installed, knob: dict[str, float]
) -> None:
    """``TorchSampler`` (the default) draws every request from one generator seeded 42 and applies no penalty."""
    sampling = pb.SamplingParams(temperature=1.0, **knob)
    async with serving(trtllm()) as running:
        code = await rejected(running, request(PROMPT, sampling=sampling, stopping=STOP(max_tokens=5)))
    async with serving(trtllm(sampler_type="TRTLLMSampler")) as running:
        runs = [
            await collect(running.stub, request(PROMPT, sampling=sampling, stopping=STOP(max_tokens=5)))
            for _ in range(2)
        ]
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    submitted = fake.engines[-1].submitted[-1].sampling_params
    assert getattr(submitted, next(iter(knob))) == pytest.approx(next(iter(knob.values())))
    if "seed" in knob:
        assert token_ids(runs[0]) == token_ids(runs[1])


async def test_a_request_without_knobs_samples_at_temperature_one_with_the_models_defaults(
    fake: Installed, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TensorRT-LLM decodes greedily with no knob set; vLLM and SGLang apply the generation config, else T=1."""
    async with serving(trtllm()) as plain:
        await collect(plain.stub, request(PROMPT, sampling=None, stopping=STOP(max_tokens=3)))
    neutral = fake.engines[-1].submitted[-1].sampling_params
    (tmp_path / "generation_config.json").write_text('{"temperature": 0.5, "top_k": 7, "repetition_penalty": 1.2}')
    with caplog.at_level("WARNING", logger="openengine_backends.trtllm.engine"):
        async with serving(TrtllmBackend(TrtllmSettings(model=str(tmp_path)))) as model:
            await collect(model.stub, request(PROMPT, sampling=None, stopping=STOP(max_tokens=3)))
            await collect(model.stub, request(PROMPT, sampling=pb.SamplingParams(top_k=3), stopping=STOP(max_tokens=3)))
    defaults, given = (handle.sampling_params for handle in fake.engines[-1].submitted[-2:])
    assert (neutral.temperature, neutral.top_p, neutral.top_k) == (1.0, 1.0, 0) and not neutral._greedy_decoding
    assert (defaults.temperature, defaults.top_p, defaults.top_k, defaults.repetition_penalty) == (0.5, 1.0, 7, None)
    assert (given.temperature, given.top_k) == (0.5, 3)
    dropped = [r for r in caplog.records if "generation-config defaults" in r.getMessage()]
    assert len(dropped) == 1 and "repetition_penalty" in dropped[0].getMessage()


async def test_min_tokens_with_a_stop_token_is_refused() -> None:
    """TensorRT-LLM holds back only EOS until ``min_tokens`` (``_apply_min_length_penalty``)."""
    condition = pb.StopCondition(stop_token_id=greedy(PROMPT, 1)[0])
    async with serving(trtllm()) as running:
        both = request(PROMPT, stopping=STOP(max_tokens=6, min_tokens=3, conditions=[condition]))
        code = await rejected(running, both)
        held = await collect(running.stub, request("Hi.", stopping=STOP(max_tokens=6, min_tokens=3)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert len(token_ids(held)) >= 3 and fake_llm.EOS not in token_ids(held)[:3]


async def test_output_logprobs_while_sampling_need_a_top_k_and_every_record_then_has_its_own() -> None:
    """``TorchSampler``'s rows are the top-k only (1.2-period ``sampler.py``): top-k sampling stays within
    them, so every sampled token has its row; unbounded sampling could sample outside and is refused."""
    wanted = pb.ResponseOptions(return_output_logprobs=True, output_candidates=pb.CandidateTokenSelection(top_n=1))
    stopping = STOP(max_tokens=12, ignore_eos=True)
    async with serving(trtllm()) as running:
        unbounded = await rejected(
            running, request(PROMPT, sampling=pb.SamplingParams(temperature=5.0), stopping=stopping, response=wanted)
        )
        hot = pb.SamplingParams(temperature=5.0, top_k=6)
        responses = await collect(running.stub, request(PROMPT, sampling=hot, stopping=stopping, response=wanted))
    records = [t for r in responses if r.HasField("token") for t in r.token.tokens]
    assert unbounded == grpc.StatusCode.INVALID_ARGUMENT
    assert len(records) == 12 and all(t.HasField("logprob") and 1 <= t.rank <= 6 for t in records)
    assert all(len(t.candidates) == 1 and t.candidates[0].rank == 1 for t in records)
    outside = [t for t in records if t.rank > 1]
    assert outside and all(t.candidates[0].token_id != t.token_id for t in outside)


async def test_guidance_is_refused_without_a_grammar_backend_and_enforced_with_one(fake: Installed) -> None:
    regex_guide = pb.GuidedDecoding(regex="(ab|ba){2}c")
    choice = pb.GuidedDecoding(choice=pb.ChoiceConstraint(choices=["alpha", "beta"]))
    async with serving(trtllm()) as plain:
        assert await rejected(plain, request(PROMPT, guided=regex_guide)) == grpc.StatusCode.INVALID_ARGUMENT
    async with serving(trtllm(guided_decoding_backend="xgrammar")) as running:
        matched = await collect(running.stub, request(PROMPT, guided=regex_guide, stopping=STOP(max_tokens=20)))
        picked = await collect(running.stub, request(PROMPT, guided=choice, stopping=STOP(max_tokens=20)))
        schema = request(
            PROMPT, guided=pb.GuidedDecoding(json_schema='{"type": "object"}'), stopping=STOP(max_tokens=2)
        )
        await collect(running.stub, schema)
        other = pb.GuidedDecoding(regex="a", backend="llguidance")
        code = await rejected(running, request(PROMPT, guided=other))
    assert regex.fullmatch("(ab|ba){2}c", text(matched)) and text(picked) in ("alpha", "beta")
    assert fake.engines[-1].submitted[-1].sampling_params.guided_decoding.json == '{"type": "object"}'
    assert code == grpc.StatusCode.INVALID_ARGUMENT


async def test_priority_is_offered_only_when_tensorrt_llm_takes_and_orders_by_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with serving(trtllm()) as running:
        assert await rejected(running, request(PROMPT, priority=1)) == grpc.StatusCode.INVALID_ARGUMENT
    newer = install(monkeypatch, priority=True)
    async with serving(trtllm()) as running:
        info = await running.stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))
        assert not info.generation.supports_priority  # accepted, but the FCFS queue ignores it
    async with serving(trtllm(scheduler_config={"waiting_queue_policy": "priority"})) as running:
        info = await running.stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))
        await collect(running.stub, request(PROMPT, priority=-7, stopping=STOP(max_tokens=1)))
    assert info.generation.supports_priority
    assert newer.engines[-1].submitted[-1].options["priority"] == trt_priority(-7)


async def test_cache_salt_namespaces_the_prefix_cache() -> None:
    prompt = fake_llm.Tokenizer().encode("a long prompt that spans several kv blocks")
    async with serving(trtllm(kv_cache_config={"tokens_per_block": 4})) as running:
        cached = []
        for salt in (None, None, "tenant-a", "tenant-a"):
            message = request(prompt, stopping=STOP(max_tokens=1))
            if salt is not None:
                message.kv.cache_salt = salt
            cached.append((await collect(running.stub, message))[-1].usage.cached_prompt_tokens)
    assert cached[0] == 0 and cached[1] > 0 and cached[2] == 0 and cached[3] == cached[1]


async def test_a_data_parallel_rank_pins_an_attention_dp_request(fake: Installed) -> None:
    async with serving(trtllm(enable_attention_dp=True, tensor_parallel_size=2)) as running:
        message = request(PROMPT, stopping=STOP(max_tokens=1))
        message.kv.data_parallel_rank = 1
        await collect(running.stub, message)
        engine_info = await running.stub.GetEngineInfo(pb.GetEngineInfoRequest())
    assert engine_info.parallelism.data_parallel_size == 2
    assert fake.engines[-1].submitted[-1].options["scheduling_params"] == SchedulingParams(
        attention_dp_rank=1, attention_dp_relax=False
    )


async def test_lora_adapters_load_by_priming_serve_by_name_and_never_reuse_an_id(tmp_path: Path) -> None:
    good, other, bad, gone = tmp_path / "good", tmp_path / "other", tmp_path / "bad", tmp_path / "gone"
    for directory in (good, other, bad, gone):
        directory.mkdir()
    for directory in (good, other, gone):
        (directory / "adapter_config.json").write_text("{}")
    adapter = pb.LoraAdapter(lora_id=5, lora_name="good", source_path=str(good))
    for options in ({}, {"enable_lora": True}):  # without a lora_config TensorRT-LLM serves the base model
        async with serving(trtllm(**options)) as disabled:
            info = await disabled.stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))
            with pytest.raises(grpc.aio.AioRpcError) as off:
                await disabled.stub.LoadLora(pb.LoadLoraRequest(adapter=adapter))
        assert not info.supports_lora and off.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    async with serving(trtllm(lora_config=LORA_CONFIG)) as running:
        await running.stub.LoadLora(
            pb.LoadLoraRequest(adapter=pb.LoraAdapter(lora_id=7, lora_name="gone", source_path=str(gone)))
        )
        (gone / "adapter_config.json").unlink()  # the directory stays: 1.2.1 would reload it, and end its worker
        vanished = await rejected(running, request(PROMPT, lora_name="gone"))
        await running.stub.LoadLora(pb.LoadLoraRequest(adapter=adapter))
        tuned = await collect(running.stub, request(PROMPT, lora_name="good", stopping=STOP(max_tokens=6)))
        with pytest.raises(grpc.aio.AioRpcError) as broken:
            await running.stub.LoadLora(
                pb.LoadLoraRequest(adapter=pb.LoraAdapter(lora_id=6, lora_name="bad", source_path=str(bad)))
            )
        await running.stub.UnloadLora(pb.UnloadLoraRequest(lora_name="good"))
        gone = await rejected(running, request(PROMPT, lora_name="good"))
        with pytest.raises(grpc.aio.AioRpcError) as reused:
            await running.stub.LoadLora(
                pb.LoadLoraRequest(adapter=pb.LoraAdapter(lora_id=5, lora_name="other", source_path=str(other)))
            )
        await running.stub.LoadLora(pb.LoadLoraRequest(adapter=adapter))  # the same adapter again is fine
    assert vanished == grpc.StatusCode.FAILED_PRECONDITION
    assert token_ids(tuned) == greedy(PROMPT, 6, lora_id=5) != greedy(PROMPT, 6)
    assert broken.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "no readable" in broken.value.details()
    assert gone == grpc.StatusCode.NOT_FOUND
    assert reused.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_abort_reaches_tensorrt_llm_through_the_request_handle(
    fake: Installed, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fake_llm, "STEP_S", 0.005)
    async with serving(trtllm()) as running:
        message = request(PROMPT, request_id="long", stopping=STOP(max_tokens=200, ignore_eos=True))
        call = running.stub.Generate(message)
        first = await call.read()
        assert first.HasField("token")
        during = await running.stub.GetLoad(pb.GetLoadRequest())
        response = await running.stub.Abort(pb.AbortRequest(request_id="long"))
        rest = []
        while (response_ := await call.read()) is not grpc.aio.EOF:
            rest.append(response_)
        for _ in range(50):
            if fake.engines[-1].submitted[-1].finished:
                break
            await asyncio.sleep(0.01)
    assert response.status == pb.ABORT_STATUS_ABORTED
    assert finished(rest)[0].reason == pb.FINISH_REASON_CANCELLED
    assert fake.engines[-1].submitted[-1].aborted()
    assert during.running_requests >= 1


async def test_load_comes_from_iteration_statistics_and_an_idle_engine_is_zero() -> None:
    async with serving(trtllm(kv_cache_config={"tokens_per_block": 4})) as running:
        await collect(running.stub, request(PROMPT, stopping=STOP(max_tokens=3)))
        load = await running.stub.GetLoad(pb.GetLoadRequest())
        info = await running.stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))
    assert info.total_kv_blocks == fake_llm.TOTAL_BLOCKS and info.kv_block_size == 4
    assert load.total_kv_blocks == fake_llm.TOTAL_BLOCKS
    assert (load.running_requests, load.queued_requests, load.used_kv_blocks) == (0, 0, 0)


async def test_kv_events_are_published_without_partial_blocks() -> None:
    options = {"kv_cache_config": {"tokens_per_block": 4, "event_buffer_max_size": 32}}
    async with serving(trtllm(**options)) as running:
        subscription = running.stub.SubscribeKvEvents(pb.SubscribeKvEventsRequest())
        await collect(running.stub, request(PROMPT, stopping=STOP(max_tokens=6)))  # 8 + 6 tokens: 3 full blocks
        batch = (await asyncio.wait_for(subscription.read(), 5)).batch
        subscription.cancel()
    (event,) = batch.events
    assert len(event.block_stored.block_hashes) == 3 and event.block_stored.block_size == 4
    assert list(event.block_stored.token_ids) == (PROMPT + greedy(PROMPT, 6))[:12]
    assert all(h.encoding == "int64" and len(h.value) == 8 for h in event.block_stored.block_hashes)


async def test_prefill_and_decode_engines_hand_off_through_a_kv_session(fake: Installed) -> None:
    """TensorRT-LLM 1.2.1 finishes a context-only request at its handoff; its executor keeps the KV cache."""
    transceiver = {"cache_transceiver_config": {"backend": "UCX"}}
    async with (
        serving(trtllm(role="prefill", **transceiver)) as prefill,
        serving(trtllm(role="decode", **transceiver)) as decode,
    ):
        engine_info = await prefill.stub.GetEngineInfo(pb.GetEngineInfoRequest())
        ready = await collect(prefill.stub, request(PROMPT, stopping=STOP(max_tokens=5)))
        session = ready[-1].prefill_ready.kv_session
        load = await prefill.stub.GetLoad(pb.GetLoadRequest())
        aborted = await prefill.stub.Abort(pb.AbortRequest(kv_session=session))
        resumed = request(PROMPT, stopping=STOP(max_tokens=5), response=pb.ResponseOptions(return_output_logprobs=True))
        resumed.kv.session.CopyFrom(session)
        # what a later release's prefill adds, which 1.2's DisaggregatedParams does not take
        resumed.kv.session.attributes_struct.update({"ctx_dp_rank": 0, "schedule_style": 1})
        decoded = await collect(decode.stub, resumed)
    context_engine = fake.engines[0]
    assert context_engine.args.disable_overlap_scheduler, "forced: 1.2 refuses context-only requests under overlap"
    assert not engine_info.kv_connector.supports_abort_cleanup
    assert context_engine.submitted[-1].finished and not context_engine.submitted[-1].aborted()
    assert session.transfer_backend == "ucx" and session.attributes_struct["first_gen_tokens"]
    assert not load.HasField("active_kv_sessions") and aborted.status == pb.ABORT_STATUS_ALREADY_FINISHED
    records = [t for r in decoded if r.HasField("token") for t in r.token.tokens]
    assert [t.token_id for t in records] == greedy(PROMPT, 5)
    assert not records[0].HasField("logprob") and all(t.HasField("logprob") for t in records[1:])


async def test_a_prefill_engine_with_the_overlap_scheduler_on_is_refused_at_start() -> None:
    options = {"role": "prefill", "cache_transceiver_config": {"backend": "UCX"}}
    for value in (False, 0, "false", "Off"):
        with pytest.raises(ConfigurationError, match="disable_overlap_scheduler=true"):
            await trtllm(disable_overlap_scheduler=value, **options).start()


async def test_an_engine_without_a_tokenizer_takes_token_ids_only() -> None:
    async with serving(trtllm(skip_tokenizer_init=True)) as running:
        info = await running.stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))
        responses = await collect(running.stub, request(PROMPT, stopping=STOP(max_tokens=3)))
        code = await rejected(running, request("text"))
    assert not info.supports_text_input and token_ids(responses) == greedy(PROMPT, 3)
    assert code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("refusal", [ValueError, fake_llm.RequestError])
async def test_what_tensorrt_llm_refuses_at_submission_is_a_status(
    monkeypatch: pytest.MonkeyPatch, refusal: type[Exception]
) -> None:
    """A refused request is the caller's INVALID_ARGUMENT, never a retryable UNAVAILABLE."""
    monkeypatch.setattr(fake_llm.LLM, "refusal", refusal)
    async with serving(trtllm(max_num_tokens=4)) as running:
        code = await rejected(running, request(PROMPT, stopping=STOP(max_tokens=2)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


async def test_health_runs_a_real_token_and_a_stopped_engine_is_not_ready() -> None:
    backend = trtllm()
    async with serving(backend) as running:
        health = await running.stub.Health(pb.HealthRequest(include_inference_probe=True))
    assert health.state == pb.HEALTH_STATE_READY
    (check,) = await backend.check_health()
    assert check.state == pb.HEALTH_STATE_NOT_READY


async def test_bad_arguments_fail_the_start_naming_them() -> None:
    with pytest.raises(ConfigurationError, match="unknown LLM arguments: max_model_len"):
        await trtllm(max_model_len=5).start()
    with pytest.raises(ConfigurationError, match="needs cache_transceiver_config"):
        await trtllm(role="decode").start()
    with pytest.raises(ConfigurationError, match="rejected its arguments"):
        await trtllm(max_seq_len="many").start()


async def test_a_lora_config_tensorrt_llm_cannot_start_with_is_a_configuration_error(
    fake: Installed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``create_py_executor`` asserts ``lora_target_modules`` unless ``lora_dir`` names one adapter: refused
    before the model loads; any assertion TensorRT-LLM's start makes is a configuration error, explained."""
    with pytest.raises(ConfigurationError, match="lora_config needs lora_target_modules"):
        await trtllm(lora_config='{"max_loras": 4}').start()  # the command line's form
    assert fake.engines == []
    async with serving(trtllm(lora_config=LORA_CONFIG)) as running:
        info = await running.stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))
    assert info.supports_lora

    def asserting(self: fake_llm.LLM, model: str, **options: object) -> None:
        raise AssertionError("Expecting at least one lora target module")

    monkeypatch.setattr(fake_llm.LLM, "__init__", asserting)
    with pytest.raises(ConfigurationError, match=r"could not start with these arguments.*lora target module"):
        await trtllm(lora_config={"lora_dir": ["/a"]}).start()


async def test_an_adapter_whose_files_went_bad_never_reaches_a_1_2_worker(tmp_path: Path) -> None:
    """1.2.1 loads an adapter outside its ``RequestError`` wrapper: a failed load ends the worker
    (``executor/worker.py``), so the driver refuses it first and the engine serves on."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    async with serving(trtllm(lora_config=LORA_CONFIG)) as running:
        await running.stub.LoadLora(
            pb.LoadLoraRequest(adapter=pb.LoraAdapter(lora_id=3, lora_name="a", source_path=str(adapter)))
        )
        (adapter / "adapter_config.json").unlink()
        broken = await rejected(running, request(PROMPT, lora_name="a", stopping=STOP(max_tokens=2)))
        after = await collect(running.stub, request(PROMPT, stopping=STOP(max_tokens=2)))
        too_wide = tmp_path / "wide"
        too_wide.mkdir()
        (too_wide / "adapter_config.json").write_text('{"r": 128}')  # over lora_config's max_lora_rank (64)
        with pytest.raises(grpc.aio.AioRpcError) as wide:
            await running.stub.LoadLora(
                pb.LoadLoraRequest(adapter=pb.LoraAdapter(lora_id=4, lora_name="w", source_path=str(too_wide)))
            )
    assert broken == grpc.StatusCode.FAILED_PRECONDITION and token_ids(after) == greedy(PROMPT, 2)
    assert wide.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "rank 128" in wide.value.details()


@pytest.mark.parametrize("version", ["1.2.0", "1.3.0rc28", "1.4.0rc1", "2.0.0"])
async def test_a_tensorrt_llm_release_the_driver_was_not_written_against_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    installed = install(monkeypatch, versioned=version)
    with pytest.raises(ConfigurationError, match=f"TensorRT-LLM {version} is not served.*1.3 from 1.3.0rc29"):
        await trtllm().start()
    assert installed.engines == []


@pytest.mark.parametrize("order", ["final", "handoff_first", "finish_first"])
@pytest.mark.parametrize("version", ["1.2.1", "1.3.0rc29"])
async def test_a_prefill_never_aborts_its_handed_off_request_whichever_comes_first(
    monkeypatch: pytest.MonkeyPatch, order: str, version: str
) -> None:
    """The handoff may come before the result is final, or the finish reason before the handoff
    (``grpc/openengine/streaming.py``'s pending-handoff path): the stream ends at ``PrefillReady`` and the
    driver reads the request on until TensorRT-LLM reports it final; aborting it would cancel the KV
    transfer. 1.3 hands the first token's logprobs over too."""
    installed = install(monkeypatch, version=version)
    monkeypatch.setattr(fake_llm, "HANDOFF_ORDER", order)
    transceiver = {"cache_transceiver_config": {"backend": "UCX"}}
    wanted = pb.ResponseOptions(return_output_logprobs=True)
    async with (
        serving(trtllm(role="prefill", **transceiver)) as prefill,
        serving(trtllm(role="decode", **transceiver)) as decode,
    ):
        ready = await collect(prefill.stub, request(PROMPT, stopping=STOP(max_tokens=5), response=wanted))
        context = installed.engines[0].submitted[-1]
        resumed = request(PROMPT, stopping=STOP(max_tokens=5), response=wanted)
        resumed.kv.session.CopyFrom(ready[-1].prefill_ready.kv_session)
        decoded = await collect(decode.stub, resumed)
        for _ in range(100):
            if context.finished:
                break
            await asyncio.sleep(0.01)
    records = [t for r in decoded if r.HasField("token") for t in r.token.tokens]
    assert [t.token_id for t in records] == greedy(PROMPT, 5)
    assert context.finished and not context.aborted()
    assert records[0].HasField("logprob") == (version != "1.2.1")


async def test_a_1_2_worker_that_died_makes_the_engine_unavailable_and_not_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What 1.2.1's worker raises outside its ``RequestError`` wrapper ends it (``executor/worker.py``): that
    request fails, every later submission raises the worker's error, and health says so."""

    def dying(self: fake_llm.RequestOutput, llm: fake_llm.LLM) -> None:
        llm.worker_failed(ValueError("an adapter the driver could not check"))

    async with serving(trtllm()) as running:
        monkeypatch.setattr(fake_llm.RequestOutput, "_first_step", dying)
        failed = await collect(running.stub, request(PROMPT, stopping=STOP(max_tokens=2)))
        after = await rejected(running, request(PROMPT, stopping=STOP(max_tokens=2)))
        health = await running.stub.Health(pb.HealthRequest())
    assert failed[-1].error.code == pb.ERROR_CODE_INTERNAL and "an adapter" in failed[-1].error.message
    assert after == grpc.StatusCode.UNAVAILABLE
    assert health.state == pb.HEALTH_STATE_NOT_READY
