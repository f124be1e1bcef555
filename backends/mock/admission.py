"""Giving an admitted request its KV blocks, prefix-cache hits first.

A fresh request (or one preempted before its prompt finished) allocates its prompt once:
output 0 takes the cached prefix and new blocks, and the other outputs share its full
prompt blocks, each with its own copy of the partial last block. A decode request counts
the full blocks that arrived from its prefill engine as computed. A request resumed after
preemption re-acquires each live output's blocks from the cache and recomputes the rest.
Prefix hits never cover a sequence's last token: its logits must be computed to sample.
"""

from __future__ import annotations

from .kv_cache import BlockManager
from .request import MockRequest


def allocate(kv: BlockManager, request: MockRequest) -> bool:
    """Allocate everything ``request`` needs now, or nothing (False) when it does not fit."""
    if request.prompt_done:
        return _resume(kv, request)
    key, prompt, size = request.key, request.prompt, kv.block_size
    hits = [] if request.spec.bypass_prefix_cache else kv.lookup(prompt, key, len(prompt) - 1)
    forks = 0 if request.prefill_only else len(request.outputs) - 1
    tail = 1 if len(prompt) % size else 0
    if kv.blocks_for(len(prompt)) - len(hits) + forks * tail > kv.available(hits):
        return False
    first = request.outputs[0]
    kv.take(first.table, hits)
    kv.grow(first.table, len(prompt))
    first.computed = len(hits) * size
    if request.transferred is not None and not request.admitted:  # after a preemption it is recomputed
        first.computed = max(first.computed, (len(prompt) - 1) // size * size)
        kv.commit(first.table, prompt, first.computed, key, request.request_id)
    for output in request.outputs[1:]:
        output.table = kv.fork(first.table, len(prompt))
    if not request.admitted:
        request.cached_tokens = first.computed
    return True


def _resume(kv: BlockManager, request: MockRequest) -> bool:
    live = request.live
    bypass = request.spec.bypass_prefix_cache
    found = [[] if bypass else kv.lookup(o.tokens, request.key, len(o.tokens) - 1) for o in live]
    needed = sum(kv.blocks_for(len(o.tokens)) - len(h) for o, h in zip(live, found, strict=True))
    if needed > kv.available([block for hits in found for block in hits]):
        return False
    for output, hits in zip(live, found, strict=True):
        kv.take(output.table, hits)
        output.computed = len(hits) * kv.block_size
    for output in live:
        kv.grow(output.table, len(output.tokens))
    return True


__all__ = ["allocate"]
