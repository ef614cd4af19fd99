"""LLM_PER_USER_DAILY_TOKENS: check, call and usage row under one per-member lock."""

from __future__ import annotations

import asyncio

import pytest

from kaizen_server_extension.store import Store
from kaizen_server_extension.store.usage import DailyTokenCapReached, UsageLedger


@pytest.mark.rule("R-081")
async def test_without_a_cap_usage_is_still_recorded(store: Store) -> None:
    await store.members.ensure("alice")
    ledger = UsageLedger(store)
    async with ledger.guard("alice", 0) as meter:
        meter.add(120)
    assert await ledger.used("alice") == 120


@pytest.mark.rule("R-042")
async def test_a_member_at_the_cap_is_refused_before_the_call(store: Store) -> None:
    await store.members.ensure("alice")
    await store.members.ensure("bob")
    ledger = UsageLedger(store)
    async with ledger.guard("alice", 100) as meter:
        meter.add(100)
    called = False
    with pytest.raises(DailyTokenCapReached):
        async with ledger.guard("alice", 100):
            called = True
    assert not called
    async with ledger.guard("bob", 100) as meter:  # another member is unaffected
        meter.add(1)
    assert await ledger.used("bob") == 1


@pytest.mark.rule("R-079")
async def test_concurrent_calls_of_one_member_are_serialized(store: Store) -> None:
    await store.members.ensure("alice")
    ledger = UsageLedger(store)
    inside = 0
    peak = 0

    async def call() -> None:
        nonlocal inside, peak
        try:
            async with ledger.guard("alice", 1000) as meter:
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0.05)
                meter.add(10)
                inside -= 1
        except DailyTokenCapReached:
            pass

    await asyncio.gather(*[call() for _ in range(4)])
    assert peak == 1
    assert await ledger.used("alice") == 40


@pytest.mark.rule("R-080")
async def test_the_lock_is_released_when_the_call_fails(store: Store) -> None:
    await store.members.ensure("alice")
    ledger = UsageLedger(store)
    with pytest.raises(RuntimeError):
        async with ledger.guard("alice", 1000):
            raise RuntimeError("provider failed")
    async with asyncio.timeout(10):  # would hang if the lock were still held
        async with ledger.guard("alice", 1000) as meter:
            meter.add(5)
    assert await ledger.used("alice") == 5
