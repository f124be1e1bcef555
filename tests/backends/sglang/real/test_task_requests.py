"""Embed, Classify and Score requests as ``tasks.TaskRunner`` builds them, admitted by SGLang's real
``TokenizerManager``: the tiny Llama served as an embedding model (``is_embedding``). Causal-model
scoring, on the generation model, is in ``test_score_requests.py`` (SGLang holds one configuration
per process, so the two engines' tests run in separate modules)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openengine_backends.sglang import capabilities, tasks
from openengine_backends.sglang.server_args import server_kwargs
from openengine_gateway import pb
from openengine_gateway.spi import EmbedCall, Media, TaskContext, TaskItem

from .admission import answered, runner, sent_by
from .conftest import CONTEXT_LENGTH, RESERVED_OUTPUT

CONTEXT = TaskContext(request_id="t", model="tiny")


@pytest.fixture(scope="module")
def embedding_manager(server_args: Any, tiny_model: Path) -> Iterator[Any]:
    """A second engine's tokenizer manager, the model served for embeddings; SGLang's process-wide
    configuration is this engine's while the module runs, the generation engine's again after."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.runtime_context import publish, restore_context, snapshot_context
    from sglang.srt.server_args import PortArgs, ServerArgs

    before = snapshot_context()
    options = {"device": "cpu", "context_length": str(CONTEXT_LENGTH), "is_embedding": "true"}
    args = ServerArgs(**server_kwargs(str(tiny_model), options))
    args.resolve_once()
    args.check_server_args()
    publish(args, role="tokenizer")
    try:
        manager = TokenizerManager(args, PortArgs.init_new(args))
        manager.max_req_input_len = manager.context_len - 1 - RESERVED_OUTPUT
        manager.resolved = dict(args.resolved_dict())
        yield manager
    finally:
        restore_context(before)


def test_an_embedding_model_advertises_what_sglang_takes(embedding_manager: Any) -> None:
    state = capabilities.engine_state(embedding_manager, embedding_manager.resolved)
    assert not state.is_generation and not state.classifier
    table = tasks.task_capabilities(state)
    assert table is not None and table.embed.supported
    assert list(table.embed.input_types) == [pb.TASK_INPUT_TYPE_TEXT, pb.TASK_INPUT_TYPE_TOKEN_IDS]
    assert not table.embed.supports_dimension_override, "SGLang refuses dimensions on a non-Matryoshka model"


async def test_embedding_items_are_sglang_requests(embedding_manager: Any) -> None:
    items = (TaskItem("a", text="the quick brown fox"), TaskItem("b", token_ids=(5, 6, 7)))
    call = EmbedCall(context=CONTEXT, items=items)
    rids = ["rid-a", "rid-b"]
    sent = await sent_by(embedding_manager, runner(embedding_manager, embedding_manager.resolved).embed(call, rids))
    by_rid = {tokenized.rid: tokenized for tokenized in sent}
    assert set(by_rid) == set(rids)
    text_ids = embedding_manager.tokenizer("the quick brown fox")["input_ids"]
    assert list(by_rid["rid-a"].input_ids) == list(text_ids)
    assert list(by_rid["rid-b"].input_ids) == [5, 6, 7]
    assert type(sent[0]).__name__ == "TokenizedEmbeddingReqInput"


async def test_dimensions_on_a_model_without_matryoshka_are_sglangs_refusal(embedding_manager: Any) -> None:
    from sglang.srt.managers.io_struct import EmbeddingReqInput

    request = EmbeddingReqInput(rid="d", **tasks.item_kwargs(TaskItem("a", text="fox")), dimensions=8)
    with pytest.raises(ValueError, match="matryoshka"):
        await embedding_manager.generate_request(request, None).__anext__()


async def test_cross_encoder_pairs_are_one_sglang_batch(embedding_manager: Any) -> None:
    """``score`` on a classifier: the pairs, one rid each, as SGLang's rerank path sends them."""
    from sglang.srt.managers.io_struct import EmbeddingReqInput

    pairs = [["what", "a fox"], ["what", "a dog"]]
    batch = EmbeddingReqInput(rid=["p0", "p1"], text=pairs, is_cross_encoder_request=True)
    batch.normalize_batch_and_arguments()
    assert (batch.is_single, batch.batch_size) == (False, 2)
    sent = await sent_by(embedding_manager, embedding_manager.generate_request(batch, None).__anext__())
    first = next(tokenized for tokenized in sent if tokenized.rid == "p0")
    assert list(first.input_ids) == list(embedding_manager.tokenizer("what", "a fox")["input_ids"])


def test_an_image_item_is_one_request() -> None:
    """A multimodal embedding item (the tiny model takes none; SGLang's batching is what is checked)."""
    from sglang.srt.managers.io_struct import EmbeddingReqInput

    image = pb.MODALITY_IMAGE
    for item in (
        TaskItem("a", text="a cat", media=(Media(image, url="https://x/cat.png"),)),
        TaskItem("b", media=(Media(image, url="https://x/a.png"), Media(image, url="https://x/b.png"))),
    ):
        request = EmbeddingReqInput(rid="m", **tasks.item_kwargs(item))
        request.normalize_batch_and_arguments()
        assert (request.is_single, request.batch_size) == (True, 1)


def embedding_answer(values: dict[str, list[float]]) -> Any:
    """The scheduler's ``BatchEmbeddingOutput`` for one pooled request."""
    from sglang.srt.managers.io_struct import BatchEmbeddingOutput
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH

    def answer(tokenized: Any) -> Any:
        return BatchEmbeddingOutput(
            rids=[tokenized.rid],
            finished_reasons=[FINISH_LENGTH(0).to_json()],
            embeddings=[values[tokenized.rid]],
            prompt_tokens=[len(tokenized.input_ids)],
            cached_tokens=[0],
            placeholder_tokens_idx=None,
            placeholder_tokens_val=None,
            retraction_counts=[0],
        )

    return answer


async def test_embeddings_and_usage_from_sglangs_results(embedding_manager: Any) -> None:
    items = (TaskItem("a", text="the quick brown fox"), TaskItem("b", token_ids=(5, 6, 7)))
    values = {"rid-a": [0.25, -0.5, 1.0], "rid-b": [1.5, 0.0, -2.0]}
    work = runner(embedding_manager, embedding_manager.resolved).embed(
        EmbedCall(context=CONTEXT, items=items), list(values)
    )
    outputs, usage = await answered(embedding_manager, work, embedding_answer(values), 2)
    assert [list(output.vector.values) for output in outputs] == [values["rid-a"], values["rid-b"]]
    assert [list(output.vector.shape) for output in outputs] == [[3], [3]]
    text_tokens = len(embedding_manager.tokenizer("the quick brown fox")["input_ids"])
    assert usage.input_tokens == text_tokens + 3


async def test_classification_probabilities_from_sglangs_logits(embedding_manager: Any) -> None:
    from openengine_gateway.spi import ClassifyCall

    call = ClassifyCall(
        context=CONTEXT, items=(TaskItem("a", text="fox"),), semantics=pb.TASK_VALUE_SEMANTICS_PROBABILITIES
    )
    work = runner(embedding_manager, embedding_manager.resolved).classify(call, ["rid-c"])
    outputs, _ = await answered(embedding_manager, work, embedding_answer({"rid-c": [0.0, 0.0]}), 1)
    assert list(outputs[0].scores.values) == pytest.approx([0.5, 0.5])
    assert outputs[0].semantics == pb.TASK_VALUE_SEMANTICS_PROBABILITIES


async def test_an_item_sglang_fails_aborts_its_siblings_inside_sglang(
    embedding_manager: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both items reach the scheduler; it aborts one (a 400, SGLang's ``ValueError``) and the call fails:
    the other is aborted in SGLang too, not left running under an id the gateway has forgotten."""
    from sglang.srt.managers.io_struct import AbortReq, BatchEmbeddingOutput
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    sent: list[Any] = []
    arrived = asyncio.Event()
    dispatched: list[Any] = []

    async def send(tokenized: Any) -> None:
        sent.append(tokenized)
        if len(sent) == 2:
            arrived.set()

    if embedding_manager.event_loop is None:
        embedding_manager.event_loop = asyncio.get_running_loop()
    monkeypatch.setattr(embedding_manager, "_send_one_request", send)
    monkeypatch.setattr(embedding_manager, "_dispatch_to_scheduler", dispatched.append)
    items = (TaskItem("a", text="the quick brown fox"), TaskItem("b", token_ids=(5, 6, 7)))
    work = runner(embedding_manager, embedding_manager.resolved).embed(
        EmbedCall(context=CONTEXT, items=items), ["rid-a", "rid-b"]
    )
    task = asyncio.ensure_future(work)
    await asyncio.wait_for(arrived.wait(), timeout=10)
    refused = BatchEmbeddingOutput(
        rids=["rid-b"],
        finished_reasons=[FINISH_ABORT("the item is refused", 400).to_json()],
        embeddings=[[]],
        prompt_tokens=[3],
        cached_tokens=[0],
        placeholder_tokens_idx=None,
        placeholder_tokens_val=None,
        retraction_counts=[0],
    )
    await embedding_manager._handle_batch_output(refused)
    with pytest.raises(ValueError, match="refused"):
        await asyncio.wait_for(task, timeout=10)
    assert [req.rid for req in dispatched if isinstance(req, AbortReq)] == ["rid-a"]
    embedding_manager.rid_to_state.pop("rid-a", None)  # what the scheduler's answer to the abort would do
