"""Server reflection, ``grpc.reflection.v1`` and ``v1alpha``, over both OpenEngine layouts' descriptor pools.

grpcio-reflection serves only ``v1alpha`` and reads one pool; newer tools (grpcurl) ask ``v1`` first, and
the later layout's files live in a pool of their own (``pb_later.POOL``). ``v1``'s messages are ``v1alpha``'s
under another package name, the same on the wire, so one servicer answers both. A file is found by name
in whichever pool has it (the layouts' file names differ); a symbol in the default pool first, so a message
name both layouts define describes the seed's, and a service name describes its own layout's files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from grpc_reflection.v1alpha import reflection, reflection_pb2

from .. import pb_later

V1_SERVICE_NAME = "grpc.reflection.v1.ServerReflection"
V1ALPHA_SERVICE_NAME: str = reflection.SERVICE_NAME
T = TypeVar("T")


class Pools:
    """The read side of a ``DescriptorPool`` that grpcio-reflection uses, over several pools in order."""

    def __init__(self, *pools: descriptor_pool.DescriptorPool) -> None:
        self._pools = pools

    def FindFileByName(self, name: str) -> FileDescriptor:
        return self._first(lambda pool: pool.FindFileByName(name), name)

    def FindFileContainingSymbol(self, name: str) -> FileDescriptor:
        return self._first(lambda pool: pool.FindFileContainingSymbol(name), name)

    def FindMessageTypeByName(self, name: str) -> Descriptor:
        return self._first(lambda pool: pool.FindMessageTypeByName(name), name)

    def FindExtensionByNumber(self, message: Descriptor, number: int) -> FieldDescriptor:
        return message.file.pool.FindExtensionByNumber(message, number)

    def FindAllExtensions(self, message: Descriptor) -> list[FieldDescriptor]:
        return list(message.file.pool.FindAllExtensions(message))

    def _first(self, find: Callable[[descriptor_pool.DescriptorPool], T], name: str) -> T:
        for pool in self._pools:
            try:
                return find(pool)
            except KeyError:
                continue
        raise KeyError(name)


def enable_reflection(server: grpc.aio.Server, service_names: Iterable[str]) -> None:
    """Serve reflection v1 and v1alpha on ``server``, listing ``service_names`` and both reflection services."""
    names = (*service_names, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME)
    servicer = reflection.aio.ReflectionServicer(names, pool=Pools(descriptor_pool.Default(), pb_later.POOL))
    for name in (V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME):
        method = grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, {"ServerReflectionInfo": method}),))
