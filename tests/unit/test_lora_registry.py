"""``core.lora.LoraRegistry`` and ``contract.lora``: the adapter lifecycle rules of the contract."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from openengine_gateway import pb
from openengine_gateway.contract.lora import adapter_to_proto
from openengine_gateway.core.lora import LoraRegistry
from openengine_gateway.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied, RequestError
from openengine_gateway.spi import LoraAdapter


@pytest.fixture
def adapters(tmp_path: Path) -> Path:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    (tmp_path / "file").write_text("x")
    return Path(os.path.realpath(tmp_path))  # registered paths are resolved


def load(registry: LoraRegistry, lora_id: int, name: str, path: str | Path) -> tuple[LoraAdapter, bool]:
    adapter, already = registry.resolve(pb.LoraAdapter(lora_id=lora_id, lora_name=name, source_path=str(path)))
    if not already:
        registry.add(adapter)
    return adapter, already


@pytest.mark.parametrize(
    ("lora_id", "name", "path", "kind", "match"),
    [
        (0, "x", "{root}/a", InvalidArgument, "lora_id must be positive"),
        (-1, "x", "{root}/a", InvalidArgument, "lora_id must be positive"),
        (1, "", "{root}/a", InvalidArgument, "lora_name"),
        (1, "x", "", InvalidArgument, "absolute"),
        (1, "x", "a", InvalidArgument, "absolute"),
        (1, "x", "{root}/a\0", InvalidArgument, "absolute"),  # os.path.realpath would raise ValueError
        (1, "x", "{root}/missing", InvalidArgument, "not a directory"),
        (1, "x", "{root}/file", InvalidArgument, "not a directory"),
        (1, "x", "{root}/" + "n" * 300, InvalidArgument, "not a directory"),  # is_dir raises ENAMETOOLONG
    ],
)
def test_load_rejections(
    adapters: Path, lora_id: int, name: str, path: str, kind: type[RequestError], match: str
) -> None:
    with pytest.raises(kind, match=match):
        LoraRegistry().resolve(pb.LoraAdapter(lora_id=lora_id, lora_name=name, source_path=path.format(root=adapters)))


def test_load_and_get(adapters: Path) -> None:
    registry = LoraRegistry()
    adapter, already = load(registry, 1, "a", adapters / "a")
    assert not already
    assert adapter == LoraAdapter(1, "a", str(adapters / "a"))
    assert registry.get("a") == adapter
    assert adapter_to_proto(adapter) == pb.LoraAdapter(lora_id=1, lora_name="a", source_path=str(adapters / "a"))


def test_symlinks_are_resolved(adapters: Path) -> None:
    (adapters / "link").symlink_to(adapters / "a")
    registry = LoraRegistry()
    adapter, _ = load(registry, 1, "a", adapters / "link")
    assert adapter.source_path == os.path.realpath(adapters / "a")
    # The same adapter through another spelling of the same directory is still idempotent.
    assert load(registry, 1, "a", f"{adapters}/b/../a") == (adapter, True)


def test_reload_is_idempotent(adapters: Path) -> None:
    registry = LoraRegistry()
    first, _ = load(registry, 1, "a", adapters / "a")
    again, already = load(registry, 1, "a", adapters / "a")
    assert already and again == first
    assert registry.adapters() == [first]


@pytest.mark.parametrize(
    ("lora_id", "name", "directory", "match"),
    [
        (2, "a", "a", "different adapter is loaded as 'a'"),  # same name, other id
        (1, "a", "b", "different adapter is loaded as 'a'"),  # same name, other path
        (1, "z", "b", "lora_id 1 is in use"),  # same id, other name
        (2, "z", "a", "source_path is already loaded"),  # same path, other name
    ],
)
def test_conflicts_are_already_exists(adapters: Path, lora_id: int, name: str, directory: str, match: str) -> None:
    registry = LoraRegistry()
    load(registry, 1, "a", adapters / "a")
    with pytest.raises(AlreadyExists, match=match):
        registry.resolve(pb.LoraAdapter(lora_id=lora_id, lora_name=name, source_path=str(adapters / directory)))


def test_allowed_roots(adapters: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (adapters / "escape").symlink_to(outside)
    registry = LoraRegistry([str(adapters)])
    assert load(registry, 1, "a", adapters / "a")[0].source_path == str(adapters / "a")
    with pytest.raises(PermissionDenied):
        registry.resolve(pb.LoraAdapter(lora_id=2, lora_name="o", source_path=str(outside)))
    with pytest.raises(PermissionDenied):  # a symlink cannot lead out of the allowed roots
        registry.resolve(pb.LoraAdapter(lora_id=2, lora_name="o", source_path=str(adapters / "escape")))


def test_unknown_adapter_is_not_found(adapters: Path) -> None:
    registry = LoraRegistry()
    with pytest.raises(NotFound, match="'nope'"):
        registry.get("nope")
    with pytest.raises(NotFound):
        registry.remove("nope")


def test_remove_frees_name_id_and_path(adapters: Path) -> None:
    registry = LoraRegistry()
    adapter, _ = load(registry, 1, "a", adapters / "a")
    assert registry.remove("a") == adapter
    assert registry.adapters() == []
    assert load(registry, 1, "other", adapters / "a")[1] is False


def test_seed_and_load_order(adapters: Path) -> None:
    registry = LoraRegistry()
    seeded = LoraAdapter(5, "boot", str(adapters / "b"))
    registry.seed([seeded])
    added, _ = load(registry, 1, "a", adapters / "a")
    assert registry.adapters() == [seeded, added]
    with pytest.raises(AlreadyExists):
        registry.resolve(pb.LoraAdapter(lora_id=5, lora_name="x", source_path=str(adapters / "a")))


def test_an_adapter_the_engine_started_with_reloads_idempotently(adapters: Path) -> None:
    """Seeded paths are normalized as requested ones are: the engine's spelling may differ."""
    (adapters / "link").symlink_to(adapters / "a")
    registry = LoraRegistry()
    registry.seed([LoraAdapter(5, "boot", f"{adapters}/link/"), LoraAdapter(6, "rel", "relative/dir")])
    assert registry.adapters()[0].source_path == str(adapters / "a")
    assert registry.adapters()[1].source_path == "relative/dir"  # kept as the engine reported it
    for spelling in (adapters / "a", f"{adapters}/a/", adapters / "link"):
        assert load(registry, 5, "boot", spelling) == (LoraAdapter(5, "boot", str(adapters / "a")), True)


def test_another_hosts_paths_are_normalized_not_checked(adapters: Path) -> None:
    """An engine on another host checks its own paths: here they need only be absolute."""
    registry = LoraRegistry()
    adapter, already = registry.resolve(
        pb.LoraAdapter(lora_id=1, lora_name="r", source_path="/remote//only/x/../adapter/"), local=False
    )
    assert adapter == LoraAdapter(1, "r", "/remote/only/adapter") and not already
    registry.add(adapter)
    same = pb.LoraAdapter(lora_id=1, lora_name="r", source_path="/remote/only/adapter")
    assert registry.resolve(same, local=False) == (adapter, True)
    with pytest.raises(InvalidArgument, match="absolute"):
        registry.resolve(pb.LoraAdapter(lora_id=2, lora_name="s", source_path="remote/adapter"), local=False)
    registry.seed([LoraAdapter(3, "boot", "/remote/boot/")], local=False)
    assert registry.get("boot").source_path == "/remote/boot"
