"""Discovery, rejection before acceptance, abort, cancellation, health and load on real vLLM."""

from __future__ import annotations

import asyncio
import os
import stat

import grpc
import pytest

pytest.importorskip("vllm")

from openengine_gateway import pb
from openengine_gateway.testing import RunningGateway

from tests.engines.streams import MODEL, generate_request
from tests.responses import collect, finished, tokens

from .conftest import CONTEXT, LONG
from .reference import Reference

pytestmark = pytest.mark.vllm


async def test_discovery_reports_the_started_engine(gateway: RunningGateway, stub: pb.OpenEngineStub) -> None:
    engine = await stub.GetEngineInfo(pb.GetEngineInfoRequest())
    assert (engine.engine_name, engine.engine_version) == ("vllm", "0.32.0")
    assert engine.role == pb.ENGINE_ROLE_AGGREGATED and engine.parallelism.data_parallel_size == 1
    info = await stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))
    assert info.max_context_length == CONTEXT and info.kv_block_size == 32
    assert info.total_kv_blocks > 0 and info.max_running_requests > 0 and info.max_batched_tokens > 0
    assert info.HasField("supports_lora") and not info.supports_lora, "test_lora runs a LoRA-enabled engine"
    assert info.generation.supports_priority
    assert pb.GUIDED_DECODING_MODE_JSON_OBJECT in info.generation.guided_decoding.modes
    assert pb.CANDIDATE_TOKEN_SELECTION_MODE_ALL in info.generation.output_logprobs.candidate_selection_modes
    prompt_modes = info.generation.prompt_logprobs.candidate_selection_modes
    v2 = engine_backend(gateway)._engine.vllm_config.use_v2_model_runner  # type: ignore[attr-defined]
    assert (pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS in prompt_modes) == v2, "runner V2 (GPU) only"
    output_modes = info.generation.output_logprobs.candidate_selection_modes
    assert (pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS in output_modes) == v2, "runner V2 only: see the next test"
    assert info.HasField("supports_multimodal") and not info.supports_multimodal
    assert not info.HasField("tasks"), "a generate-runner engine serves no pooling task"


async def test_top_candidates_stay_right_beside_a_request_for_explicit_ids(stub: pb.OpenEngineStub) -> None:
    """Why runner V1 advertises no explicit output candidate ids: its sampler answers every request
    of a batch with the explicit-id rows once one asks for them (vLLM's ``Sampler.forward``), so a
    top-N request batched with one got its sampled token and -inf padding instead of its top N."""

    def request(request_id: str, selection: pb.CandidateTokenSelection) -> pb.GenerateRequest:
        return generate_request(
            request_id,
            prompt=[1, 50, 60, 70],
            sampling=pb.SamplingParams(temperature=0.0),
            stopping=pb.StoppingOptions(max_tokens=24, ignore_eos=True),
            response=pb.ResponseOptions(output_candidates=selection),
        )

    def candidates(responses: list[pb.GenerateResponse]) -> list[list[tuple[int, int]]]:
        return [[(c.token_id, c.rank) for c in token.candidates] for token in tokens(responses)]

    alone = candidates(await collect(stub, request("top-alone", pb.CandidateTokenSelection(top_n=3))))
    ids = pb.CandidateTokenSelection(token_ids=pb.TokenIds(ids=[7, 300]))
    beside = collect(stub, request("top-beside", pb.CandidateTokenSelection(top_n=3)))
    results = await asyncio.gather(beside, collect(stub, request("ids", ids)), return_exceptions=True)
    assert candidates(results[0]) == alone  # type: ignore[arg-type]
    info = await stub.GetModelInfo(pb.GetModelInfoRequest(model=MODEL))
    if pb.CANDIDATE_TOKEN_SELECTION_MODE_TOKEN_IDS not in info.generation.output_logprobs.candidate_selection_modes:
        assert isinstance(results[1], grpc.aio.AioRpcError)
        assert results[1].code() == grpc.StatusCode.INVALID_ARGUMENT


async def expect_status(call: object, code: grpc.StatusCode, match: str = "") -> None:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call  # type: ignore[misc]
    assert error.value.code() == code, error.value.details()
    assert match in (error.value.details() or "")


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"prompt": "x" * (CONTEXT + 88)}, "context"),  # a token per x
        ({"prompt": [0, 1, 2], "stopping": pb.StoppingOptions(max_tokens=CONTEXT - 2)}, "exceeds the context"),
        ({"prompt": [0, 9999]}, "vocabulary"),
        ({"prompt": "hi", "guided": pb.GuidedDecoding(regex="a", backend="outlines")}, "per engine"),
        ({"prompt": "hi", "sampling": pb.SamplingParams(temperature=0.0, num_sequences=2)}, "temperature"),
        (
            {
                "prompt": "hi",
                "response": pb.ResponseOptions(
                    prompt_candidates=pb.CandidateTokenSelection(token_ids=pb.TokenIds(ids=[3]))
                ),
            },
            "token_ids",
        ),
        ({"prompt": "hi", "media": [pb.MediaItem(url="https://example.invalid/a.png")]}, "multimodal"),
        ({"prompt": "hi", "lora_name": "missing"}, ""),
    ],
    ids=["prompt-too-long", "budget", "vocab", "backend", "greedy-n", "prompt-ids", "media", "lora"],
)
async def test_what_the_engine_cannot_take_is_rejected_before_acceptance(
    gateway: RunningGateway, stub: pb.OpenEngineStub, fields: dict[str, object], match: str
) -> None:
    fields = dict(fields)
    if "response" in fields and engine_backend(gateway)._engine.vllm_config.use_v2_model_runner:  # type: ignore[attr-defined]
        pytest.skip("model runner V2 scores prompt candidate ids")
    prompt = fields.pop("prompt")
    request = generate_request("rejected", prompt=prompt, **fields)  # type: ignore[arg-type]
    code = grpc.StatusCode.FAILED_PRECONDITION if "lora_name" in fields else grpc.StatusCode.INVALID_ARGUMENT
    await expect_status(collect(stub, request), code, match)


async def wait_for(predicate: object, within: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await predicate():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def engine_backend(gateway: RunningGateway) -> object:
    """The driver behind the session's gateway."""
    return next(iter(gateway.gateway.engines)).backend


def engine_requests(gateway: RunningGateway) -> int:
    """Requests vLLM's frontend still tracks."""
    return int(engine_backend(gateway)._engine.get_num_unfinished_requests())  # type: ignore[attr-defined]


async def test_the_engine_s_socket_files_are_in_a_directory_of_its_own(gateway: RunningGateway) -> None:
    """So that ``stop`` can remove them: vLLM itself leaves them in /tmp."""
    directory = engine_backend(gateway)._sockets.name  # type: ignore[attr-defined]
    assert os.path.basename(directory).startswith("oe-vllm-")
    assert any(stat.S_ISSOCK(entry.stat().st_mode) for entry in os.scandir(directory))


async def test_abort_reaches_the_engine(gateway: RunningGateway, stub: pb.OpenEngineStub) -> None:
    call = stub.Generate(generate_request("to-abort", prompt="hello", stopping=LONG))
    responses = [await call.read()]
    assert engine_requests(gateway) == 1
    assert (await stub.Abort(pb.AbortRequest(request_id="to-abort"))).status == pb.ABORT_STATUS_ABORTED
    while (response := await call.read()) is not grpc.aio.EOF:
        responses.append(response)
    assert finished(responses)[0].reason == pb.FINISH_REASON_CANCELLED
    assert len(tokens(responses)) < LONG.max_tokens

    async def drained() -> bool:
        return engine_requests(gateway) == 0

    await wait_for(drained)


async def test_an_abort_before_the_first_output_still_counts_the_prompt(
    gateway: RunningGateway, reference: Reference
) -> None:
    prompt = reference.encode("count me " * 40)
    stopping = pb.StoppingOptions(max_tokens=100, ignore_eos=True)
    call = gateway.stub.Generate(generate_request("early-abort", prompt=prompt, stopping=stopping))
    registry = gateway.gateway.registry
    async with asyncio.timeout(10):
        while registry.get("early-abort") is None:
            await registry.wait_changed(None)
    await asyncio.sleep(0)  # the driver's first step: it hands the request to vLLM, whose output takes far longer
    aborted = await gateway.gateway.lifecycle.abort(pb.AbortRequest(request_id="early-abort"))
    assert aborted.status == pb.ABORT_STATUS_ABORTED
    responses = [response async for response in call]
    assert not tokens(responses), "aborted before vLLM's first output"
    assert finished(responses)[0].reason == pb.FINISH_REASON_CANCELLED
    usage = responses[-1].usage
    assert usage.prompt_tokens == usage.total_tokens == len(prompt)


async def test_client_cancellation_reaches_the_engine(gateway: RunningGateway, stub: pb.OpenEngineStub) -> None:
    call = stub.Generate(generate_request("to-cancel", prompt="hello", stopping=LONG))
    await call.read()
    assert engine_requests(gateway) == 1
    call.cancel()

    async def drained() -> bool:
        return engine_requests(gateway) == 0

    await wait_for(drained)


async def test_load_counts_running_requests_and_kv_blocks(stub: pb.OpenEngineStub) -> None:
    call = stub.Generate(generate_request("loaded", prompt="hello " * 40, stopping=LONG))
    await call.read()

    async def busy() -> bool:
        load = await stub.GetLoad(pb.GetLoadRequest(include_per_rank=True))
        return load.running_requests == 1 and load.used_kv_blocks >= 1

    await wait_for(busy)
    load = await stub.GetLoad(pb.GetLoadRequest(include_per_rank=True))
    assert load.ranks[0].data_parallel_rank == 0 and load.ranks[0].total_kv_blocks == load.total_kv_blocks
    call.cancel()

    async def idle() -> bool:
        load = await stub.GetLoad(pb.GetLoadRequest())
        return load.running_requests == 0 and load.queued_requests == 0

    await wait_for(idle)


def test_only_the_gateways_stat_logger_runs(gateway: RunningGateway) -> None:
    """vLLM's Prometheus and logging stat loggers are dropped: nothing reads them, and they cost CPU per token
    (the load test above proves the gateway's own still gets every scheduler snapshot)."""
    manager = engine_backend(gateway)._engine.logger_manager  # type: ignore[attr-defined]
    assert [type(logger).__name__ for logger in manager.stat_loggers] == ["LatestSchedulerStats"]


async def test_health_with_an_inference_probe(stub: pb.OpenEngineStub) -> None:
    health = await stub.Health(pb.HealthRequest(include_inference_probe=True, role=pb.ENGINE_ROLE_AGGREGATED))
    assert health.state == pb.HEALTH_STATE_READY
    assert {c.name: c.state for c in health.checks}["inference_probe"] == pb.HEALTH_STATE_READY


async def test_an_abort_after_the_end_is_already_finished(stub: pb.OpenEngineStub) -> None:
    await collect(stub, generate_request("short", prompt="hi", stopping=pb.StoppingOptions(max_tokens=1)))
    assert (await stub.Abort(pb.AbortRequest(request_id="short"))).status == pb.ABORT_STATUS_ALREADY_FINISHED


def test_command_line_strings_become_engine_arguments() -> None:
    from openengine_backends.vllm import VllmSettings
    from openengine_backends.vllm.engine_args import engine_kwargs
    from openengine_gateway.cli import parse_driver_flags
    from openengine_gateway.errors import ConfigurationError

    flags = ["--max-model-len", "512", "--enforce-eager", "--dtype", "float32", "--max-logprobs", "-1"]
    flags += ["--enable-prefix-caching", "false", "--kv-events-config", '{"enable_kv_cache_events": true}']
    settings = VllmSettings(model="/m", **parse_driver_flags(flags))
    kwargs = engine_kwargs(settings.engine_options)
    assert kwargs["max_model_len"] == 512 and kwargs["max_logprobs"] == -1 and kwargs["dtype"] == "float32"
    assert kwargs["enforce_eager"] is True and kwargs["enable_prefix_caching"] is False
    assert kwargs["kv_events_config"].enable_kv_cache_events is True
    with pytest.raises(ConfigurationError, match="unknown engine arguments: max_modle_len"):
        engine_kwargs({"max_modle_len": "512"})
    with pytest.raises(ConfigurationError, match="enforce_eager takes true or false"):
        engine_kwargs({"enforce_eager": "maybe"})
    with pytest.raises(ConfigurationError, match="max_num_seqs"):
        engine_kwargs({"max_num_seqs": "many"})
