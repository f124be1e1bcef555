"""The conformance kit: spec rules as checks that run against any OpenEngine endpoint.

A ``Rule`` quotes one normative sentence of the contract and carries an async check that
exercises it over real gRPC through a ``Target``. A check passes by returning, fails by
raising ``CheckFailed`` (or any ``AssertionError``), and is *not applicable* by raising
``NotApplicable`` when the server does not advertise what the rule needs: a conformance
report never turns "unsupported" into "failed". A check leaves no state behind: what it sets up
on the server (an adapter through ``Target.load_lora``, anything through ``Target.on_exit``) is
undone when the rule ends, however it ends.

A model that this gateway splits between engines (``[[splits]]``) is tested rule by rule: every
request a rule sends carries one sticky key of that rule's own (``Target.pin``), so what a rule
compares (a greedy run and its follow-up, a stream and its deltas) comes from one engine, while
different rules reach different engines.

Checks are grouped by contract area in ``conformance.checks``; importing that package
registers them. Disruptive checks (a Drain that stops admission) run only when asked, last.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import grpc

from .. import pb, routes_pb
from ..client import NotInLayout, OpenEngineClient, StatusError
from .observe import CheckFailed, OpenCall, Stream, advertised

_PROMPT_ALLOWANCE = 64
"""Tokens a check's short text prompt may take, kept free of the context when sizing outputs."""


class NotApplicable(Exception):
    """The server does not advertise what the rule needs."""


class Outcome(enum.Enum):
    """A rule's verdict."""

    PASSED = "passed"
    FAILED = "failed"
    NOT_APPLICABLE = "not_applicable"


@dataclass
class Target:
    """The endpoint under test, one of its models, and helpers for building requests."""

    client: OpenEngineClient
    engine_info: pb.EngineInfo
    model: str
    model_info: pb.ModelInfo
    timeout_s: float = 60.0
    sticky: tuple[str, ...] = ()
    """Where the gateway reads the sticky key of the split ``model`` names (``"metadata.KEY"``,
    ``"cache_salt"``); empty for one engine, or a server that lists no splits."""
    pin: str = ""
    """The sticky key every generation request carries (the running rule's name) when ``sticky``."""
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _greedy: dict[tuple[str, int], Stream] = field(default_factory=dict)
    _undo: list[Callable[[], Awaitable[object]]] = field(default_factory=list)
    _ranks: tuple[int, ...] = ()

    @classmethod
    async def open(cls, client: OpenEngineClient, model: str = "", *, timeout_s: float = 60.0) -> Target:
        """Describe ``model`` (default: the first supported model) on a connected client."""
        info = client.engine_info or await client.get_engine_info()
        if not model:
            if not info.supported_models:
                raise CheckFailed("EngineInfo.supported_models is empty")
            model = info.supported_models[0]
        model_info = await client.model_info(model)
        return cls(client, info, model, model_info, timeout_s, await _sticky_sources(client, model))

    @property
    def role(self) -> pb.EngineRole.ValueType:
        """The engine's role."""
        return self.engine_info.role

    async def data_parallel_ranks(self) -> tuple[int, ...]:
        """The endpoint's data-parallel ranks that serve this model.

        An endpoint of several engines gives each model a block of one shared rank space, so
        EngineInfo's ranks are every model's together; this gateway lists a model's own block in
        GetLoad's ``attributes["<served name>.ranks"]``. Without that attribute (one engine, or
        another server), EngineInfo's ranks. Asked once per target: ranks do not move.
        """
        if not self._ranks:
            self._ranks = await self._model_ranks()
        return self._ranks

    async def _model_ranks(self) -> tuple[int, ...]:
        load = await self.client.load()
        listed = load.attributes.get(f"{self.model_info.served_model_name or self.model}.ranks")
        if listed:
            return tuple(sorted(int(rank) for rank in listed.split(",")))
        parallelism = self.engine_info.parallelism
        start = parallelism.data_parallel_start_rank if parallelism.HasField("data_parallel_start_rank") else 0
        size = parallelism.data_parallel_size if parallelism.HasField("data_parallel_size") else 1
        return tuple(range(start, start + max(size, 1)))

    def on_exit(self, undo: Callable[[], Awaitable[object]]) -> None:
        """Run ``undo`` when the running rule ends, however it ends: a conformance run leaves no
        state behind on the server (``run_rule`` calls ``release``)."""
        self._undo.append(undo)

    async def release(self) -> None:
        """Undo what the rule set up, newest first. A status from an undo (nothing left to undo: the
        adapter was never loaded, or the check already unloaded it) is expected and ignored."""
        while self._undo:
            with contextlib.suppress(StatusError):
                await self._undo.pop()()

    async def load_lora(self, adapter: pb.LoraAdapter) -> pb.LoadLoraResponse:
        """LoadLora, with the adapter unloaded when the rule ends, whether the load was meant to
        succeed or not (a server that wrongly accepts one must not keep it)."""
        if adapter.lora_name:
            name = adapter.lora_name
            self.on_exit(lambda: self.client.unload_lora(name))
        return await self.client.load_lora(adapter)

    def request_id(self, label: str = "check") -> str:
        """A fresh request id that no other check uses."""
        return f"conformance-{label}-{uuid.uuid4().hex[:12]}-{next(self._ids)}"

    def prompt(self, **options: object) -> pb.GenerateRequest:
        """A valid generation request for the model: text when accepted, else token ids.

        ``options`` name fields of the request's option groups (``max_tokens``, ``temperature``...)
        or its own scalar fields (``priority``, ``lora_name``).
        """
        request = pb.GenerateRequest(request_id=self.request_id("gen"), model=self.model)
        info = self.model_info
        if not info.HasField("supports_text_input") or info.supports_text_input:
            request.prompt = "The quick brown fox jumps over the lazy dog."
        else:
            request.token_ids.ids.extend([1, 2, 3, 4, 5, 6, 7, 8])
        groups = (request.sampling, request.stopping, request.response, request.kv, request)
        for name, value in options.items():
            group = next((g for g in groups if name in g.DESCRIPTOR.fields_by_name), None)
            if group is None or name in ("request_id", "model", "prompt"):
                raise TypeError(f"unknown generation option {name!r}")
            setattr(group, name, value)
        self._pin(request)
        return request

    def _pin(self, request: pb.GenerateRequest) -> None:
        """Give ``request`` the running rule's sticky key, at the split's first source a request can set."""
        if not self.pin:
            return
        for source in self.sticky:
            if source.startswith("metadata.") and self.client.layout == "seed":  # the later layout has no metadata
                request.metadata[source.removeprefix("metadata.")] = self.pin
                return
            if source == "cache_salt" and advertised(self.model_info.generation, "supports_cache_salt"):
                request.kv.cache_salt = self.pin
                return

    def token_prompt(self, **options: object) -> pb.GenerateRequest:
        """``prompt`` with a token-id prompt (``NotApplicable`` when token ids are not accepted)."""
        info = self.model_info
        self.require(not info.HasField("supports_token_ids_input") or info.supports_token_ids_input, "token-id prompts")
        request = self.prompt(**options)
        request.token_ids.CopyFrom(pb.TokenIds(ids=[1, 2, 3, 4, 5, 6, 7, 8]))
        return request

    def fresh_prompt(self, **options: object) -> pb.GenerateRequest:
        """``prompt`` with a prompt nobody sent before that spans several KV blocks (for prefix-cache
        and KV-event checks)."""
        info = self.model_info
        block = info.kv_block_size if info.HasField("kv_block_size") else 16
        request = self.prompt(**options)
        if request.HasField("prompt"):
            request.prompt = " ".join(secrets.token_hex(3) for _ in range(block))
        else:
            start = secrets.randbelow(200)
            request.token_ids.CopyFrom(pb.TokenIds(ids=[1 + (start + n) % 200 for n in range(3 * block)]))
        return request

    def long_request(self, **options: object) -> pb.GenerateRequest:
        """A request that keeps the engine busy for many steps (to abort, cancel or drain it)."""
        info = self.model_info
        budget = 1024
        if info.HasField("max_output_tokens"):
            budget = min(budget, info.max_output_tokens)
        if info.HasField("max_context_length"):
            budget = min(budget, info.max_context_length - _PROMPT_ALLOWANCE)
        return self.prompt(max_tokens=max(budget, 1), ignore_eos=True, **options)

    async def run(self, request: pb.GenerateRequest) -> Stream:
        """Run a Generate call to its end (a non-OK status raises ``StatusError``). A KV session a
        prefill hands over is aborted when the rule ends: no decode will pull it."""
        stream = Stream(request, await self.collect(request))
        last = stream.messages[-1] if stream.messages else None
        if last is not None and last.HasField("prefill_ready") and last.prefill_ready.kv_session.session_id:
            release = pb.AbortRequest(kv_session=last.prefill_ready.kv_session)
            self.on_exit(lambda: self.client.abort(release))
        return stream

    def open_call(self, request: pb.GenerateRequest) -> OpenCall:
        """Start a Generate call that the check reads at its own pace; one still open when the rule ends (it
        failed, or turned out not to apply) is cancelled then, so no later rule finds it running."""
        call = OpenCall(self.client, request, self.timeout_s)
        self.on_exit(call.close)
        return call

    async def greedy(self, max_tokens: int = 16) -> Stream:
        """The model's greedy continuation of ``prompt()`` (EOS ignored), run once per length.

        Checks derive their triggers (stop tokens, stop strings, candidate ids) from it, so
        they assume nothing about the model's vocabulary or text.
        """
        key = (self.pin, max_tokens)  # pinned: the engine of the rule's sticky key
        stream = self._greedy.get(key)
        if stream is None:
            request = self.prompt(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
            stream = self._greedy[key] = (await self.run(request)).succeeded()
        return stream

    def require_generation(self) -> None:
        """``NotApplicable`` unless plain Generate requests run here (an aggregated engine)."""
        self.require_role(pb.ENGINE_ROLE_AGGREGATED)

    def require(self, condition: bool, what: str) -> None:
        """``NotApplicable`` unless the server advertises ``what``."""
        if not condition:
            raise NotApplicable(f"the server does not advertise {what}")

    def require_role(self, *roles: pb.EngineRole.ValueType) -> None:
        """``NotApplicable`` unless the engine has one of ``roles``."""
        if self.role not in roles:
            names = ", ".join(pb.EngineRole.Name(r) for r in roles)
            raise NotApplicable(f"the rule applies to {names} engines; this one is {pb.EngineRole.Name(self.role)}")

    async def collect(self, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
        """Every response of a Generate call (a non-OK status raises ``StatusError``)."""
        return [m async for m in self.client.stream(request, timeout_s=self.timeout_s)]

    async def expect_rejected(self, request: pb.GenerateRequest, *codes: object, what: str) -> StatusError:
        """Require a Generate call to end with a non-OK status (among ``codes``, when given)
        before any response event: a rejection before acceptance has no response event."""
        messages: list[pb.GenerateResponse] = []
        expected = " or ".join(getattr(c, "name", str(c)) for c in codes) or "a non-OK status"
        try:
            async for message in self.client.stream(request, timeout_s=self.timeout_s):
                messages.append(message)
        except StatusError as error:
            if messages:
                raise CheckFailed(
                    f"{what}: {len(messages)} response events preceded the {error.code.name} status; "
                    "a rejection before acceptance has no response event"
                ) from None
            if codes and error.code not in codes:
                raise CheckFailed(f"{what}: expected {expected}, got {error.code.name}: {error.details}") from None
            return error
        kinds = [m.WhichOneof("event") for m in messages]
        raise CheckFailed(f"{what}: expected {expected}, but the request was accepted (events {kinds})")

    async def expect_status(self, call: Awaitable[object], *codes: object, what: str) -> StatusError:
        """Await ``call`` and require a non-OK status among ``codes``."""
        try:
            await call
        except NotInLayout:
            raise  # not the server's answer: the rule does not apply in this layout
        except StatusError as error:
            if error.code not in codes:
                expected = " or ".join(getattr(c, "name", str(c)) for c in codes)
                raise CheckFailed(f"{what}: expected {expected}, got {error.code.name}: {error.details}") from None
            return error
        expected = " or ".join(getattr(c, "name", str(c)) for c in codes)
        raise CheckFailed(f"{what}: expected {expected}, but the call succeeded")


Check = Callable[[Target], Awaitable[None]]


@dataclass(frozen=True)
class Rule:
    """One normative rule of the contract and the check that proves it."""

    id: str
    section: str
    text: str
    check: Check
    disruptive: bool = False


RULES: dict[str, Rule] = {}


def rule(rule_id: str, section: str, text: str, *, disruptive: bool = False) -> Callable[[Check], Check]:
    """Register ``check`` as the proof of the rule quoted in ``text``."""

    def register(check: Check) -> Check:
        if rule_id in RULES:
            raise ValueError(f"rule {rule_id!r} is registered twice")
        RULES[rule_id] = Rule(rule_id, section, text, check, disruptive)
        return check

    return register


def all_rules(*, include_disruptive: bool = False) -> list[Rule]:
    """Registered rules in a stable order, disruptive ones last."""
    from . import checks  # noqa: F401 - importing registers the checks

    rules = sorted(RULES.values(), key=lambda r: (r.disruptive, r.section, r.id))
    return [r for r in rules if include_disruptive or not r.disruptive]


@dataclass(frozen=True)
class Result:
    """The verdict of one rule against one target."""

    rule: Rule
    outcome: Outcome
    message: str
    seconds: float


async def _sticky_sources(client: OpenEngineClient, model: str) -> tuple[str, ...]:
    """The sticky-key sources of the split ``model`` names, from this gateway's ``Routes`` service;
    empty when ``model`` is no split, or the server has no such service."""
    try:
        table = await routes_pb.RoutesStub(client.channel).GetRoutes(
            routes_pb.GetRoutesRequest(), metadata=client.call_metadata, timeout=30
        )
    except grpc.aio.AioRpcError:
        return ()
    return next((tuple(s.sticky) for s in table.splits if model == s.name or model in s.aliases), ())


async def run_rule(rule_: Rule, target: Target) -> Result:
    """Run one rule's check, with the target's timeout, then undo what it left on the server."""
    start = time.perf_counter()
    target.pin = f"conformance-{rule_.id}" if target.sticky else ""
    outcome, message = await _verdict(rule_, target)
    try:
        await asyncio.wait_for(target.release(), target.timeout_s)
    except Exception as exc:  # broad on purpose: state left behind fails the rule, whatever went wrong
        if outcome is not Outcome.FAILED:
            outcome, message = Outcome.FAILED, f"could not undo the check's changes: {type(exc).__name__}: {exc}"
    return Result(rule_, outcome, message, time.perf_counter() - start)


async def _verdict(rule_: Rule, target: Target) -> tuple[Outcome, str]:
    """The outcome of ``rule_``'s check and what it says."""
    try:
        await asyncio.wait_for(rule_.check(target), target.timeout_s)
        outcome, message = Outcome.PASSED, ""
    except NotApplicable as exc:
        outcome, message = Outcome.NOT_APPLICABLE, str(exc)
    except NotInLayout as exc:  # the layout spoken lacks the RPC: the rule cannot be asked there
        outcome, message = Outcome.NOT_APPLICABLE, exc.details
    except AssertionError as exc:
        outcome, message = Outcome.FAILED, str(exc) or "assertion failed"
    except TimeoutError:
        outcome, message = Outcome.FAILED, f"no result within {target.timeout_s:g}s"
    except StatusError as exc:
        outcome, message = Outcome.FAILED, f"unexpected status {exc.code.name}: {exc.details}"
    except Exception as exc:  # broad on purpose: an unexpected error is a failed rule, not a crash
        outcome, message = Outcome.FAILED, f"{type(exc).__name__}: {exc}"
    return outcome, message


async def run_rules(target: Target, rules: Sequence[Rule]) -> list[Result]:
    """Run rules one after another (checks may observe server-wide state)."""
    return [await run_rule(r, target) for r in rules]


__all__ = [
    "RULES",
    "Check",
    "CheckFailed",
    "NotApplicable",
    "OpenCall",
    "Outcome",
    "Result",
    "Rule",
    "Stream",
    "Target",
    "all_rules",
    "rule",
    "run_rule",
    "run_rules",
]
