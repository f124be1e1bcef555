"""The backend SPI: everything a driver (in tree or third-party) imports.

``from openengine_gateway import spi`` gives the ``Backend`` base class, its settings base,
``EngineFacts``, the validated request types, the generation events with their
``EventStream``, the streaming helpers, ``OutputTracker`` (one output of a token-by-token
engine, stopping and text), the values tasks, load and health return (``spi.results``; from
wire messages: ``spi.wire``), and
KV cache events (``spi.kv_events``; engines that publish them over ZMQ: ``spi.zmq_kv``), and
``vocabulary_digest``, a tokenizer's identity (``spi.vocabulary``), and ``SharedEngine``, one
engine behind several frontend processes (``spi.frontends``).
``openengine_gateway.pb`` gives the protobuf messages used for capabilities and runtime events;
``openengine_gateway.errors`` the errors;
``ConfigurationError`` is here too, for a setting the user must fix (the command exits 2).
"""

from ..errors import ConfigurationError
from .adapters import LoadedAdapters
from .backend import SPI_VERSION, Backend, BackendSettings, EngineFacts, SettingsT
from .background import BackgroundTasks
from .events import (
    Candidate,
    EventStream,
    GenerationEvent,
    OutputFinished,
    PrefillDone,
    PromptTokens,
    StopMatch,
    TokenDelta,
    TokenRecord,
    UsageReport,
)
from .frontends import SharedEngine
from .kv_events import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KvEventBatch,
    KvEventSource,
)
from .requests import (
    CandidateSelection,
    ClassifyCall,
    EmbedCall,
    Endpoint,
    GenerationRequest,
    Guidance,
    KvSession,
    LogprobRequest,
    LoraAdapter,
    Media,
    Sampling,
    ScoreCall,
    ScoreGroupCall,
    Stopping,
    TaskContext,
    TaskItem,
)
from .results import (
    CandidateScore,
    Classification,
    DenseTensor,
    Embedding,
    HealthCheck,
    Load,
    RankLoad,
    ScoreResult,
    SparseTensor,
    TaskUsage,
)
from .sessions import HeldKvSessions
from .streaming import (
    CumulativeOutput,
    LogprobRow,
    StopTextHit,
    StopTextMatcher,
    rank_by_logprob,
    resolve_max_tokens,
    select_candidates,
    stop_match_for_token,
)
from .tracking import OutputTracker, TokenStep
from .vocabulary import vocabulary_digest

__all__ = [
    "SPI_VERSION",
    "AllBlocksCleared",
    "Backend",
    "BackendSettings",
    "BackgroundTasks",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "Candidate",
    "CandidateScore",
    "CandidateSelection",
    "Classification",
    "ClassifyCall",
    "ConfigurationError",
    "CumulativeOutput",
    "DenseTensor",
    "EmbedCall",
    "Embedding",
    "Endpoint",
    "EngineFacts",
    "EventStream",
    "GenerationEvent",
    "GenerationRequest",
    "Guidance",
    "HealthCheck",
    "HeldKvSessions",
    "KvEvent",
    "KvEventBatch",
    "KvEventSource",
    "KvSession",
    "Load",
    "LoadedAdapters",
    "LogprobRequest",
    "LogprobRow",
    "LoraAdapter",
    "Media",
    "OutputFinished",
    "OutputTracker",
    "PrefillDone",
    "PromptTokens",
    "RankLoad",
    "Sampling",
    "ScoreCall",
    "ScoreGroupCall",
    "ScoreResult",
    "SettingsT",
    "SharedEngine",
    "SparseTensor",
    "StopMatch",
    "StopTextHit",
    "StopTextMatcher",
    "Stopping",
    "TaskContext",
    "TaskItem",
    "TaskUsage",
    "TokenDelta",
    "TokenRecord",
    "TokenStep",
    "UsageReport",
    "rank_by_logprob",
    "resolve_max_tokens",
    "select_candidates",
    "stop_match_for_token",
    "vocabulary_digest",
]
