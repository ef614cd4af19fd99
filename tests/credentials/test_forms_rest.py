"""Credential forms through a real server on both databases: a signed, expiring, one-shot page
that shows its destination origin first, re-checks policy before it claims its nonce, and
keeps nothing but a credential-free receipt when it refuses nothing, and nothing at all when
it refuses (docs/credentials.md)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kaizen_server_extension.credentials.crypto import sign_plan
from tests.conftest import BACKENDS
from tests.credentials.world import CredentialWorld, credential_world

SECRET = "s3cr3t-form-value-4711-abcdefgh"


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[CredentialWorld]:
    root = tmp_path_factory.mktemp(f"credential-forms-{request.param}")
    with credential_world(str(request.param), root) as built:
        yield built


def _plan_of(form_url: str) -> dict[str, Any]:
    token = form_url.rsplit("/", 1)[1]
    body = token.split(".")[0]
    return dict(json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))))


def _token_url(world: CredentialWorld, plan: dict[str, Any]) -> str:
    return f"/kaizen/credentials/forms/{sign_plan(plan, world.form_key)}"


def _nothing_new(world: CredentialWorld, before: dict[str, list[Any]]) -> None:
    after = world.rows()
    assert after["secrets"] == before["secrets"]
    assert after["receipts"] == before["receipts"]


@pytest.mark.rule("R-387", "R-388", "R-398")
def test_a_form_shows_the_destination_origin_first_and_binds_its_plan(
        world: CredentialWorld) -> None:
    form = world.issue("alice", label="Echo for reports")
    assert form["destination"]["origin"] == world.origin
    plan = _plan_of(form["form_url"])
    # The signed plan binds the member, the destination and its fingerprint, the origin, a
    # nonce, and an expiry five minutes out.
    assert plan["member"] == "alice" and plan["destination"] == "echo"
    assert plan["origin"] == world.origin and len(plan["nonce"]) >= 16
    assert plan["fingerprint"]
    assert 295 <= plan["exp"] - time.time() <= 301
    page = world.page("alice", form["form_url"])
    assert page.status_code == 200
    assert page.headers["Cache-Control"] == "no-store"
    text = page.text
    origin_at = text.index(f'id="destination-origin">{world.origin}<')
    # The origin comes before any input the member could type into.
    assert origin_at < text.index("<input id=\"kz-value\"")
    assert text.index("<form") > origin_at
    assert SECRET not in text


@pytest.mark.rule("R-391", "R-397", "R-398", "R-395")
def test_a_submitted_value_becomes_an_opaque_ref_and_a_value_free_receipt(
        world: CredentialWorld) -> None:
    before = world.rows()
    ref = world.enter("alice", SECRET)
    rows = world.rows()
    # Use once (the default): nothing sealed, nothing stored but the receipt.
    assert rows["secrets"] == before["secrets"]
    new = [r for r in rows["receipts"] if r not in before["receipts"]]
    assert len(new) == 1
    receipt = new[0]
    assert receipt["kind"] == "form" and receipt["status"] == "stored"
    assert receipt["credential_ref"] == ref and receipt["retention"] == "once"
    assert SECRET not in json.dumps(rows["receipts"], default=str)
    assert SECRET not in json.dumps(rows["audit"], default=str)
    with world.server.client("alice") as alice:
        listed = alice.get("credentials").json()
        assert [o["credential_ref"] for o in listed["once"]].count(ref) == 1
        assert SECRET not in json.dumps(listed)
        receipts = alice.get("credentials/receipts").json()
        assert any(r["credential_ref"] == ref and r["status"] == "stored" for r in receipts)
        assert SECRET not in json.dumps(receipts)
        # There is no method that reads a value back.
        assert alice.get(f"credentials/{ref}").status_code in (404, 405)
    assert SECRET not in world.server.log()


@pytest.mark.rule("R-394", "R-395")
def test_remember_seals_the_value_and_only_the_member_can_forget_it(
        world: CredentialWorld) -> None:
    ref = world.enter("alice", SECRET, remember=True)
    sealed = [s for s in world.rows()["secrets"] if s["ref"] == ref]
    assert len(sealed) == 1 and sealed[0]["member"] == "alice"
    # Sealed: the stored bytes are not the value in any encoding.
    stored = sealed[0]["sealed"]
    assert SECRET.encode() not in stored and base64.b64encode(SECRET.encode()) not in stored
    with world.server.client("bob") as bob:
        assert ref not in json.dumps(bob.get("credentials").json())
        assert bob.delete(f"credentials/{ref}").status_code == 404
    with world.server.client("alice") as alice:
        mine = alice.get("credentials").json()["remembered"]
        assert next(c for c in mine if c["credential_ref"] == ref)["retention"] == "remember"
        assert SECRET not in json.dumps(mine)
        assert alice.delete(f"credentials/{ref}").status_code == 200
    assert not [s for s in world.rows()["secrets"] if s["ref"] == ref]


@pytest.mark.rule("R-397")
def test_a_replayed_submission_is_refused_and_stores_nothing(world: CredentialWorld) -> None:
    form = world.issue("alice")
    assert world.submit("alice", form["form_url"], value=SECRET).status_code == 200
    before = world.rows()
    again = world.submit("alice", form["form_url"], value="another-value-123456")
    assert again.status_code == 409 and 'data-code="form_used"' in again.text
    assert world.page("alice", form["form_url"]).status_code == 409
    _nothing_new(world, before)


@pytest.mark.rule("R-387")
def test_an_expired_form_is_refused_and_stores_nothing(world: CredentialWorld) -> None:
    plan = _plan_of(world.issue("alice")["form_url"])
    plan["exp"] = int(time.time()) - 1
    url = _token_url(world, plan)  # correctly signed, but past its expiry
    before = world.rows()
    assert world.page("alice", url).status_code == 410
    answer = world.submit("alice", url, value=SECRET)
    assert answer.status_code == 410 and 'data-code="form_expired"' in answer.text
    _nothing_new(world, before)


@pytest.mark.rule("R-387")
@pytest.mark.parametrize("change", ["destination", "member", "signature", "origin"])
def test_a_tampered_form_is_refused_and_stores_nothing(world: CredentialWorld,
                                                       change: str) -> None:
    form_url = world.issue("alice")["form_url"]
    token = form_url.rsplit("/", 1)[1]
    body, mac = token.split(".")
    if change == "signature":
        forged = f"{body}.{mac[:-2]}{'AA' if mac[-2:] != 'AA' else 'BB'}"
    else:
        plan = _plan_of(form_url)
        plan[change] = {"destination": "keyed", "member": "bob",
                        "origin": "https://evil.example"}[change]
        fake_body = base64.urlsafe_b64encode(json.dumps(
            plan, sort_keys=True, separators=(",", ":")).encode()).decode().rstrip("=")
        forged = f"{fake_body}.{mac}"  # the old signature over a new plan
    url = f"/kaizen/credentials/forms/{forged}"
    before = world.rows()
    member = "bob" if change == "member" else "alice"
    answer = world.submit(member, url, value=SECRET)
    assert answer.status_code == 400 and 'data-code="form_tampered"' in answer.text
    _nothing_new(world, before)


@pytest.mark.rule("R-387")
def test_another_members_form_is_not_found_for_them_and_stores_nothing(
        world: CredentialWorld) -> None:
    form = world.issue("alice")
    before = world.rows()
    assert world.page("bob", form["form_url"]).status_code == 404
    answer = world.submit("bob", form["form_url"], value=SECRET)
    assert answer.status_code == 404
    _nothing_new(world, before)
    # Still alice's to use: bob's attempt claimed nothing.
    assert world.submit("alice", form["form_url"], value=SECRET).status_code == 200


@pytest.mark.rule("R-389")
def test_policy_revoked_before_the_claim_refuses_and_stores_nothing(
        world: CredentialWorld) -> None:
    form = world.issue("alice")
    assert world.page("alice", form["form_url"]).status_code == 200  # rendered
    world.set_policy("credentials__echo", "alice", False)
    try:
        before = world.rows()
        answer = world.submit("alice", form["form_url"], value=SECRET)
        assert answer.status_code == 403 and 'data-code="destination_denied"' in answer.text
        _nothing_new(world, before)
        with world.server.client("alice") as alice:
            refused = alice.post("credentials/forms", json={"destination": "echo"})
            assert refused.status_code == 403
            assert refused.json()["error"]["code"] == "destination_denied"
            assert "echo" not in [d["id"] for d in alice.get(
                "credentials/destinations").json()]
    finally:
        world.set_policy("credentials__echo", "alice", None)
    # The nonce was never claimed, so the same form works once the policy allows it again.
    assert world.submit("alice", form["form_url"], value=SECRET).status_code == 200


@pytest.mark.rule("R-389")
def test_a_policy_for_everyone_revokes_too(world: CredentialWorld) -> None:
    form = world.issue("carol")
    world.set_policy("credentials__echo", "*", False)
    try:
        before = world.rows()
        assert world.submit("carol", form["form_url"], value=SECRET).status_code == 403
        _nothing_new(world, before)
    finally:
        world.set_policy("credentials__echo", "*", None)


@pytest.mark.rule("R-390")
def test_a_form_for_a_changed_destination_is_refused(world: CredentialWorld) -> None:
    plan = _plan_of(world.issue("alice")["form_url"])
    plan["fingerprint"] = "0" * 32  # issued for the destination as it was before a change
    url = _token_url(world, plan)
    before = world.rows()
    answer = world.submit("alice", url, value=SECRET)
    assert answer.status_code == 409 and 'data-code="destination_changed"' in answer.text
    _nothing_new(world, before)


@pytest.mark.rule("R-389")
def test_disabled_and_unknown_destinations_get_no_form(world: CredentialWorld) -> None:
    with world.server.client("alice") as alice:
        disabled = alice.post("credentials/forms", json={"destination": "off"})
        assert disabled.status_code == 403
        assert disabled.json()["error"]["code"] == "destination_disabled"
        unknown = alice.post("credentials/forms", json={"destination": "nowhere"})
        assert unknown.status_code == 404
        bad = alice.post("credentials/forms", json={"destination": "echo", "extra": 1})
        assert bad.status_code == 422
    plan = _plan_of(world.issue("alice")["form_url"])
    plan["destination"] = "off"
    assert world.submit("alice", _token_url(world, plan), value=SECRET).status_code == 403


def test_an_empty_or_control_character_value_is_refused(world: CredentialWorld) -> None:
    form = world.issue("alice")
    before = world.rows()
    assert world.submit("alice", form["form_url"], value="").status_code == 422
    assert world.submit("alice", form["form_url"], value="a\nb-cdefgh").status_code == 422
    _nothing_new(world, before)
    assert world.submit("alice", form["form_url"], value=SECRET).status_code == 200


def test_the_credential_routes_are_in_the_served_openapi_document(
        world: CredentialWorld) -> None:
    with world.server.client("alice") as alice:
        paths = alice.get("openapi.json").json()["paths"]
    assert {"/kaizen/api/credentials", "/kaizen/api/credentials/forms",
            "/kaizen/api/credentials/destinations", "/kaizen/api/credentials/receipts",
            "/kaizen/api/credentials/{credential_ref}"} <= set(paths)
