"""Classify: one scores tensor per input, with reported semantics, aligned labels and token ids."""

from __future__ import annotations

import grpc

from ... import pb
from ..kit import CheckFailed, Target, rule
from ..observe import check_dense
from .tasks import build, item, require_task, unadvertised

SECTION = "Classification"
_INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _output(output: pb.ClassificationOutput, caps: pb.ClassifyCapabilities, where: str) -> list[int]:
    """Check one output's semantics, tensor, labels and token ids; its shape."""
    if output.semantics == pb.TASK_VALUE_SEMANTICS_UNSPECIFIED:
        raise CheckFailed(f"{where}: semantics is UNSPECIFIED; the engine reports the actual semantics")
    shape = check_dense(output.scores, where)
    if caps.HasField("max_output_values_per_item") and len(output.scores.values) > caps.max_output_values_per_item:
        raise CheckFailed(f"{where}: more values than max_output_values_per_item {caps.max_output_values_per_item}")
    if output.granularity == pb.TASK_OUTPUT_GRANULARITY_SEQUENCE and len(shape) != 1:
        raise CheckFailed(f"{where}: sequence classification has shape [class_count], got {shape}")
    if output.granularity == pb.TASK_OUTPUT_GRANULARITY_TOKEN:
        if len(shape) != 2:
            raise CheckFailed(f"{where}: token classification has shape [token_count, class_count], got {shape}")
        if output.token_ids and len(output.token_ids) != shape[0]:
            raise CheckFailed(f"{where}: {len(output.token_ids)} token_ids for {shape[0]} token rows")
    if output.labels and len(output.labels) != shape[-1]:
        raise CheckFailed(f"{where}: {len(output.labels)} labels for {shape[-1]} classes")
    values = output.scores.values
    if output.semantics == pb.TASK_VALUE_SEMANTICS_PROBABILITIES and not all(-1e-6 <= v <= 1 + 1e-6 for v in values):
        raise CheckFailed(f"{where}: PROBABILITIES outside [0, 1]")
    if output.semantics == pb.TASK_VALUE_SEMANTICS_LOG_PROBABILITIES and not all(v <= 1e-6 for v in values):
        raise CheckFailed(f"{where}: LOG_PROBABILITIES above 0")
    return shape


async def _classify(
    target: Target, caps: pb.ClassifyCapabilities, options: pb.ClassifyOptions | None = None
) -> pb.ClassifyResponse:
    request = build(target, "classify", caps)
    if options is not None:
        request.options.CopyFrom(options)
    response = await target.client.classify(request)
    if len(response.outputs) != len(request.inputs):
        raise CheckFailed(f"{len(response.outputs)} outputs for {len(request.inputs)} inputs")
    for index, output in enumerate(response.outputs):
        _output(output, caps, f"outputs[{index}]")
    return response


@rule(
    "classify.one-output-per-input",
    SECTION,
    "Outputs preserve request order and correlation. A successful response contains exactly one output for every "
    "request input, and input_index is present even for index zero.",
)
async def one_output_per_input(target: Target) -> None:
    caps = require_task(target, "classify")
    inputs = [item(target, caps, name, name) for name in ("first", "second", "third")]
    response = await target.client.classify(build(target, "classify", caps, inputs))
    ids = [o.item_id for o in response.outputs]
    if ids != ["first", "second", "third"]:
        raise CheckFailed(f"outputs {ids} do not preserve the request order of items first, second, third")
    for index, output in enumerate(response.outputs):
        if not output.HasField("input_index") or output.input_index != index:
            shown = output.input_index if output.HasField("input_index") else "absent"
            raise CheckFailed(f"outputs[{index}].input_index is {shown}, expected {index}")
        _output(output, caps, f"outputs[{index}]")


@rule(
    "classify.reported-semantics",
    SECTION,
    "The engine reports the actual non-UNSPECIFIED semantics. Sequence classification has shape [class_count]; "
    "token classification has shape [token_count, class_count]. When labels are returned, their count equals "
    "class_count and their order matches the final tensor dimension.",
)
async def reported_semantics(target: Target) -> None:
    caps = require_task(target, "classify")
    await _classify(target, caps)
    for granularity in caps.granularities:
        response = await _classify(target, caps, pb.ClassifyOptions(granularity=granularity))
        if {o.granularity for o in response.outputs} != {granularity}:
            raise CheckFailed(f"requested {pb.TaskOutputGranularity.Name(granularity)}, outputs report otherwise")


@rule(
    "classify.explicit-options",
    "Non-generative task API",
    "The server rejects ... malformed input or unsupported explicit options with INVALID_ARGUMENT; an advertised "
    "explicit output_semantics or granularity is what the engine returns.",
)
async def explicit_options(target: Target) -> None:
    caps = require_task(target, "classify")
    for semantics in caps.semantics:
        response = await _classify(target, caps, pb.ClassifyOptions(output_semantics=semantics))
        if {o.semantics for o in response.outputs} != {semantics}:
            raise CheckFailed(f"requested {pb.TaskValueSemantics.Name(semantics)}, outputs report otherwise")
    probes = {
        "output_semantics": unadvertised(pb.TaskValueSemantics.values(), caps.semantics),
        "granularity": unadvertised(pb.TaskOutputGranularity.values(), caps.granularities),
    }
    for option, values in probes.items():
        if not values:
            continue
        request = build(target, "classify", caps)
        setattr(request.options, option, values[0])
        await target.expect_status(target.client.classify(request), _INVALID, what=f"an unadvertised {option}")


__all__: list[str] = []
