"""Guided decoding: advertised modes constrain the output; unadvertised ones are rejected."""

from __future__ import annotations

import json
import re

import grpc

from ... import pb
from ..kit import CheckFailed, NotApplicable, Target, rule
from ..observe import advertised

SECTION = "Generation API"
_TEXT = (
    "Guided decoding stays top-level as a distinct structured-output mode; GuidedDecodingCapabilities advertises "
    "the modes the engine constrains generation with."
)
_BUDGET = 32

_SCHEMA = {"type": "string", "enum": ["yes", "no"]}
_PROBES: dict[pb.GuidedDecodingMode.ValueType, tuple[pb.GuidedDecoding, str]] = {
    pb.GUIDED_DECODING_MODE_REGEX: (pb.GuidedDecoding(regex="(ab|ba){2}c"), "regex"),
    pb.GUIDED_DECODING_MODE_CHOICE: (
        pb.GuidedDecoding(choice=pb.ChoiceConstraint(choices=["alpha", "beta"])),
        "choice",
    ),
    pb.GUIDED_DECODING_MODE_JSON_SCHEMA: (pb.GuidedDecoding(json_schema=json.dumps(_SCHEMA)), "json_schema"),
    pb.GUIDED_DECODING_MODE_JSON_OBJECT: (pb.GuidedDecoding(json_object=pb.JsonObjectConstraint()), "json_object"),
    pb.GUIDED_DECODING_MODE_EBNF_GRAMMAR: (pb.GuidedDecoding(ebnf_grammar='root ::= "yes" | "no"'), "ebnf"),
    pb.GUIDED_DECODING_MODE_STRUCTURAL_TAG: (pb.GuidedDecoding(structural_tag="{}"), "structural_tag"),
}


def _conforms(mode: pb.GuidedDecodingMode.ValueType, text: str) -> bool:
    if mode == pb.GUIDED_DECODING_MODE_REGEX:
        return re.fullmatch("(ab|ba){2}c", text) is not None
    if mode == pb.GUIDED_DECODING_MODE_CHOICE:
        return text in ("alpha", "beta")
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if mode == pb.GUIDED_DECODING_MODE_JSON_SCHEMA:
        return value in ("yes", "no")
    return isinstance(value, dict)


def _advertised(target: Target) -> list[pb.GuidedDecodingMode.ValueType]:
    guided = target.model_info.generation.guided_decoding
    return list(guided.modes) if advertised(guided, "supported") else []


async def _constrains(target: Target, mode: pb.GuidedDecodingMode.ValueType) -> None:
    target.require_generation()
    target.require(mode in _advertised(target), f"guided decoding with {pb.GuidedDecodingMode.Name(mode)}")
    guide, name = _PROBES[mode]
    request = target.prompt(temperature=0.0, max_tokens=_BUDGET)
    request.guided.CopyFrom(guide)
    stream = (await target.run(request)).succeeded()
    text = stream.text()
    if stream.finished().reason == pb.FINISH_REASON_LENGTH:
        if mode in (pb.GUIDED_DECODING_MODE_REGEX, pb.GUIDED_DECODING_MODE_CHOICE):
            raise CheckFailed(f"{name}: the guide completes in a few tokens but the output ran to max_tokens: {text!r}")
        raise NotApplicable(f"{name}: the output did not complete within {_BUDGET} tokens")
    if not _conforms(mode, text):
        raise CheckFailed(f"{name}: output {text!r} does not satisfy the guide")


@rule("guided.regex", SECTION, _TEXT)
async def regex(target: Target) -> None:
    await _constrains(target, pb.GUIDED_DECODING_MODE_REGEX)


@rule("guided.choice", SECTION, _TEXT)
async def choice(target: Target) -> None:
    await _constrains(target, pb.GUIDED_DECODING_MODE_CHOICE)


@rule("guided.json-schema", SECTION, _TEXT)
async def json_schema(target: Target) -> None:
    await _constrains(target, pb.GUIDED_DECODING_MODE_JSON_SCHEMA)


@rule("guided.json-object", SECTION, _TEXT + " Select JSON-object guidance with json_object {}.")
async def json_object(target: Target) -> None:
    await _constrains(target, pb.GUIDED_DECODING_MODE_JSON_OBJECT)


@rule(
    "guided.unadvertised-rejected",
    "Model and capacity metadata",
    "Capability submessages distinguish unreported support (message absent) from reported support or lack of "
    "support (supported = true or false); a guide mode the model does not advertise is not accepted.",
)
async def unadvertised_rejected(target: Target) -> None:
    target.require_generation()
    target.require(
        target.model_info.generation.HasField("guided_decoding"),
        "its guided decoding capability (absent is unreported, not unsupported)",
    )
    advertised = _advertised(target)
    missing = [mode for mode in _PROBES if mode not in advertised]
    target.require(bool(missing), "a guided decoding mode it does not support")
    for mode in missing:
        request = target.prompt(max_tokens=2)
        request.guided.CopyFrom(_PROBES[mode][0])
        name = pb.GuidedDecodingMode.Name(mode)
        await target.expect_rejected(request, grpc.StatusCode.INVALID_ARGUMENT, what=f"unadvertised guide {name}")


__all__: list[str] = []
