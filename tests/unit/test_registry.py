"""``core.registry``: the request-id namespace shared by Generate and the task RPCs."""

from __future__ import annotations

import asyncio

import pytest
from openengine_gateway.core.registry import ActiveRequest, RequestRegistry
from openengine_gateway.errors import AlreadyExists, ResourceExhausted


def active(request_id: str, *, session: str | None = None) -> ActiveRequest:
    return ActiveRequest(request_id, "generate", "m", kv_session_id=session)


def test_admit_get_release() -> None:
    registry = RequestRegistry()
    request = active("a")
    registry.admit(request)
    assert registry.get("a") is request and len(registry) == 1
    assert registry.in_flight() == [request]
    assert not registry.recently_finished("a")
    registry.release(request)
    assert registry.get("a") is None and len(registry) == 0
    assert registry.recently_finished("a")


def test_in_flight_duplicate_is_already_exists() -> None:
    registry = RequestRegistry()
    registry.admit(active("a"))
    with pytest.raises(AlreadyExists, match="'a' is already in flight"):
        registry.admit(active("a"))
    assert len(registry) == 1


def test_finished_id_may_be_reused() -> None:
    registry = RequestRegistry()
    first = active("a")
    registry.admit(first)
    registry.release(first)
    second = active("a")
    registry.admit(second)
    assert registry.get("a") is second
    assert not registry.recently_finished("a")  # in flight again, not finished


def test_release_of_a_replaced_request_is_ignored() -> None:
    """Only the admitted object releases its id (a rejected duplicate must not free it)."""
    registry = RequestRegistry()
    admitted = active("a")
    registry.admit(admitted)
    registry.release(active("a"))
    assert registry.get("a") is admitted
    registry.release(admitted)
    registry.release(admitted)  # a second release is harmless
    assert len(registry) == 0


def test_finished_window_is_bounded() -> None:
    registry = RequestRegistry(finished_window=3)
    for name in "abcde":
        request = active(name)
        registry.admit(request)
        registry.release(request)
    assert [registry.recently_finished(n) for n in "abcde"] == [False, False, True, True, True]
    assert len(registry._finished) == 3  # bounded memory


def test_a_long_finished_id_is_remembered_in_bounded_memory() -> None:
    """Any client may send megabyte ids: the window keeps a long one as its digest, still exactly."""
    registry = RequestRegistry()
    long_id, sibling = "r" * 1_000_000, "r" * 999_999 + "s"
    request = active(long_id)
    registry.admit(request)
    registry.release(request)
    kept = next(iter(registry._finished))
    assert isinstance(kept, bytes) and len(kept) == 32
    assert registry.recently_finished(long_id) and not registry.recently_finished(sibling)
    registry.admit(active(long_id))  # reused while remembered: it is in flight again, not finished
    assert not registry.recently_finished(long_id)


def test_remembered_kv_sessions_are_bounded_and_refreshed() -> None:
    registry = RequestRegistry(finished_window=3)
    for name in "abc":
        registry.remember_session(name)
    registry.remember_session("a")  # handed out, then aborted: the latest use counts
    registry.remember_session("d")
    assert [registry.knows_session(n) for n in "abcd"] == [True, False, True, True]


def test_max_in_flight_is_resource_exhausted() -> None:
    registry = RequestRegistry(max_in_flight=2)
    first, second = active("a"), active("b")
    registry.admit(first)
    registry.admit(second)
    with pytest.raises(ResourceExhausted) as raised:
        registry.admit(active("c"))
    assert raised.value.retry_after_ms is not None
    with pytest.raises(AlreadyExists):  # a duplicate is reported as such even when full
        registry.admit(active("a"))
    registry.release(first)
    registry.admit(active("c"))


def test_abort_is_idempotent() -> None:
    reasons: list[str] = []
    request = ActiveRequest("a", "task", "m", stop=reasons.append)
    request.abort("first")
    request.abort("second")
    assert request.aborted and request.abort_reason == "first"
    assert reasons == ["first"]


def test_with_kv_session() -> None:
    registry = RequestRegistry()
    on_s1 = [active("a", session="s1"), active("b", session="s1")]
    for request in [*on_s1, active("c", session="s2"), active("d")]:
        registry.admit(request)
    assert registry.with_kv_session("s1") == on_s1
    assert registry.with_kv_session("s9") == []


async def test_wait_changed_returns_on_admit_and_release() -> None:
    registry = RequestRegistry()
    request = active("a")
    waiter = asyncio.ensure_future(registry.wait_changed(None))
    await asyncio.sleep(0)
    assert not waiter.done()
    registry.admit(request)
    await asyncio.wait_for(waiter, 1)
    waiter = asyncio.ensure_future(registry.wait_changed(None))
    await asyncio.sleep(0)
    registry.release(request)
    await asyncio.wait_for(waiter, 1)


async def test_wait_changed_times_out_quietly() -> None:
    registry = RequestRegistry()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await registry.wait_changed(0.01)
    assert loop.time() - started >= 0.009


async def test_wait_changed_sees_only_later_changes() -> None:
    """A change before the wait began does not end it (each wait watches from its start)."""
    registry = RequestRegistry()
    registry.admit(active("a"))
    waiter = asyncio.ensure_future(registry.wait_changed(None))
    await asyncio.sleep(0)
    assert not waiter.done()
    registry.admit(active("b"))
    await asyncio.wait_for(waiter, 1)


async def test_withdrawn_request_is_forgotten() -> None:
    """A request rejected before acceptance leaves no trace: Abort will say NOT_FOUND."""
    registry = RequestRegistry()
    request = active("a")
    registry.admit(request)
    waiter = asyncio.ensure_future(registry.wait_changed(None))
    await asyncio.sleep(0)
    registry.release(request, finished=False)
    await asyncio.wait_for(waiter, 1)  # drains still see the change
    assert registry.get("a") is None and not registry.recently_finished("a")


def test_a_rejected_reuse_of_a_finished_id_keeps_it_finished() -> None:
    """Withdrawing a request refused before acceptance must not forget the earlier one's finish."""
    registry = RequestRegistry()
    first = ActiveRequest("x", "generate", "m")
    registry.admit(first)
    registry.release(first)
    again = ActiveRequest("x", "generate", "m")
    registry.admit(again)
    registry.release(again, finished=False)
    assert registry.recently_finished("x")


def test_an_id_whose_abort_is_pending_is_refused_as_still_aborting() -> None:
    registry = RequestRegistry()
    ending = ActiveRequest("x", "generate", "m")
    registry.admit(ending)
    ending.ended = True
    with pytest.raises(AlreadyExists, match="still aborting"):
        registry.admit(ActiveRequest("x", "generate", "m"))


def test_each_owner_is_held_to_its_share_of_slots() -> None:
    registry = RequestRegistry(max_in_flight=10, max_in_flight_per_owner=2)
    alice = [ActiveRequest(f"a{n}", "generate", "m", owner="alice") for n in range(3)]
    registry.admit(alice[0])
    registry.admit(alice[1])
    with pytest.raises(ResourceExhausted, match="this token is at its limit of 2") as refused:
        registry.admit(alice[2])
    assert refused.value.retry_after_ms == 100
    registry.admit(ActiveRequest("b0", "generate", "m", owner="bob"))
    registry.admit(ActiveRequest("anonymous", "generate", "m"))  # no owner: only the global limit
    assert registry.owner_counts() == {"alice": 2, "bob": 1}
    registry.release(alice[0])
    registry.admit(alice[2])
    for request in registry.in_flight():
        registry.release(request)
    assert registry.owner_counts() == {}


def test_finished_ids_and_sessions_are_found_only_by_who_reaches_their_owner() -> None:
    registry = RequestRegistry()
    request = ActiveRequest("shared-id", "generate", "m", owner="alice")
    registry.admit(request)
    registry.release(request)
    registry.remember_session("s1", "alice")
    registry.remember_session("s1", "operator")  # the first owner stays
    alice, bob = (lambda owner: owner == "alice"), (lambda owner: owner == "bob")
    assert registry.recently_finished("shared-id", alice) and not registry.recently_finished("shared-id", bob)
    assert registry.knows_session("s1", alice) and not registry.knows_session("s1", bob)
    assert registry.recently_finished("shared-id") and registry.knows_session("s1")  # anyone: no tokens
