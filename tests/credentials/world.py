"""A real Kaizen server with credentials enabled, the echo API of
``tests/support/credential_api.py`` as the ``echo`` destination and the scripted fake model:
the world the credential REST tests run in (on SQLite and PostgreSQL)."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from kaizen_server_extension.credentials.crypto import CredentialKeys, new_key_text, parse_key
from kaizen_server_extension.store import models as m
from kaizen_server_extension.store.store import Store
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.conftest import served_by, with_server_store
from tests.support.processes import stop_process
from tests.support.server import ServerProcess, free_port, member_token

API_SCRIPT = Path(__file__).resolve().parents[1] / "support" / "credential_api.py"
POLICIES = "admin/tool-policies"


def start_api(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, str(API_SCRIPT), "--port", str(port),
                                "--log", str(log)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    origin = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(origin + "/nothing", timeout=1)
            return process, origin
        except httpx.HTTPError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("the echo API did not start")




@dataclass
class CredentialWorld:
    server: ServerProcess
    fake: FakeOpenAI
    origin: str
    key: str
    api_log: Path
    note_log: Path

    @property
    def form_key(self) -> bytes:
        return CredentialKeys.from_master(parse_key(self.key)).form

    def received(self) -> list[dict[str, Any]]:
        """What the echo API received, in order."""
        if not self.api_log.exists():
            return []
        return [json.loads(line) for line in self.api_log.read_text().splitlines()]

    def notes_ran(self) -> int:
        return len(self.note_log.read_text().splitlines()) if self.note_log.exists() else 0

    def issue(self, member: str, destination: str = "echo", **extra: Any) -> dict[str, Any]:
        with self.server.client(member) as client:
            response = client.post("credentials/forms",
                                   json={"destination": destination, **extra})
            assert response.status_code == 201, response.text
            return dict(response.json())

    def page(self, member: str | None, form_url: str) -> httpx.Response:
        """The form page, as ``member`` (a token header, as the panel's fetch sends)."""
        headers = {"Authorization": f"token {member_token(member)}"} if member else {}
        return httpx.get(self.server.base_url.rstrip("/") + form_url, headers=headers,
                         timeout=30, follow_redirects=False)

    def submit(self, member: str, form_url: str, **fields: str) -> httpx.Response:
        return httpx.post(self.server.base_url.rstrip("/") + form_url, data=fields,
                          headers={"Authorization": f"token {member_token(member)}"},
                          timeout=30, follow_redirects=False)

    def enter(self, member: str, secret: str, *, remember: bool = False) -> str:
        """Issue a form, submit ``secret``, return the reference the page answered with."""
        form = self.issue(member)
        fields = {"value": secret, **({"remember": "yes"} if remember else {})}
        answer = self.submit(member, form["form_url"], **fields)
        assert answer.status_code == 200, answer.text
        found = re.search(r'id="kz-credential-ref">(cref_[A-Za-z0-9_-]+)<', answer.text)
        assert found, answer.text
        return found.group(1)

    def rows(self) -> dict[str, list[dict[str, Any]]]:
        """Every credential row and every audit and journal document, as stored."""
        async def read(store: Store) -> dict[str, list[dict[str, Any]]]:
            async with store.transaction() as tx:
                secrets = (await tx.session.execute(select(m.CredentialSecret))).scalars()
                receipts = (await tx.session.execute(select(m.CredentialReceipt))).scalars()
                audit = (await tx.session.execute(select(m.AuditEvent))).scalars()
                journal = (await tx.session.execute(select(m.JournalEvent))).scalars()
                return {
                    "secrets": [{"ref": s.ref, "member": s.member, "sealed": bytes(s.sealed),
                                 "destination": s.destination} for s in secrets],
                    "receipts": [{c.name: getattr(r, c.name)
                                  for c in m.CredentialReceipt.__table__.columns}
                                 for r in receipts],
                    "audit": [{"action": a.action, "data": a.data} for a in audit],
                    "journal": [{"type": j.type, "data": j.data} for j in journal],
                }
        return with_server_store(self.server, read)

    def set_policy(self, name: str, member: str, allowed: bool | None) -> None:
        with self.server.client("dave") as dave:
            if allowed is None:
                assert dave.delete(f"{POLICIES}/{name}/{member}").status_code in (200, 204)
            else:
                response = dave.put(f"{POLICIES}/{name}/{member}", json={"allowed": allowed})
                assert response.status_code == 200, response.text


@contextlib.contextmanager
def credential_world(backend: str, root: Path, *, remember: bool = True,
                     scripts: list[dict[str, Any]] | None = None) -> Iterator[CredentialWorld]:
    root.mkdir(parents=True, exist_ok=True)
    api_log, note_log = root / "api.jsonl", root / "notes.jsonl"
    api, origin = start_api(api_log)
    key = new_key_text()
    destinations = [
        {"id": "echo", "origin": origin, "scheme": {"kind": "bearer"}, "label": "Echo API"},
        {"id": "keyed", "origin": origin, "scheme": {"kind": "header", "name": "X-Api-Key"}},
        {"id": "off", "origin": origin, "scheme": {"kind": "bearer"}, "enabled": False},
    ]
    try:
        with FakeOpenAI(scripts or [{"responses": [{"text": "Hello."}]}]) as fake, \
                served_by(backend, root, fake, extra_env={
                    "KAIZEN_PLUGINS": "tests.support.credential_agent_plugin",
                    "KAIZEN_CREDENTIALS_ENABLED": "1",
                    "KAIZEN_CREDENTIAL_KEY": key,
                    "KAIZEN_CREDENTIAL_REMEMBER_ENABLED": "1" if remember else "0",
                    "KAIZEN_CREDENTIAL_DESTINATIONS": json.dumps(destinations),
                    "KAIZEN_TEST_NOTE_LOG": str(note_log)}) as server:
            yield CredentialWorld(server, fake, origin, key, api_log, note_log)
    finally:
        stop_process(api)
