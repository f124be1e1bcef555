"""The one import point for the generated OpenEngine v1 protobuf and gRPC modules.

Everything else in the gateway (and every driver) writes ``from openengine_gateway import pb``
and uses ``pb.GenerateRequest``, ``pb.FINISH_REASON_STOP`` and so on; nothing imports the
generated modules by path, so regenerating or relocating them touches this file alone.
Every generated message, enum and constant is re-exported (hence no ``__all__``).
"""

from google.protobuf.struct_pb2 import Struct as Struct

from ._generated.openengine.v1.classification_pb2 import *  # noqa: F403
from ._generated.openengine.v1.embedding_pb2 import *  # noqa: F403
from ._generated.openengine.v1.engine_pb2 import *  # noqa: F403
from ._generated.openengine.v1.error_pb2 import *  # noqa: F403
from ._generated.openengine.v1.generation_pb2 import *  # noqa: F403
from ._generated.openengine.v1.input_pb2 import *  # noqa: F403
from ._generated.openengine.v1.kv_pb2 import *  # noqa: F403
from ._generated.openengine.v1.lifecycle_pb2 import *  # noqa: F403
from ._generated.openengine.v1.lora_pb2 import *  # noqa: F403
from ._generated.openengine.v1.model_pb2 import *  # noqa: F403
from ._generated.openengine.v1.observability_pb2 import *  # noqa: F403
from ._generated.openengine.v1.openengine_pb2 import DESCRIPTOR as _SERVICE_FILE
from ._generated.openengine.v1.openengine_pb2_grpc import OpenEngineServicer as OpenEngineServicer
from ._generated.openengine.v1.openengine_pb2_grpc import OpenEngineStub as OpenEngineStub
from ._generated.openengine.v1.openengine_pb2_grpc import (
    add_OpenEngineServicer_to_server as add_OpenEngineServicer_to_server,
)
from ._generated.openengine.v1.scoring_pb2 import *  # noqa: F403
from ._generated.openengine.v1.tasks_pb2 import *  # noqa: F403

SERVICE_NAME = "openengine.v1.OpenEngine"
"""Fully qualified gRPC service name, as clients and reflection see it."""

SERVICE_DESCRIPTOR = _SERVICE_FILE.services_by_name["OpenEngine"]
"""The service's descriptor. Importing its file (openengine.proto) registers the service in the
default descriptor pool, which server reflection needs to describe it."""

SCHEMA_REVISION = 1
"""The contract revision this gateway implements (EngineInfo.schema_revision)."""

MINIMUM_CLIENT_REVISION = 1
"""The oldest client revision this gateway supports (EngineInfo.minimum_client_revision)."""

SCHEMA_RELEASE = "d0f29fec31f31db5cfd49cf3e0f67da84d10c709"
"""The immutable upstream OpenEngine source commit that holds revision 1."""
