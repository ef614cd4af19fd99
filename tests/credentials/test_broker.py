"""The broker on its own, against a real store on both databases: handles are opaque and
single-use, the receipt is claimed before the request and settled by how delivery ended,
and the source seam (``attach``) follows the same rules as the broker's own client."""

from __future__ import annotations

import copy
import pickle
from collections.abc import MutableMapping

import pytest
from sqlalchemy import select

from kaizen_server_extension.credentials.broker import (
    AmbiguousDelivery,
    CredentialBroker,
    CredentialRefused,
    Injector,
    delivery_status,
)
from kaizen_server_extension.credentials.crypto import (
    CredentialKeys,
    Vault,
    new_key_text,
    parse_key,
)
from kaizen_server_extension.credentials.destinations import (
    Destination,
    Scheme,
    StaticDestinations,
)
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.credentials import CredentialRecords
from kaizen_server_extension.store.store import Store

ECHO = Destination("echo", "https://api.example.com", Scheme("bearer"))
KEYED = Destination("keyed", "https://api.example.com", Scheme("header", "X-Api-Key"))
BASIC = Destination("basic", "https://basic.example.com", Scheme("basic"))
SECRET = "value-5c1f-credential-quarantine"


class Sent(Exception):
    def __init__(self, sent: bool) -> None:
        super().__init__("transport")
        self.sent = sent


async def _allow(member: str, destination: Destination) -> str | None:
    return None


async def _broker(store: Store) -> CredentialBroker:
    await store.members.ensure("alice", "Alice")
    await store.members.ensure("bob", "Bob")
    vault = Vault(CredentialKeys.from_master(parse_key(new_key_text())).vault)
    return CredentialBroker(CredentialRecords(store), vault,
                            StaticDestinations([ECHO, KEYED, BASIC]), _allow)


async def _receipts(store: Store) -> list[m.CredentialReceipt]:
    async with store.transaction() as tx:
        return list((await tx.session.execute(select(m.CredentialReceipt))).scalars())


@pytest.mark.rule("R-443")
async def test_a_handle_is_opaque_and_sends_one_request(store: Store) -> None:
    broker = await _broker(store)
    ref = broker.hold_once("alice", ECHO, {"value": SECRET})
    handle = await broker.handle("alice", ref, "echo", operation="op", effect="read")
    assert SECRET not in repr(handle) and SECRET not in repr(broker)
    for attempt in (lambda: pickle.dumps(handle), lambda: copy.copy(handle),
                    lambda: copy.deepcopy(handle)):
        with pytest.raises(TypeError):
            attempt()
    seen: list[dict[str, str]] = []

    async def perform(injector: Injector) -> str:
        headers: dict[str, str] = {"Authorization": "model-chosen"}
        injector.apply(headers)
        seen.append(headers)
        assert SECRET not in repr(injector)
        return f"echo {SECRET}"

    answer = await handle.attach(ECHO.origin, perform)
    assert seen == [{"Authorization": f"Bearer {SECRET}"}]  # replaced, never merged
    assert SECRET not in str(handle.scrub(answer))
    with pytest.raises(CredentialRefused, match="already used"):
        await handle.attach(ECHO.origin, perform)
    [receipt] = await _receipts(store)
    assert receipt.status == "succeeded" and receipt.operation == "op"


@pytest.mark.rule("R-399", "R-397")
@pytest.mark.parametrize(("effect", "error", "status"), [
    ("write", Sent(True), "ambiguous"),
    ("sensitive", AmbiguousDelivery("x"), "ambiguous"),
    ("write", Sent(False), "failed"),
    ("read", Sent(True), "failed"),
])
async def test_a_receipt_says_how_delivery_ended(store: Store, effect: str,
                                                 error: Exception, status: str) -> None:
    broker = await _broker(store)
    ref = broker.hold_once("alice", ECHO, {"value": SECRET})
    handle = await broker.handle("alice", ref, "echo", operation="op", effect=effect)

    async def perform(injector: Injector) -> None:
        raise error

    with pytest.raises(type(error)):
        await handle.attach(ECHO.origin, perform)
    [receipt] = await _receipts(store)
    assert receipt.status == status == delivery_status(error, effect)
    assert receipt.settled_at is not None


@pytest.mark.rule("R-443", "R-393")
async def test_a_ref_is_refused_for_another_member_destination_or_origin(
        store: Store) -> None:
    broker = await _broker(store)
    ref = broker.hold_once("alice", ECHO, {"value": SECRET})
    with pytest.raises(CredentialRefused):
        await broker.handle("bob", ref, "echo", operation="op", effect="read")
    with pytest.raises(CredentialRefused):
        await broker.handle("alice", ref, "keyed", operation="op", effect="read")
    handle = await broker.handle("alice", ref, "echo", operation="op", effect="read")

    async def perform(injector: Injector) -> None:
        raise AssertionError("never called")

    with pytest.raises(CredentialRefused, match="only sent there"):
        await handle.attach("https://evil.example.com", perform)
    assert await _receipts(store) == []
    # A use-once value is spent by its first claimed request, even a failed one.
    handle = await broker.handle("alice", ref, "echo", operation="op", effect="read")
    with pytest.raises(Sent):
        await handle.attach(ECHO.origin, _raise_sent)
    with pytest.raises(CredentialRefused):
        await broker.handle("alice", ref, "echo", operation="op", effect="read")


async def _raise_sent(injector: Injector) -> None:
    raise Sent(True)


@pytest.mark.rule("R-394")
async def test_a_remembered_value_is_sealed_and_opens_for_its_member_only(
        store: Store) -> None:
    broker = await _broker(store)
    sealed = broker.seal("alice", BASIC, {"username": "ann", "password": SECRET}, "Basic")
    async with store.transaction() as tx:
        await CredentialRecords.remember_in(tx, sealed)
    assert SECRET.encode() not in sealed.sealed
    headers: MutableMapping[str, str] = {}

    async def perform(injector: Injector) -> None:
        injector.apply(headers)

    for _ in range(2):  # remembered: each call opens it again
        handle = await broker.handle("alice", sealed.ref, "basic", operation="op",
                                     effect="read")
        await handle.attach(BASIC.origin, perform)
    assert headers["Authorization"].startswith("Basic ")
    with pytest.raises(CredentialRefused):
        await broker.handle("bob", sealed.ref, "basic", operation="op", effect="read")
    assert len(await _receipts(store)) == 2


async def test_a_member_holds_a_bounded_number_of_use_once_values(store: Store) -> None:
    from kaizen_server_extension.credentials.broker import MAX_ONCE_PER_MEMBER

    broker = await _broker(store)
    refs = [broker.hold_once("alice", ECHO, {"value": f"{SECRET}-{n}"})
            for n in range(MAX_ONCE_PER_MEMBER + 3)]
    held = {p["credential_ref"] for p in broker.pending_once("alice")}
    assert held == set(refs[3:])  # the oldest went first
    assert broker.pending_once("bob") == []
