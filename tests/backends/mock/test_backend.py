"""Settings, advertised capabilities, health, fault injection, and the LoRA registry."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pydantic
import pytest
from openengine_backends.mock import MockBackend, MockSettings
from openengine_backends.mock.capabilities import model_info
from openengine_backends.mock.tokenizer import TOKENIZER_ID
from openengine_gateway import __version__, pb
from openengine_gateway.contract.capabilities import check_model_info
from openengine_gateway.contract.kv_wire import kv_event_to_proto
from openengine_gateway.errors import EngineFailure, InvalidArgument, NotFound, ResourceExhausted, Unavailable
from openengine_gateway.spi import LoraAdapter, Sampling, Stopping

from .support import engine, generate, request


def test_settings_defaults_and_validation() -> None:
    settings = MockSettings()
    assert (settings.model, settings.role, settings.prefill_time_per_token_s) == ("mock-model", "aggregated", 0.0)
    with pytest.raises(pydantic.ValidationError, match="max_context_length"):
        MockSettings(total_kv_blocks=2, kv_block_size=4)
    with pytest.raises(pydantic.ValidationError, match="enable at least one"):
        MockSettings(enable_text_input=False, enable_token_ids_input=False)
    with pytest.raises(pydantic.ValidationError, match=r"unknown_option|extra"):
        MockSettings(unknown_option=1)  # type: ignore[call-arg]
    flags = MockSettings.model_validate(
        {"max_running_requests": "8", "guided_decoding_modes": "", "classify_labels": "a,b"}
    )
    assert (flags.max_running_requests, flags.guided_decoding_modes, flags.classify_labels) == (8, (), ("a", "b"))
    with pytest.raises(pydantic.ValidationError):
        MockSettings(guided_decoding_modes=("json_schema",))  # type: ignore[arg-type]


def test_the_plugin_entry_point_and_exports() -> None:
    import importlib
    import importlib.metadata
    import pkgutil

    import openengine_backends.mock as package

    (entry,) = importlib.metadata.entry_points(group="openengine.backends", name="mock")
    assert entry.load() is MockBackend and MockBackend.name == "mock" and MockBackend.Settings is MockSettings
    assert package.__all__ == ["MockBackend", "MockSettings"]
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        assert module.__all__ and all(hasattr(module, name) for name in module.__all__), info.name


async def test_facts_advertise_what_the_settings_enable() -> None:
    backend = MockBackend(MockSettings(role="decode", data_parallel_size=2))
    facts = await backend.start()
    await backend.stop()
    assert (facts.engine_name, facts.engine_version, facts.role) == ("mock", __version__, pb.ENGINE_ROLE_DECODE)
    assert facts.publishes_kv_events and facts.publishes_runtime_events and facts.lora_adapters == ()
    assert facts.parallelism.data_parallel_size == 2 and facts.parallelism.tensor_parallel_size == 1
    assert facts.kv_connector is not None and facts.kv_connector.supports_remote_prefill
    assert facts.tokenizer_id is not None and facts.tokenizer_id == TOKENIZER_ID
    info = facts.model
    check_model_info(info)
    assert info.total_kv_blocks == 2048 and info.max_running_requests == 128
    generation = info.generation
    assert list(generation.guided_decoding.modes) == [pb.GUIDED_DECODING_MODE_REGEX, pb.GUIDED_DECODING_MODE_CHOICE]
    assert len(generation.output_logprobs.candidate_selection_modes) == 3 and generation.output_logprobs.max_top_n == 20
    assert info.supports_lora and not info.supports_multimodal and info.HasField("supports_multimodal")
    assert info.tasks.embed.dimension == 64 and info.tasks.score.supports_label_token_scoring


def test_everything_can_be_switched_off() -> None:
    info = model_info(
        MockSettings(
            enable_token_ids_input=False,
            enable_output_logprobs=False,
            enable_prompt_logprobs=False,
            guided_decoding_modes=(),
            enable_priority=False,
            enable_stop_in_output=False,
            enable_cache_salt=False,
            enable_prefix_cache_bypass=False,
            enable_lora=False,
            enable_embed=False,
            enable_classify=False,
            enable_score=False,
        )
    )
    check_model_info(info)
    generation = info.generation
    for field in (
        "supports_priority",
        "supports_stop_in_output",
        "supports_cache_salt",
        "supports_prefix_cache_bypass",
    ):
        assert generation.HasField(field) and not getattr(generation, field)
    for caps in (generation.output_logprobs, generation.prompt_logprobs, generation.guided_decoding):
        assert caps.HasField("supported") and not caps.supported
    assert info.HasField("supports_token_ids_input") and not info.supports_token_ids_input
    assert info.HasField("supports_lora") and not info.supports_lora
    for task in (info.tasks.embed, info.tasks.classify, info.tasks.score):
        assert task.HasField("supported") and not task.supported
    multimodal = model_info(MockSettings(enable_multimodal=True))
    check_model_info(multimodal)
    assert pb.TASK_INPUT_TYPE_MULTIMODAL in multimodal.tasks.embed.input_types and multimodal.tasks.embed.modalities


async def test_fail_ends_every_request_and_restart_recovers() -> None:
    async with engine(decode_time_per_step_s=0.01) as backend:
        events = backend.kv_events()
        streams = [backend.generate(request(stopping=Stopping(max_tokens=200, ignore_eos=True))) for _ in range(3)]
        await asyncio.sleep(0.03)
        backend.fail("injected crash")
        for stream in streams:
            with pytest.raises(EngineFailure) as failure:
                async for _ in stream:
                    pass
            assert failure.value.code == pb.ERROR_CODE_INTERNAL and failure.value.retryable
        (scheduler, *_) = await backend.check_health()
        assert scheduler.state == pb.HEALTH_STATE_NOT_READY and "injected crash" in scheduler.message
        with pytest.raises(Unavailable):
            backend.generate(request())
        assert (await backend.load()).used_kv_blocks == 0
        backend.restart()
        assert all(c.state == pb.HEALTH_STATE_READY for c in await backend.check_health())
        result = await generate(backend, stopping=Stopping(max_tokens=2))
        assert result.usage is not None and result.usage.cached_prompt_tokens == 0
        kinds = []
        while not kinds or kinds[-1] != "all_blocks_cleared":
            kinds.extend(kv_event_to_proto(e).WhichOneof("event") for e in (await anext(events)).events)


async def test_a_crashed_scheduler_loop_is_reported() -> None:
    async with engine() as backend:
        core = backend.cores[0]

        def broken(work: object) -> None:
            raise ValueError("boom")

        core._execute = broken  # type: ignore[method-assign]
        with pytest.raises(EngineFailure, match="boom"):
            await generate(backend)
        (scheduler, *_) = await backend.check_health()
    assert scheduler.state == pb.HEALTH_STATE_NOT_READY and "crashed" in scheduler.message


async def test_prefill_health_includes_the_transfer_server() -> None:
    async with engine(role="prefill") as backend:
        names = {check.name: check.state for check in await backend.check_health()}
    assert names == {
        "scheduler": pb.HEALTH_STATE_READY,
        "model": pb.HEALTH_STATE_READY,
        "kv_connector": pb.HEALTH_STATE_READY,
    }


async def test_lora_registry(tmp_path: Path) -> None:
    async with engine(max_loras=2) as backend:
        base = await generate(
            backend, sampling=Sampling(temperature=0.0), stopping=Stopping(max_tokens=20, ignore_eos=True)
        )
        await backend.load_lora(LoraAdapter(1, "one", str(tmp_path)))
        await backend.load_lora(LoraAdapter(2, "two", str(tmp_path / ".")))
        with pytest.raises(ResourceExhausted):
            await backend.load_lora(LoraAdapter(3, "three", str(tmp_path)))
        with pytest.raises(InvalidArgument, match="not a directory"):
            await backend.load_lora(LoraAdapter(4, "four", str(tmp_path / "missing")))
        adapted = await generate(
            backend,
            lora_name="one",
            sampling=Sampling(temperature=0.0),
            stopping=Stopping(max_tokens=20, ignore_eos=True),
        )
        assert adapted.tokens != base.tokens
        await backend.unload_lora(LoraAdapter(1, "one", str(tmp_path)))
        with pytest.raises(NotFound):
            await generate(backend, lora_name="one")
        with pytest.raises(NotFound):
            await backend.unload_lora(LoraAdapter(1, "one", str(tmp_path)))
        await backend.load_lora(LoraAdapter(3, "three", str(tmp_path)))


async def test_multimodal_media_changes_the_prompt() -> None:
    from openengine_gateway.spi import Media

    image = Media(pb.MODALITY_IMAGE, raw_bytes=b"pixels")
    async with engine(enable_multimodal=True) as backend:
        with_media = await generate(backend, media=(image,), stopping=Stopping(max_tokens=1))
        without = await generate(backend, stopping=Stopping(max_tokens=1))
    assert with_media.usage is not None and without.usage is not None
    assert with_media.usage.prompt_tokens == without.usage.prompt_tokens + 8
