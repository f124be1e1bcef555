"""The backend SPI: everything a driver (in tree or third-party) imports.

``from openengine_gateway import spi`` gives the ``Backend`` base class, its settings base,
``EngineFacts``, the validated request types, the generation events with their
``EventStream``, the streaming helpers, and ``OutputTracker`` (one output of a token-by-token
engine, stopping and text). ``openengine_gateway.pb`` gives the protobuf
messages used for capabilities, load and events; ``openengine_gateway.errors`` the errors;
``ConfigurationError`` is here too, for a setting the user must fix (the command exits 2).
"""

from ..errors import ConfigurationError
from .backend import SPI_VERSION, Backend, BackendSettings, EngineFacts
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

__all__ = [
    "SPI_VERSION",
    "Backend",
    "BackendSettings",
    "Candidate",
    "CandidateSelection",
    "ClassifyCall",
    "ConfigurationError",
    "CumulativeOutput",
    "EmbedCall",
    "Endpoint",
    "EngineFacts",
    "EventStream",
    "GenerationEvent",
    "GenerationRequest",
    "Guidance",
    "KvSession",
    "LogprobRequest",
    "LogprobRow",
    "LoraAdapter",
    "Media",
    "OutputFinished",
    "OutputTracker",
    "PrefillDone",
    "PromptTokens",
    "Sampling",
    "ScoreCall",
    "ScoreGroupCall",
    "StopMatch",
    "StopTextHit",
    "StopTextMatcher",
    "Stopping",
    "TaskContext",
    "TaskItem",
    "TokenDelta",
    "TokenRecord",
    "TokenStep",
    "UsageReport",
    "rank_by_logprob",
    "resolve_max_tokens",
    "select_candidates",
    "stop_match_for_token",
]
