"""Embed: one well-formed tensor per input, in order; explicit options implemented exactly or rejected."""

from __future__ import annotations

import math
from typing import Any

import grpc

from ... import pb
from ...client import StatusError
from ..kit import CheckFailed, Target, rule
from ..observe import advertised, check_dense, check_sparse, rows
from .tasks import build, item, require_task, unadvertised

SECTION = "Embedding"
_EXACT = "An explicit granularity, normalization, or encoding request must be implemented exactly or rejected."
_INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _tensor(output: pb.EmbeddingOutput, caps: pb.EmbedCapabilities, where: str) -> tuple[list[int], list[float]]:
    """Check an output's tensor (and the advertised value limit); its shape and values."""
    kind = output.WhichOneof("embedding")
    if kind is None:
        raise CheckFailed(f"{where}: no embedding tensor")
    tensor = getattr(output, kind)
    shape = check_dense(tensor, where) if kind == "dense" else check_sparse(tensor, where)
    count = len(tensor.values)
    if caps.HasField("max_output_values_per_item") and count > caps.max_output_values_per_item:
        raise CheckFailed(
            f"{where}: {count} values exceed max_output_values_per_item {caps.max_output_values_per_item}"
        )
    granularity = output.granularity
    if granularity == pb.TASK_OUTPUT_GRANULARITY_SEQUENCE and len(shape) != 1:
        raise CheckFailed(f"{where}: a sequence embedding has shape [dimension], got {shape}")
    if granularity == pb.TASK_OUTPUT_GRANULARITY_TOKEN:
        if len(shape) != 2:
            raise CheckFailed(f"{where}: a token embedding has shape [token_count, dimension], got {shape}")
        if output.token_ids and len(output.token_ids) != shape[0]:
            raise CheckFailed(f"{where}: {len(output.token_ids)} token_ids for {shape[0]} token rows")
    return shape, list(tensor.values)


async def _embed(target: Target, caps: pb.EmbedCapabilities, **options: Any) -> pb.EmbedResponse:
    request = build(target, "embed", caps)
    request.options.CopyFrom(pb.EmbedOptions(**options))
    response = await target.client.embed(request)
    if len(response.outputs) != len(request.inputs):
        raise CheckFailed(f"{len(response.outputs)} outputs for {len(request.inputs)} inputs")
    for index, output in enumerate(response.outputs):
        _tensor(output, caps, f"outputs[{index}]")
    return response


@rule(
    "embed.one-output-per-input",
    SECTION,
    "Outputs preserve request order, and input_index is present even for index zero and identifies the matching "
    "input. A successful response contains exactly one output for every request input.",
)
async def one_output_per_input(target: Target) -> None:
    caps = require_task(target, "embed")
    inputs = [item(target, caps, name, name) for name in ("first", "second", "third")]
    request = build(target, "embed", caps, inputs)
    response = await target.client.embed(request)
    ids = [o.item_id for o in response.outputs]
    if ids != ["first", "second", "third"]:
        raise CheckFailed(f"outputs {ids} do not preserve the request order of items first, second, third")
    for index, output in enumerate(response.outputs):
        if not output.HasField("input_index") or output.input_index != index:
            shown = output.input_index if output.HasField("input_index") else "absent"
            raise CheckFailed(f"outputs[{index}].input_index is {shown}, expected {index}")
        _tensor(output, caps, f"outputs[{index}]")


@rule(
    "embed.native-dimension",
    "Task capability discovery",
    "dimension is present only when a model has one fixed native embedding dimension. Sequence embeddings have "
    "shape [dimension].",
)
async def native_dimension(target: Target) -> None:
    caps = require_task(target, "embed")
    target.require(caps.HasField("dimension"), "a native embedding dimension")
    granularity = (
        pb.TASK_OUTPUT_GRANULARITY_SEQUENCE if pb.TASK_OUTPUT_GRANULARITY_SEQUENCE in caps.granularities else None
    )
    known = (pb.EMBEDDING_ENCODING_DENSE, pb.EMBEDDING_ENCODING_SPARSE)
    encodings: list[pb.EmbeddingEncoding.ValueType | None] = [e for e in known if e in caps.encodings]
    for encoding in encodings or [None]:  # None: the model's default encoding
        response = await _embed(target, caps, granularity=granularity, encoding=encoding)
        for index, output in enumerate(response.outputs):
            kind = output.WhichOneof("embedding")
            shape = list(output.dense.shape if kind == "dense" else output.sparse.shape)
            if output.granularity == pb.TASK_OUTPUT_GRANULARITY_SEQUENCE and shape != [caps.dimension]:
                raise CheckFailed(f"{kind} outputs[{index}]: shape {shape}, native dimension {caps.dimension}")


@rule("embed.explicit-granularity", SECTION, _EXACT)
async def explicit_granularity(target: Target) -> None:
    caps = require_task(target, "embed")
    for granularity in (pb.TASK_OUTPUT_GRANULARITY_SEQUENCE, pb.TASK_OUTPUT_GRANULARITY_TOKEN):
        name = pb.TaskOutputGranularity.Name(granularity)
        if granularity in unadvertised([granularity], caps.granularities):
            request = build(target, "embed", caps)
            request.options.granularity = granularity
            await target.expect_status(target.client.embed(request), _INVALID, what=f"unadvertised {name}")
        if granularity not in caps.granularities:
            continue
        response = await _embed(target, caps, granularity=granularity)
        reported = {o.granularity for o in response.outputs}
        if reported != {granularity}:
            raise CheckFailed(f"requested {name}, outputs report {sorted(reported)}")


@rule("embed.explicit-encoding", SECTION, _EXACT)
async def explicit_encoding(target: Target) -> None:
    caps = require_task(target, "embed")
    for encoding, kind in ((pb.EMBEDDING_ENCODING_DENSE, "dense"), (pb.EMBEDDING_ENCODING_SPARSE, "sparse")):
        name = pb.EmbeddingEncoding.Name(encoding)
        if encoding in unadvertised([encoding], caps.encodings):
            request = build(target, "embed", caps)
            request.options.encoding = encoding
            await target.expect_status(target.client.embed(request), _INVALID, what=f"unadvertised {name}")
        if encoding not in caps.encodings:
            continue
        response = await _embed(target, caps, encoding=encoding)
        got = {o.WhichOneof("embedding") for o in response.outputs}
        if got != {kind}:
            raise CheckFailed(f"requested {name}, got {sorted(map(str, got))} tensors")


@rule("embed.explicit-normalization", SECTION, _EXACT)
async def explicit_normalization(target: Target) -> None:
    caps = require_task(target, "embed")
    dense = pb.EMBEDDING_ENCODING_DENSE if pb.EMBEDDING_ENCODING_DENSE in caps.encodings else None
    try:
        response = await _embed(target, caps, normalize=True, encoding=dense)
    except StatusError as error:
        if error.code != _INVALID:
            raise CheckFailed(f"normalize=true was rejected with {error.code.name}, not INVALID_ARGUMENT") from None
        if advertised(caps, "supports_normalization"):
            raise CheckFailed("normalize=true was rejected although supports_normalization is advertised") from None
        return
    for index, output in enumerate(response.outputs):
        if output.WhichOneof("embedding") != "dense":
            continue
        for vector in rows(output.dense.values, output.dense.shape):
            norm = math.sqrt(sum(v * v for v in vector))
            if not math.isclose(norm, 1.0, rel_tol=1e-3):
                raise CheckFailed(f"outputs[{index}]: normalize=true returned a vector of L2 norm {norm:.6f}")


@rule(
    "embed.dimensions",
    SECTION,
    "dimensions must be greater than zero and requests dimensionality reduction; it does not permit padding a "
    "smaller model output.",
)
async def dimensions(target: Target) -> None:
    caps = require_task(target, "embed")
    zero = build(target, "embed", caps)
    zero.options.dimensions = 0
    await target.expect_status(target.client.embed(zero), _INVALID, what="dimensions = 0")
    dense = pb.EMBEDDING_ENCODING_DENSE if pb.EMBEDDING_ENCODING_DENSE in caps.encodings else None
    native = (await _embed(target, caps, encoding=dense)).outputs[0]
    shape = list(native.dense.shape if native.WhichOneof("embedding") == "dense" else native.sparse.shape)
    larger = build(target, "embed", caps)
    larger.options.dimensions = shape[-1] + 1
    await target.expect_status(target.client.embed(larger), _INVALID, what="dimensions above the native dimension")
    if shape[-1] < 2:
        return
    reduced = max(1, shape[-1] // 2)
    try:
        response = await _embed(target, caps, dimensions=reduced, encoding=dense)
    except StatusError as error:
        if advertised(caps, "supports_dimension_override"):
            raise CheckFailed(f"dimensions={reduced} was rejected ({error.code.name}) although advertised") from None
        return
    for index, output in enumerate(response.outputs):
        got = list(output.dense.shape if output.WhichOneof("embedding") == "dense" else output.sparse.shape)
        if got[-1] != reduced:
            raise CheckFailed(f"outputs[{index}]: dimensions={reduced} returned shape {got}")


__all__: list[str] = []
