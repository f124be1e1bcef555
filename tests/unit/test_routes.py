"""``routes``: splits chosen by weight and sticky key, mirrors, and what a table refuses."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from openengine_gateway import pb
from openengine_gateway.config import MirrorSection, SplitSection
from openengine_gateway.engines import EngineSet
from openengine_gateway.errors import ConfigurationError, InvalidArgument, NotFound

from tests.fakes import FakeBackend, engine_set


def _fake(*, tokenizer: str | None = "bytes", role: int = pb.ENGINE_ROLE_AGGREGATED, **model: object) -> FakeBackend:
    backend = FakeBackend(model=pb.ModelInfo(**model), role=role)  # type: ignore[arg-type]
    backend.facts.tokenizer_id = tokenizer
    return backend


def _three() -> EngineSet:
    return engine_set((_fake(), "a"), (_fake(), "b", ["bee"]), (_fake(), "c"))


def _split(engines: dict[str, int], name: str = "ab", **options: object) -> SplitSection:
    return SplitSection.model_validate({"name": name, "engines": engines, **options})


def test_a_split_name_is_served_beside_the_engines_names() -> None:
    engines = _three()
    engines.reroute([_split({"a": 1, "b": 1}, aliases=["x"])], [])
    assert engines.served_names == ["a", "b", "bee", "c", "ab", "x"]
    route = engines.route("x")
    assert route.name == "ab" and route.is_split
    assert [e.served_name for e in route.engines] == ["a", "b"]
    assert route.model_info.served_model_name == "ab" and list(route.model_info.served_model_aliases) == ["x"]
    assert not engines.route("a").is_split and engines.route("bee").engines == (engines.engine("b"),)


def test_weights_share_requests_within_binomial_bounds() -> None:
    engines = _three()
    route = engines.reroute([_split({"a": 90, "b": 10, "c": 0})], []).get("ab")
    assert route is not None
    picks = Counter(route.pick().served_name for _ in range(4000))
    assert picks["c"] == 0
    spread = 4 * math.sqrt(4000 * 0.9 * 0.1)
    assert abs(picks["a"] - 3600) < spread, picks


def test_a_sticky_key_always_reaches_the_same_engine_and_keys_spread_by_weight() -> None:
    engines = _three()
    route = engines.reroute([_split({"a": 3, "b": 1})], []).get("ab")
    assert route is not None
    for key in ("s1", "s2", "s3"):
        first = route.pick(metadata={"session": key})
        assert all(route.pick(metadata={"session": key}) is first for _ in range(20))
    share = Counter(route.pick(metadata={"session": f"k{i}"}).served_name for i in range(4000))
    assert abs(share["a"] - 3000) < 4 * math.sqrt(4000 * 0.75 * 0.25), share


def test_sticky_sources_go_in_order_and_cache_salt_counts() -> None:
    engines = _three()
    route = engines.reroute([_split({"a": 1, "b": 1}, sticky=["metadata.user", "cache_salt"])], []).get("ab")
    assert route is not None
    assert route.sticky_key("salt", {"user": "u1"}) == "metadata.user=u1"
    assert route.sticky_key("salt", {"session": "s"}) == "cache_salt=salt"
    assert route.sticky_key(None, {"session": "s"}) is None
    assert route.sticky_key("", {}) is None


def test_a_weight_change_moves_only_the_keys_it_must() -> None:
    engines = _three()
    before = engines.reroute([_split({"a": 1, "b": 1, "c": 1})], []).get("ab")
    after = engines.reroute([_split({"a": 1, "b": 1, "c": 0})], []).get("ab")
    assert before is not None and after is not None
    for i in range(500):
        key = {"session": f"k{i}"}
        was = before.pick(metadata=key).served_name
        if was != "c":
            assert after.pick(metadata=key).served_name == was  # only c's keys move


def test_a_rank_picks_the_split_engine_that_owns_it() -> None:
    first = FakeBackend(parallelism=pb.ParallelismInfo(data_parallel_size=2))
    first.facts.tokenizer_id = "t"
    second = _fake(tokenizer="t")
    engines = engine_set((first, "a"), (second, "b"))
    route = engines.reroute([_split({"a": 1, "b": 1})], []).get("ab")
    assert route is not None
    assert route.by_rank(1).served_name == "a" and route.by_rank(2).served_name == "b"
    with pytest.raises(InvalidArgument, match="belongs to no engine of 'ab'"):
        route.by_rank(3)


def test_token_ids_are_refused_where_the_tokenizers_differ() -> None:
    engines = engine_set((_fake(tokenizer="x"), "a"), (_fake(tokenizer="y"), "b"), (_fake(tokenizer=None), "c"))
    table = engines.reroute([_split({"a": 1, "b": 1}), _split({"a": 1}, name="solo")], [])
    route = table.get("ab")
    assert route is not None and not route.same_tokenizer
    assert not route.model_info.supports_token_ids_input
    route.check_token_ids(pb.GenerateRequest(prompt="hi"))
    with pytest.raises(InvalidArgument, match=r"tokenizers differ.*token_ids"):
        route.check_token_ids(pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 2])))
    solo = table.get("solo")
    assert solo is not None and solo.same_tokenizer


def test_unknown_tokenizers_count_as_different() -> None:
    engines = engine_set((_fake(tokenizer=None), "a"), (_fake(tokenizer=None), "b"))
    route = engines.reroute([_split({"a": 1, "b": 1})], []).get("ab")
    assert route is not None and not route.same_tokenizer


def test_a_mirror_covers_every_name_of_its_route() -> None:
    engines = _three()
    table = engines.reroute([], [MirrorSection(name="bee", shadow="c", percent=50, max_in_flight=3)])
    for name in ("b", "bee"):
        route = table.get(name)
        assert route is not None and route.mirror is not None
        assert route.mirror.shadow.served_name == "c" and route.mirror.share == 0.5 and route.mirror.max_in_flight == 3
    assert table.get("a") is not None and table.get("a").mirror is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("splits", "mirrors", "match"),
    [
        ([_split({"a": 1, "zz": 1})], [], r"splits\[0\] \(ab\): no engine is served as 'zz'"),
        ([_split({"b": 1, "bee": 1})], [], "engine 'b' is listed twice"),
        ([_split({"a": 1}, name="c")], [], r"splits\[0\]: model name 'c' is served twice"),
        ([_split({"a": 1}), _split({"b": 1})], [], r"splits\[1\]: model name 'ab' is served twice"),
        ([], [MirrorSection(name="nope", shadow="c")], r"mirrors\[0\] \(nope -> c\): 'nope' is not a served name"),
        ([], [MirrorSection(name="a", shadow="zz")], "no engine is served as 'zz'"),
        ([], [MirrorSection(name="a", shadow="a")], "the shadow 'a' already serves 'a'"),
        (
            [],
            [MirrorSection(name="a", shadow="b"), MirrorSection(name="a", shadow="c")],
            r"mirrors\[1\].*'a' is mirrored twice",
        ),
    ],
)
def test_a_bad_table_is_refused_and_changes_nothing(
    splits: list[SplitSection], mirrors: list[MirrorSection], match: str
) -> None:
    engines = _three()
    kept = engines.reroute([_split({"a": 1, "c": 1}, name="kept")], [])
    with pytest.raises(ConfigurationError, match=match):
        engines.reroute(splits, mirrors)
    assert engines.routes is kept
    with pytest.raises(NotFound):
        engines.route("ab")


def test_a_split_or_mirror_needs_engines_of_one_role() -> None:
    engines = engine_set((_fake(), "agg"), (_fake(role=pb.ENGINE_ROLE_PREFILL), "pre"), (_fake(), "other"))
    with pytest.raises(ConfigurationError, match="must share one role"):
        engines.reroute([_split({"agg": 1, "pre": 1})], [])
    with pytest.raises(ConfigurationError, match="'pre' is a ENGINE_ROLE_PREFILL engine; only aggregated"):
        engines.reroute([], [MirrorSection(name="agg", shadow="pre")])


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ({"name": "x", "engines": {}}, "at least 1 item"),
        ({"name": "x", "engines": {"a": 0}}, "at least one engine needs a weight above 0"),
        ({"name": "x", "engines": {"a": -1, "b": 2}}, "a weight must be from 0 to 1000000"),
        ({"name": "x", "engines": {"a": 2**70}}, "a weight must be from 0 to 1000000"),
        ({"name": "x", "engines": {"a": 1}, "sticky": ["session"]}, "neither 'cache_salt' nor 'metadata.KEY'"),
        ({"name": "", "engines": {"a": 1}}, "at least 1 character"),
    ],
)
def test_a_split_section_is_checked_as_it_is_read(section: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SplitSection.model_validate(section)


def test_an_engine_that_is_down_hands_its_requests_to_the_rest_while_any_is_up() -> None:
    engines = _three()
    route = engines.reroute([_split({"a": 1, "b": 1})], []).get("ab")
    assert route is not None
    assert {route.pick(down={"a"}).served_name for _ in range(50)} == {"b"}
    keys = [{"session": f"k{i}"} for i in range(200)]
    on_a = [key for key in keys if route.pick(metadata=key).served_name == "a"]
    assert on_a and all(route.pick(metadata=key, down={"a"}).served_name == "b" for key in on_a)
    assert all(route.pick(metadata=key).served_name == "a" for key in on_a)  # and back when it returns
    assert {route.pick(down={"a", "b"}).served_name for _ in range(50)} == {"a", "b"}  # all down: as if none


def test_a_splits_own_engine_may_shadow_it() -> None:
    """For a canary's agreement: ``b`` gets copies of the requests ``a`` answers (none of its own)."""
    table = _three().reroute([_split({"a": 1, "b": 1})], [MirrorSection(name="ab", shadow="b")])
    route = table.get("ab")
    assert route is not None and route.mirror is not None and route.mirror.shadow.served_name == "b"
