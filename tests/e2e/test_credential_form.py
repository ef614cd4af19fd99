"""The credential form end to end in headless Chromium (``credential_form_driver.mjs``): a
member opens a signed form link, sees the destination origin before any input, types a
value, gets an opaque reference; the link then refuses to be used again, another member sees
no form at all, and the reference drives one brokered request that carries the value to the
destination while the model's requests, the journal and the audit log never hold it."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.credentials.test_broker_rest import _leaks, _turn
from tests.credentials.world import CredentialWorld, credential_world
from tests.e2e.test_panel import node  # noqa: F401  (the fixture: Node.js, Chromium)
from tests.support.server import member_token

DRIVER = Path(__file__).with_name("credential_form_driver.mjs")
SECRET = "typed-in-chromium-7f3a9c21-credential"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[CredentialWorld]:
    with credential_world("sqlite", tmp_path / "server", remember=False) as built:
        yield built


@pytest.mark.timeout(300)
@pytest.mark.rule("R-388", "R-386", "R-397", "R-391")
def test_the_credential_form_in_a_browser(node: str, world: CredentialWorld,  # noqa: F811
                                          tmp_path: Path) -> None:
    shots = Path(os.environ.get("KAIZEN_E2E_SCREENSHOTS", tmp_path / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    form = world.issue("alice")
    env = {**os.environ,
           "KAIZEN_E2E_FORM_URL": world.server.base_url.rstrip("/") + form["form_url"],
           "KAIZEN_E2E_TOKEN": member_token("alice"),
           "KAIZEN_E2E_OTHER_TOKEN": member_token("bob"),
           "KAIZEN_E2E_SECRET": SECRET, "KAIZEN_E2E_ORIGIN": world.origin,
           "KAIZEN_E2E_SCREENSHOTS": str(shots)}
    result = subprocess.run([node, str(DRIVER)], env=env, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, (
        f"driver failed (screenshots in {shots}):\n{result.stdout}\n{result.stderr}\n"
        f"--- server log ---\n{world.server.log()[-4000:]}")
    steps = {s["step"]: s for s in map(json.loads, result.stdout.splitlines())}
    assert steps["origin_first"]["origin"] == world.origin
    assert steps["replay_refused"]["code"] == "form_used"
    ref = steps["submitted"]["credential_ref"]
    assert ref.startswith("cref_")
    # The reference the browser got drives exactly one request carrying what was typed.
    sent = len(world.received())
    turn = _turn(world, [("echo_whoami", {"credential_ref": ref})])
    assert turn.run["status"] == "completed", turn.run
    assert [r["authorization"] for r in world.received()[sent:]] == [f"Bearer {SECRET}"]
    rows = world.rows()
    assert _leaks(json.dumps(world.fake.requests()), SECRET) == []
    assert _leaks(json.dumps(rows["journal"], default=str), SECRET) == []
    assert _leaks(json.dumps(rows["audit"], default=str), SECRET) == []
    assert _leaks(world.server.log(), SECRET) == []
    # Only one form receipt: the replays claimed nothing.
    assert [r["status"] for r in rows["receipts"] if r["kind"] == "form"] == ["stored"]
