"""SGLang 0.5.23's radix cache as its KV events show it, and its per-rank ZMQ publishers: faked.

Each behaviour follows the upstream file named beside it (paths under ``sglang/srt/``):

- ``mem_cache/radix_cache.py``: keys are cut to whole pages; an insert walks the matched nodes,
  splits one a key leaves part-way (publishing nothing) and adds one node for the rest; eviction
  removes least-recently-used leaves whole. A salted key never shares a node with another
  namespace (``RadixKey.cache_salt`` "namespaces the tree, storage and KV events").
- ``mem_cache/common.py`` (``checkpoint_kv_cache``, ``release_kv_cache``): a request's prompt is
  inserted once prefilled, and at its finish everything it computed KV for: the prompt and every
  output token but the last.
- ``mem_cache/events.py`` (``KVCacheEventRecorder``): one ``BlockStored`` per page, its parent the
  previous page's hash (none for a page under the root), coalesced into the queue's tail while
  chained and alike; one ``BlockRemoved`` per evicted node, coalesced alike.
- ``mem_cache/utils.py`` and ``mem_cache/cpp_utils/hash_binding.cpp``: a page's digest is the
  sha256 of the previous digest and the page's tokens as little-endian uint32; a salted chain
  starts from ``sha256(b"sglang-cache-salt-v1\\0" + salt)`` (``compute_node_event_hash_values``);
  events publish a digest's first 8 bytes as a signed int (``hash_str_to_int64``).
- ``disaggregation/kv_events.py``: ``KVCacheEvent`` structs are tagged maps that omit unset
  optional fields; ``ZmqEventPublisher`` sends (topic, 8-byte sequence from 0, msgpack
  ``[ts, events, attn_dp_rank]``) on rank ``r``'s endpoint (``offset_endpoint_port``), bound or
  connected as ``_socket_setup`` decides (it sets no ``IPV6`` option).

The fake counts only the tokens the tree holds against ``capacity``; SGLang's pool also holds
running requests' KV.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zmq

_SALT_SEED = b"sglang-cache-salt-v1\0"
Page = tuple[int, ...]


def page_digests(pages: list[Page], prior: bytes | None) -> list[bytes]:
    """Each page's chained digest (``hash_binding.cpp`` ``hash_page``)."""
    digests = []
    for page in pages:
        prior = hashlib.sha256((prior or b"") + b"".join(t.to_bytes(4, "little") for t in page)).digest()
        digests.append(prior)
    return digests


def salt_seed(salt: str | None) -> bytes | None:
    """The digest a salted chain starts from (``compute_node_event_hash_values``)."""
    return hashlib.sha256(_SALT_SEED + salt.encode()).digest() if salt else None


def event_hash(digest: bytes) -> int:
    """``hash_str_to_int64``: the digest's first 64 bits as a signed int."""
    return int.from_bytes(digest[:8], "big", signed=True)


@dataclass(eq=False)
class Node:
    """``TreeNode``: a run of pages, their digests, and the node's place in the tree."""

    salt: str | None
    pages: list[Page]
    digests: list[bytes]
    parent: Node | None = None
    children: dict[tuple[str | None, Page], Node] = field(default_factory=dict)
    last_access: float = field(default_factory=time.monotonic)

    @property
    def tokens(self) -> int:
        return sum(len(page) for page in self.pages)


class RadixCache:
    """One DP rank's radix tree and the KV events its changes record."""

    def __init__(self, page_size: int, capacity: int) -> None:
        self.page_size, self.capacity = page_size, capacity
        self.root = Node(None, [], [])
        self.size = 0
        self.events: list[dict[str, Any]] = []

    def pages(self, tokens: list[int]) -> list[Page]:
        """The key cut to whole pages (``RadixKey.page_aligned``)."""
        whole = len(tokens) // self.page_size * self.page_size
        return [tuple(tokens[i : i + self.page_size]) for i in range(0, whole, self.page_size)]

    def match(self, tokens: list[int], salt: str | None) -> int:
        """Tokens of ``tokens`` the tree holds, in whole pages."""
        return self._walk(self.pages(tokens), salt, split=False)[1] * self.page_size

    def insert(self, tokens: list[int], salt: str | None) -> None:
        """``_insert_helper``: store the pages not yet cached as one new node."""
        pages = self.pages(tokens)
        node, matched = self._walk(pages, salt, split=True)
        rest = pages[matched:]
        if not rest:
            return
        self._evict(len(rest) * self.page_size, keep=node)
        prior = node.digests[-1] if node.digests else salt_seed(salt)
        new = Node(salt, rest, page_digests(rest, prior), parent=node)
        node.children[(salt, rest[0])] = new
        self.size += new.tokens
        self._record_store(new)

    def _walk(self, pages: list[Page], salt: str | None, *, split: bool) -> tuple[Node, int]:
        """The deepest node ``pages`` reach and how many pages matched (splitting a partial match)."""
        node, matched = self.root, 0
        while matched < len(pages) and (child := node.children.get((salt, pages[matched]))) is not None:
            common = _common(child.pages, pages[matched:])
            if common < len(child.pages):
                if not split:
                    return node, matched + common
                child = self._split(child, common)
            child.last_access = time.monotonic()
            node, matched = child, matched + common
        return node, matched

    def _split(self, child: Node, at: int) -> Node:
        """``_split_node``: the first ``at`` pages become the child's new parent; no event."""
        assert child.parent is not None
        head = Node(child.salt, child.pages[:at], child.digests[:at], parent=child.parent)
        child.parent.children[(child.salt, child.pages[0])] = head
        child.pages, child.digests, child.parent = child.pages[at:], child.digests[at:], head
        head.children[(child.salt, child.pages[0])] = child
        return head

    def _evict(self, needed: int, *, keep: Node) -> None:
        """``evict``: least-recently-used leaves off ``keep``'s path go until ``needed`` tokens fit."""
        protected = set()
        walk: Node | None = keep
        while walk is not None:
            protected.add(walk)
            walk = walk.parent
        while self.size + needed > self.capacity:
            leaves = [n for n in self._nodes() if not n.children and n not in protected]
            if not leaves:
                return
            victim = min(leaves, key=lambda n: n.last_access)
            assert victim.parent is not None
            del victim.parent.children[(victim.salt, victim.pages[0])]
            self.size -= victim.tokens
            self._enqueue({"type": "BlockRemoved", "block_hashes": [event_hash(d) for d in victim.digests]} | _GPU)

    def _nodes(self) -> list[Node]:
        found, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            found.append(node)
            stack.extend(node.children.values())
        return found

    def _record_store(self, node: Node) -> None:
        """``record_store``: one ``BlockStored`` per page, chained to the page before it."""
        assert node.parent is not None
        parent = event_hash(node.parent.digests[-1]) if node.parent.digests else None
        for page, digest in zip(node.pages, node.digests, strict=True):
            block = event_hash(digest)
            event: dict[str, Any] = {"type": "BlockStored", "block_hashes": [block], "parent_block_hash": parent}
            event |= {"token_ids": list(page), "block_size": len(page), "lora_id": None} | _GPU
            if node.salt is not None:
                event["cache_salt"] = node.salt
            self._enqueue(event)
            parent = block

    def _enqueue(self, event: dict[str, Any]) -> None:
        """``KVCacheEventRecorder.enqueue``: extend the queue's tail when the event continues it."""
        tail = self.events[-1] if self.events else None
        if tail is not None and tail["type"] == event["type"] == "BlockRemoved":
            tail["block_hashes"].extend(event["block_hashes"])
            return
        chained = tail is not None and tail["type"] == event["type"] == "BlockStored"
        alike = (
            chained and tail.get("cache_salt") == event.get("cache_salt") and tail["block_size"] == event["block_size"]
        )
        if alike and event["parent_block_hash"] == tail["block_hashes"][-1]:
            tail["block_hashes"].extend(event["block_hashes"])
            tail["token_ids"].extend(event["token_ids"])
            return
        self.events.append(event)

    def take(self) -> list[dict[str, Any]]:
        """``take_events``: the queued events, once."""
        events, self.events = self.events, []
        return events


_GPU = {"medium": "GPU"}


def _common(ours: list[Page], theirs: list[Page]) -> int:
    """How many leading pages two runs share (``RadixKey.match``, in pages)."""
    pairs = zip(ours, theirs, strict=False)
    return sum(1 for _ in itertools.takewhile(lambda pair: pair[0] == pair[1], pairs))


def offset_endpoint_port(endpoint: str, rank: int) -> str:
    """``ZmqEventPublisher.offset_endpoint_port``."""
    if rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{rank}"
    if "tcp" in endpoint:
        base, _, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + rank}"
    raise ValueError("Invalid endpoint: must contain 'inproc' or 'tcp'")


class Publisher:
    """``ZmqEventPublisher`` of one attention-DP rank."""

    def __init__(self, config: dict[str, Any], rank: int) -> None:
        self.rank = rank
        self.endpoint = offset_endpoint_port(config.get("endpoint", "tcp://*:5557"), rank)
        self.topic = str(config.get("topic", "")).encode()
        self.sequence = 0
        self.socket = zmq.Context.instance().socket(zmq.PUB)
        bind = config.get("bind")
        if bind is None:
            bind = any(mark in self.endpoint for mark in ("*", "::", "0.0.0.0"))
            bind = bind or self.endpoint.startswith(("ipc://", "inproc://"))
        (self.socket.bind if bind else self.socket.connect)(self.endpoint)

    def publish(self, events: list[dict[str, Any]]) -> None:
        """One scheduler step's batch (``publish_kv_events``: nothing when it recorded nothing)."""
        if not events:
            return
        payload = msgpack.packb([time.time(), events, self.rank])
        self.socket.send_multipart([self.topic, self.sequence.to_bytes(8, "big"), payload])
        self.sequence += 1

    def close(self) -> None:
        self.socket.close(linger=0)


def publishers(kv_events_config: str | None, ranks: int) -> list[Publisher]:
    """``SchedulerKvEventsPublisher``: with a ZMQ ``--kv-events-config``, one publisher per DP rank
    (each attention-DP rank under attention DP: ``select_kv_publisher_dp_rank``)."""
    config = json.loads(kv_events_config or "{}")
    if config.get("publisher") != "zmq":
        return []
    return [Publisher(config, rank) for rank in range(ranks)]


__all__ = [
    "Node",
    "Publisher",
    "RadixCache",
    "event_hash",
    "offset_endpoint_port",
    "page_digests",
    "publishers",
    "salt_seed",
]
