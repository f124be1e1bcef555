"""The one import point for the later OpenEngine layout: ``openengine.v1.Inference`` and ``openengine.v1.Control``.

Upstream ai-dynamo/openengine at ``SCHEMA_RELEASE`` (docs/layouts.md says why that commit), generated
from proto/openengine_later/v1. Its messages have the same full names as the seed's (``pb``:
``openengine.v1.GenerateRequest`` in both) but other fields, so they live in a descriptor pool of their
own, ``POOL``: ``pb_later.GenerateRequest`` and ``pb.GenerateRequest`` are different classes, and a
message of one never goes where the other is expected (``contract.layouts`` converts). Every generated
message, enum and constant is re-exported (hence no ``__all__``).
"""

from ._generated.openengine_later.v1 import POOL as POOL
from ._generated.openengine_later.v1.error_pb2 import *  # noqa: F403
from ._generated.openengine_later.v1.generation_pb2 import *  # noqa: F403
from ._generated.openengine_later.v1.kv_pb2 import *  # noqa: F403
from ._generated.openengine_later.v1.lifecycle_pb2 import *  # noqa: F403
from ._generated.openengine_later.v1.lora_pb2 import *  # noqa: F403
from ._generated.openengine_later.v1.model_pb2 import *  # noqa: F403
from ._generated.openengine_later.v1.openengine_pb2 import DESCRIPTOR as _SERVICE_FILE
from ._generated.openengine_later.v1.openengine_pb2_grpc import ControlServicer as ControlServicer
from ._generated.openengine_later.v1.openengine_pb2_grpc import ControlStub as ControlStub
from ._generated.openengine_later.v1.openengine_pb2_grpc import InferenceServicer as InferenceServicer
from ._generated.openengine_later.v1.openengine_pb2_grpc import InferenceStub as InferenceStub
from ._generated.openengine_later.v1.openengine_pb2_grpc import (
    add_ControlServicer_to_server as add_ControlServicer_to_server,
)
from ._generated.openengine_later.v1.openengine_pb2_grpc import (
    add_InferenceServicer_to_server as add_InferenceServicer_to_server,
)
from ._generated.openengine_later.v1.server_pb2 import *  # noqa: F403

INFERENCE_SERVICE_NAME = "openengine.v1.Inference"
CONTROL_SERVICE_NAME = "openengine.v1.Control"
SERVICE_NAMES = (INFERENCE_SERVICE_NAME, CONTROL_SERVICE_NAME)
"""Fully qualified gRPC service names, as clients and reflection see them."""

INFERENCE_DESCRIPTOR = _SERVICE_FILE.services_by_name["Inference"]
CONTROL_DESCRIPTOR = _SERVICE_FILE.services_by_name["Control"]
"""The services' descriptors, in ``POOL`` (server reflection reads that pool for them)."""

SCHEMA_REVISION = 1
"""ServerInfo.schema_revision at the pinned commit (upstream restarted its count at 1 with this layout)."""

MINIMUM_CLIENT_REVISION = 1
"""ServerInfo.minimum_client_revision at the pinned commit."""

SCHEMA_RELEASE = "b8d052fec7451bc978fdcee4991ef38c2c586b20"
"""The upstream ai-dynamo/openengine source commit of the later layout (ServerInfo.schema_release): the
commit TensorRT-LLM's OpenEngine servicer vendors, and wire-equal to what Dynamo 1.6.1's sidecar sends."""
