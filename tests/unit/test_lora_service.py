"""``core.lora.LoraService``: adapter lifecycle calls over every LoRA-capable engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from openengine_gateway import pb
from openengine_gateway.core.lora import LoraRegistry, LoraService
from openengine_gateway.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from openengine_gateway.spi import LoraAdapter

from tests.fakes import FakeBackend, engine_set

LORA = pb.ModelInfo(supports_lora=True)


@pytest.fixture
def adapter_dir(tmp_path: Path) -> str:
    (tmp_path / "a").mkdir()
    return str((tmp_path / "a").resolve())


def request(path: str, lora_id: int = 1, name: str = "a") -> pb.LoadLoraRequest:
    return pb.LoadLoraRequest(adapter=pb.LoraAdapter(lora_id=lora_id, lora_name=name, source_path=path))


@pytest.mark.parametrize("model", [pb.ModelInfo(), pb.ModelInfo(supports_lora=False)])
async def test_lora_disabled_is_failed_precondition(model: pb.ModelInfo, adapter_dir: str) -> None:
    lora = LoraService(engine_set(FakeBackend(model=model)), LoraRegistry())
    with pytest.raises(FailedPrecondition, match="LoRA is not enabled"):
        await lora.load(request(adapter_dir))
    with pytest.raises(FailedPrecondition):
        await lora.unload(pb.UnloadLoraRequest(lora_name="a"))
    with pytest.raises(FailedPrecondition):
        lora.list(pb.ListLorasRequest())


async def test_load_reaches_every_lora_engine_once(adapter_dir: str) -> None:
    first, second, plain = FakeBackend(model=LORA), FakeBackend(model=LORA), FakeBackend()
    lora = LoraService(engine_set((first, "a"), (second, "b"), (plain, "c")), LoraRegistry())
    response = await lora.load(request(adapter_dir))
    expected = LoraAdapter(1, "a", adapter_dir)
    assert not response.already_loaded
    assert response.adapter == pb.LoraAdapter(lora_id=1, lora_name="a", source_path=adapter_dir)
    assert first.loaded_loras == second.loaded_loras == [expected] and plain.loaded_loras == []
    again = await lora.load(request(adapter_dir))
    assert again.already_loaded and first.loaded_loras == [expected]
    assert lora.list(pb.ListLorasRequest()).adapters == [response.adapter]


async def test_load_validation(adapter_dir: str) -> None:
    lora = LoraService(engine_set(FakeBackend(model=LORA)), LoraRegistry())
    with pytest.raises(InvalidArgument, match="adapter is required"):
        await lora.load(pb.LoadLoraRequest())
    with pytest.raises(InvalidArgument, match="lora_id"):
        await lora.load(request(adapter_dir, lora_id=0))
    await lora.load(request(adapter_dir))
    with pytest.raises(AlreadyExists):
        await lora.load(request(adapter_dir, lora_id=2, name="b"))


async def test_failed_engine_load_is_not_registered(adapter_dir: str) -> None:
    backend = FakeBackend(model=LORA)

    async def fail(_adapter: LoraAdapter) -> None:
        raise RuntimeError("bad adapter weights")

    backend.load_lora = fail  # type: ignore[method-assign]
    lora = LoraService(engine_set(backend), LoraRegistry())
    with pytest.raises(Unavailable, match="backend 'fake' broke the backend SPI: load_lora raised RuntimeError: bad"):
        await lora.load(request(adapter_dir))  # the driver's mistake: retryable, naming it, never INTERNAL
    assert lora.list(pb.ListLorasRequest()).adapters == []


async def test_unload(adapter_dir: str) -> None:
    backend = FakeBackend(model=LORA)
    lora = LoraService(engine_set(backend), LoraRegistry())
    loaded = (await lora.load(request(adapter_dir))).adapter
    with pytest.raises(InvalidArgument, match="lora_name is required"):
        await lora.unload(pb.UnloadLoraRequest())
    with pytest.raises(NotFound, match="'b'"):
        await lora.unload(pb.UnloadLoraRequest(lora_name="b"))
    response = await lora.unload(pb.UnloadLoraRequest(lora_name="a"))
    assert response.adapter == loaded
    assert backend.unloaded_loras == [LoraAdapter(1, "a", adapter_dir)]
    assert lora.list(pb.ListLorasRequest()).adapters == []
    with pytest.raises(NotFound):
        await lora.unload(pb.UnloadLoraRequest(lora_name="a"))


async def test_adapters_an_engine_started_with_are_listed() -> None:
    boot = LoraAdapter(3, "boot", "/srv/adapters/boot")
    lora = LoraService(engine_set(FakeBackend(model=LORA, lora_adapters=[boot])), LoraRegistry())
    assert [a.lora_name for a in lora.list(pb.ListLorasRequest()).adapters] == ["boot"]


async def test_a_remote_engines_paths_are_left_to_it() -> None:
    """Only an engine that reads this host's files has its adapter paths checked here."""
    remote = FakeBackend(model=LORA, shares_filesystem=False)
    lora = LoraService(engine_set(remote), LoraRegistry())
    response = await lora.load(request("/on/the/remote/host/adapter/"))
    assert response.adapter.source_path == "/on/the/remote/host/adapter"
    assert remote.loaded_loras == [LoraAdapter(1, "a", "/on/the/remote/host/adapter")]
    local = LoraService(engine_set((FakeBackend(model=LORA), "x"), (remote, "y")), LoraRegistry())
    with pytest.raises(InvalidArgument, match="not a directory visible"):
        await local.load(request("/on/the/remote/host/adapter"))
