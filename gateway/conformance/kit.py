"""The conformance kit: spec rules as checks that run against any OpenEngine endpoint.

A ``Rule`` quotes one normative sentence of the contract and carries an async check that
exercises it over real gRPC through a ``Target``. A check passes by returning, fails by
raising ``CheckFailed`` (or any ``AssertionError``), and is *not applicable* by raising
``NotApplicable`` when the server does not advertise what the rule needs: a conformance
report never turns "unsupported" into "failed".

Checks are grouped by contract area in ``conformance.checks``; importing that package
registers them. Disruptive checks (a Drain that stops admission) run only when asked, last.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from .. import pb
from ..client import OpenEngineClient, StatusError


class CheckFailed(AssertionError):
    """The server broke the rule; the message says how."""


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
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    @classmethod
    async def open(cls, client: OpenEngineClient, model: str = "", *, timeout_s: float = 60.0) -> Target:
        """Describe ``model`` (default: the first supported model) on a connected client."""
        info = client.engine_info or await client.get_engine_info()
        if not model:
            if not info.supported_models:
                raise CheckFailed("EngineInfo.supported_models is empty")
            model = info.supported_models[0]
        return cls(client, info, model, await client.model_info(model), timeout_s)

    @property
    def role(self) -> int:
        """The engine's role."""
        return self.engine_info.role

    def request_id(self, label: str = "check") -> str:
        """A fresh request id that no other check uses."""
        return f"conformance-{label}-{uuid.uuid4().hex[:12]}-{next(self._ids)}"

    def prompt(self, **options: object) -> pb.GenerateRequest:
        """A valid generation request for the model: text when accepted, else token ids."""
        request = pb.GenerateRequest(request_id=self.request_id("gen"), model=self.model)
        info = self.model_info
        if not info.HasField("supports_text_input") or info.supports_text_input:
            request.prompt = "The quick brown fox jumps over the lazy dog."
        else:
            request.token_ids.ids.extend([1, 2, 3, 4, 5, 6, 7, 8])
        for name, value in options.items():
            group = next(
                (
                    g
                    for g in (request.sampling, request.stopping, request.response, request.kv)
                    if name in g.DESCRIPTOR.fields_by_name
                ),
                None,
            )
            if group is None:
                raise TypeError(f"unknown generation option {name!r}")
            setattr(group, name, value)
        return request

    def require(self, condition: bool, what: str) -> None:
        """``NotApplicable`` unless the server advertises ``what``."""
        if not condition:
            raise NotApplicable(f"the server does not advertise {what}")

    def require_role(self, *roles: int) -> None:
        """``NotApplicable`` unless the engine has one of ``roles``."""
        if self.role not in roles:
            names = ", ".join(pb.EngineRole.Name(r) for r in roles)
            raise NotApplicable(f"the rule applies to {names} engines; this one is {pb.EngineRole.Name(self.role)}")

    async def collect(self, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
        """Every response of a Generate call (a non-OK status raises ``StatusError``)."""
        return [m async for m in self.client.stream(request, timeout_s=self.timeout_s)]

    async def expect_status(self, call: Awaitable[object], *codes: object, what: str) -> StatusError:
        """Await ``call`` and require a non-OK status among ``codes``."""
        try:
            await call
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


async def run_rule(rule_: Rule, target: Target) -> Result:
    """Run one rule's check, with the target's timeout."""
    start = time.perf_counter()
    try:
        await asyncio.wait_for(rule_.check(target), target.timeout_s)
        outcome, message = Outcome.PASSED, ""
    except NotApplicable as exc:
        outcome, message = Outcome.NOT_APPLICABLE, str(exc)
    except AssertionError as exc:
        outcome, message = Outcome.FAILED, str(exc) or "assertion failed"
    except TimeoutError:
        outcome, message = Outcome.FAILED, f"no result within {target.timeout_s:g}s"
    except StatusError as exc:
        outcome, message = Outcome.FAILED, f"unexpected status {exc.code.name}: {exc.details}"
    except Exception as exc:  # broad on purpose: an unexpected error is a failed rule, not a crash
        outcome, message = Outcome.FAILED, f"{type(exc).__name__}: {exc}"
    return Result(rule_, outcome, message, time.perf_counter() - start)


async def run_rules(target: Target, rules: Sequence[Rule]) -> list[Result]:
    """Run rules one after another (checks may observe server-wide state)."""
    return [await run_rule(r, target) for r in rules]


__all__ = [
    "RULES",
    "Check",
    "CheckFailed",
    "NotApplicable",
    "Outcome",
    "Result",
    "Rule",
    "Target",
    "all_rules",
    "rule",
    "run_rule",
    "run_rules",
]
