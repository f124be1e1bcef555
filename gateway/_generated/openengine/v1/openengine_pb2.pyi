from . import classification_pb2 as _classification_pb2
from . import embedding_pb2 as _embedding_pb2
from . import engine_pb2 as _engine_pb2
from . import generation_pb2 as _generation_pb2
from . import kv_pb2 as _kv_pb2
from . import lifecycle_pb2 as _lifecycle_pb2
from . import lora_pb2 as _lora_pb2
from . import model_pb2 as _model_pb2
from . import observability_pb2 as _observability_pb2
from . import scoring_pb2 as _scoring_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
