"""Every conformance check, by contract area; importing this package registers them."""

from . import (  # noqa: F401
    abort,
    classify,
    discovery,
    drain,
    embed,
    errors,
    generation,
    guided,
    health,
    kv,
    logprobs,
    lora,
    options,
    runtime_events,
    score,
    stopping,
    tasks,
)
