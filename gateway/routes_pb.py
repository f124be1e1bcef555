"""The one import point for the generated ``openengine_gateway.v1`` modules: the gateway's own
``Routes`` service (proto/openengine_gateway/v1/routes.proto), beside the OpenEngine contract's ``pb``."""

from ._generated.openengine_gateway.v1.routes_pb2 import CANARY_ACTION_ABORT as CANARY_ACTION_ABORT
from ._generated.openengine_gateway.v1.routes_pb2 import CANARY_ACTION_PAUSE as CANARY_ACTION_PAUSE
from ._generated.openengine_gateway.v1.routes_pb2 import CANARY_ACTION_PROMOTE as CANARY_ACTION_PROMOTE
from ._generated.openengine_gateway.v1.routes_pb2 import CANARY_ACTION_RESUME as CANARY_ACTION_RESUME
from ._generated.openengine_gateway.v1.routes_pb2 import DESCRIPTOR as _FILE
from ._generated.openengine_gateway.v1.routes_pb2 import Canary as Canary
from ._generated.openengine_gateway.v1.routes_pb2 import CanaryAction as CanaryAction
from ._generated.openengine_gateway.v1.routes_pb2 import ControlCanaryRequest as ControlCanaryRequest
from ._generated.openengine_gateway.v1.routes_pb2 import GetRoutesRequest as GetRoutesRequest
from ._generated.openengine_gateway.v1.routes_pb2 import Mirror as Mirror
from ._generated.openengine_gateway.v1.routes_pb2 import ReloadRoutesRequest as ReloadRoutesRequest
from ._generated.openengine_gateway.v1.routes_pb2 import ReloadRoutesResponse as ReloadRoutesResponse
from ._generated.openengine_gateway.v1.routes_pb2 import RouteTable as RouteTable
from ._generated.openengine_gateway.v1.routes_pb2 import Split as Split
from ._generated.openengine_gateway.v1.routes_pb2 import SplitEngine as SplitEngine
from ._generated.openengine_gateway.v1.routes_pb2_grpc import RoutesServicer as RoutesServicer
from ._generated.openengine_gateway.v1.routes_pb2_grpc import RoutesStub as RoutesStub
from ._generated.openengine_gateway.v1.routes_pb2_grpc import (
    add_RoutesServicer_to_server as add_RoutesServicer_to_server,
)

SERVICE_NAME = "openengine_gateway.v1.Routes"
"""Fully qualified gRPC service name, as clients and reflection see it."""

SERVICE_DESCRIPTOR = _FILE.services_by_name["Routes"]
"""The service's descriptor; importing its file registers it for server reflection."""
