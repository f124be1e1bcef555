"""The memory budget sheds new work before the memory in use reaches it, and counts what it shed."""

from __future__ import annotations

import pytest
from openengine_gateway.core.background import BackgroundTasks
from openengine_gateway.core.events import EventService
from openengine_gateway.core.memory import MemoryBudget, resident_bytes
from openengine_gateway.core.registry import ActiveRequest, RequestRegistry
from openengine_gateway.errors import ResourceExhausted

from tests.fakes import FakeBackend, engine_set

MIB = 2**20


def test_work_is_shed_from_nine_tenths_of_the_budget_with_a_retry_hint() -> None:
    used = [89 * MIB]
    budget = MemoryBudget(100 * MIB, read=lambda: used[0])
    budget.check()
    used[0] = 90 * MIB
    with pytest.raises(ResourceExhausted) as shed:
        budget.check("Health watch")
    assert shed.value.retry_after_ms == 1000
    assert "90 MiB in use" in shed.value.message and "--max-memory-mib" in shed.value.message
    assert "Health watch" in shed.value.message
    assert budget.shed == 1


def test_no_budget_sheds_nothing_and_the_reading_is_real() -> None:
    budget = MemoryBudget(None)
    budget.check()
    assert budget.shed == 0
    assert 10 * MIB < budget.resident == pytest.approx(resident_bytes(), rel=0.5)


def test_the_registry_checks_the_budget_at_admission_and_admits_nothing_past_it() -> None:
    registry = RequestRegistry(memory=MemoryBudget(100 * MIB, read=lambda: 95 * MIB))
    with pytest.raises(ResourceExhausted):
        registry.admit(ActiveRequest("r", "generate", "m"))
    assert len(registry) == 0 and registry.memory.shed == 1


def test_an_event_subscription_is_shed_past_the_budget_too() -> None:
    budget = MemoryBudget(100 * MIB, read=lambda: 95 * MIB)
    events = EventService(engine_set(FakeBackend()), BackgroundTasks(), memory=budget)
    with pytest.raises(ResourceExhausted, match="a new event subscription is refused"):
        events._check_capacity()
