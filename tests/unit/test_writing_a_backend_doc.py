"""docs/writing-a-backend.md answers from what the code does: every ModelInfo field, the neutral
sampling values, the pytest settings the example uses, the encoder's rules on empty deltas and late usage."""

from __future__ import annotations

import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

from openengine_gateway import pb
from openengine_gateway.contract.stream import GenerateEncoder
from openengine_gateway.spi import (
    Backend,
    BackendSettings,
    EngineFacts,
    EventStream,
    GenerationEvent,
    GenerationRequest,
    OutputFinished,
    Sampling,
    StopMatch,
    TokenDelta,
    TokenRecord,
    UsageReport,
    results,
)
from openengine_gateway.testing import serve_backends

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "writing-a-backend.md").read_text()


def _table_rows(heading: str) -> list[str]:
    section = GUIDE.split(heading, 1)[1].split("\n#", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_every_model_info_field_is_in_the_table() -> None:
    rows = _table_rows("### ModelInfo, field by field")
    table, generation = "\n".join(rows), "\n".join(row for row in rows if row.startswith("| `generation."))
    undocumented = [
        f.name for f in pb.ModelInfo.DESCRIPTOR.fields if f.name != "generation" and f"`{f.name}`" not in table
    ]
    undocumented += [
        f"generation.{f.name}" for f in pb.GenerationCapabilities.DESCRIPTOR.fields if f.name not in generation
    ]
    assert undocumented == []


def test_every_result_value_is_in_the_results_table() -> None:
    table = "\n".join(_table_rows("## Results (`spi.results`)"))
    assert [name for name in results.__all__ if f"`{name}(" not in table] == []


def test_the_neutral_values_are_the_codes() -> None:
    assert Sampling.NEUTRAL == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "repetition_penalty": 1.0,
    }
    assert "(temperature 1, top_p 1, top_k 0, min_p 0" in GUIDE
    assert set(Sampling.NEUTRAL) == set(Sampling.KNOBS)


def test_the_pytest_settings_are_the_examples() -> None:
    block = GUIDE.split("```toml\n[tool.pytest.ini_options]\n", 1)[1].split("```", 1)[0]
    documented = tomllib.loads(block)
    example = tomllib.loads((ROOT / "examples" / "openengine-echo-backend" / "pyproject.toml").read_text())
    settings = example["tool"]["pytest"]["ini_options"]
    assert {key: settings[key] for key in documented} == documented


def test_an_empty_delta_sends_nothing_and_a_text_only_delta_is_a_message() -> None:
    encoder = GenerateEncoder("r", num_outputs=1, prefill=False, prompt_logprobs=False)
    assert encoder.encode(TokenDelta(0, [])) is None
    assert encoder.encode(TokenDelta(0, [TokenRecord(5)])) is not None
    message = encoder.encode(TokenDelta(0, [], "held back"))
    assert message is not None and message.token.text == "held back" and not message.token.tokens


def test_the_final_finish_carries_the_last_usage_report_before_it() -> None:
    encoder = GenerateEncoder("r", num_outputs=1, prefill=False, prompt_logprobs=False)
    encoder.encode(TokenDelta(0, [TokenRecord(5)], "a"))
    encoder.encode(UsageReport(3, 2))  # a dropped stop token counted too: more than the records sent
    final = encoder.encode(OutputFinished(0, pb.FINISH_REASON_STOP, StopMatch.token(9)))
    assert final is not None and final.usage.completion_tokens == 2 and encoder.done


class _LateUsage(Backend):
    """Reports usage once before its final finish, and again after it."""

    name = "late-usage"
    Settings = BackendSettings

    async def start(self) -> EngineFacts:
        return EngineFacts("late-usage", "1", pb.ModelInfo(max_context_length=64, supports_token_ids_input=True))

    async def stop(self) -> None:
        return None

    def generate(self, request: GenerationRequest) -> EventStream:
        return EventStream.from_iterator(self._events())

    async def _events(self) -> AsyncIterator[GenerationEvent]:
        yield TokenDelta(0, [TokenRecord(5)], "a")
        yield UsageReport(3, 1)
        yield OutputFinished(0, pb.FINISH_REASON_LENGTH)
        yield UsageReport(3, 99)  # after the final event: never read

    async def abort(self, request_id: str) -> None:
        return None


async def test_a_usage_report_after_the_final_finish_is_not_read() -> None:
    async with serve_backends([("late", _LateUsage(BackendSettings()))]) as running:
        request = pb.GenerateRequest(request_id="r", model="late", token_ids=pb.TokenIds(ids=[1, 2, 3]))
        messages = [message async for message in running.stub.Generate(request)]
    assert [m.WhichOneof("event") for m in messages] == ["token", "finished"]
    assert messages[-1].usage.completion_tokens == 1


def _method_table() -> dict[str, tuple[str, str, str]]:
    """The guide's Backend method table: name -> (parameters, return as written, required)."""
    import re

    rows = _table_rows("| method | required |")
    methods: dict[str, tuple[str, str, str]] = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        for entry in re.findall(r"`([a-z_]+)(?:\(([^)]*)\))?(?: -> ([^`]+))?`", cells[0]):
            methods[entry[0]] = (entry[1], entry[2], cells[1])
    return methods


def test_the_method_table_is_the_backend_class() -> None:
    """Every method a driver can implement is in the table, required exactly when it is abstract,
    with the parameter names and the return type of its signature where the row gives them."""
    import inspect

    table = _method_table()
    own = {name: member for name, member in vars(Backend).items() if inspect.isfunction(member)}
    public = {name for name in own if not name.startswith("_")}
    assert set(table) == public, "a method of Backend is missing from the guide's table, or the table names one gone"
    for name, (parameters, returns, required) in table.items():
        signature = inspect.signature(own[name])
        assert required == ("yes" if getattr(own[name], "__isabstractmethod__", False) else "no"), name
        if parameters:
            assert parameters.split(", ") == list(signature.parameters)[1:], name
        if returns:
            assert returns == signature.return_annotation, name


def test_every_name_of_the_spi_is_in_the_guide() -> None:
    from openengine_gateway import spi

    assert [name for name in spi.__all__ if f"`{name}" not in GUIDE and f"{name}`" not in GUIDE] == []


def test_the_values_table_is_their_docstrings() -> None:
    from openengine_gateway import spi

    for row in _table_rows("## Values (`spi.requests`, `spi.events`)"):
        name, text = (cell.strip() for cell in row.strip("|").split("|"))
        docstring = getattr(spi, name.strip("`")).__doc__
        assert text == " ".join(docstring.strip().split("\n\n")[0].split()), (
            f"{name}: the guide and the docstring differ"
        )
