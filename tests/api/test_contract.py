"""The REST contract, checked by schemathesis against a real server (issues 17 and 21).

schemathesis (``--checks all``: status codes, content types, response schemas, schema-valid
requests accepted and invalid ones rejected, undeclared methods 405 with Allow, created
resources found, auth enforced, no 5xx) generates requests for every operation of the served
OpenAPI document, over every parameter and body, on each database. ``contract_hooks.py`` adds
``no_write_on_error``: a 4xx or 5xx answer changes no row and no file. It must find nothing.

The run is bounded (``schemathesis.toml``: a fixed seed and examples per operation, one worker).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kaizen_server_extension.credentials.crypto import new_key_text
from kaizen_server_extension.store.engine import sqlite_url_for
from tests.conftest import POSTGRES_URL, drop_schema, new_schema
from tests.support.server import ServerProcess, free_port, member_token, start_server

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("schemathesis.toml")
#: The admin member (tests/support/server.py), so the admin routes are exercised too.
MEMBER = "dave"


@pytest.fixture(params=["sqlite", "postgresql"] if POSTGRES_URL else ["sqlite"])
def contract_server(request: pytest.FixtureRequest, tmp_path: Path):
    """A server of its own: what schemathesis creates stays out of the other tests' way."""
    schema = None
    if request.param == "sqlite":
        url = sqlite_url_for(tmp_path / "server" / "kaizen.db")
    else:
        url, schema = POSTGRES_URL, new_schema()
    # Scheduled tasks fire on the scheduler's poll, detached from any request: a task this run
    # creates must not fire between the two fingerprints of another request. One poll an hour
    # (the bound) is none during the run; "run now" fires within its own request, as before.
    # External OpenAPI sources are on so their routes are in the contract; egress is limited
    # to loopback on a port where nothing listens, so no generated URL reaches anything.
    # Credentials are on too, so their routes are checked (a destination nothing listens at:
    # issuing a form sends nothing).
    proc = start_server(tmp_path / "server", url, schema,
                        extra_env={"KAIZEN_TASK_POLL_SECONDS": "3600",
                                   "KAIZEN_OPENAPI_SOURCES_ENABLED": "1",
                                   "KAIZEN_OPENAPI_EGRESS_NETWORKS": "127.0.0.1/32",
                                   "KAIZEN_OPENAPI_EGRESS_PORTS": str(free_port()),
                                   "KAIZEN_CREDENTIALS_ENABLED": "1",
                                   "KAIZEN_CREDENTIAL_KEY": new_key_text(),
                                   "KAIZEN_CREDENTIAL_DESTINATIONS": json.dumps([
                                       {"id": "echo", "origin": "https://api.example.com",
                                        "scheme": {"kind": "bearer"}}])})
    try:
        yield proc
    finally:
        proc.stop()
        if schema:
            asyncio.run(drop_schema(schema))


def _schemathesis() -> str:
    return str(Path(sys.executable).with_name("schemathesis"))


@pytest.mark.timeout(900)
def test_schemathesis_finds_nothing(contract_server: ServerProcess, tmp_path: Path) -> None:
    server = contract_server
    headers = {"Authorization": f"token {member_token(MEMBER)}"}
    with server.client(MEMBER) as client:
        # First visit writes the member's row: not during the run, where it would be a write.
        assert client.get("members/me").json()["admin"] is True
    env = {**os.environ,
           "SCHEMATHESIS_HOOKS": "tests.api.contract_hooks",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "KAIZEN_CONTRACT_DATABASE_URL": server.env["KAIZEN_DATABASE_URL"],
           "KAIZEN_CONTRACT_DATABASE_SCHEMA": server.env.get("KAIZEN_DATABASE_SCHEMA", ""),
           "KAIZEN_CONTRACT_ROOT": str(server.log_path.parent),
           "KAIZEN_CONTRACT_REPORT": str(tmp_path / "checked.json")}
    command = [
        _schemathesis(), "--config-file", str(CONFIG), "run",
        server.base_url + "kaizen/api/openapi.json", "--url", server.base_url.rstrip("/"),
        "--no-color",
        "-H", f"Authorization: {headers['Authorization']}",
        "--report", "junit", "--report-dir", str(tmp_path / "report"),
    ]
    # Run in the test's own folder: schemathesis keeps a cache folder where it runs.
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=850)
    output = result.stdout + result.stderr
    (tmp_path / "schemathesis.out").write_text(output)
    assert result.returncode == 0, output[-20000:]
    # The no-write check really ran: every request fingerprinted, hundreds of errors checked.
    counts = json.loads((tmp_path / "checked.json").read_text())
    assert counts["requests"] > 1000 and counts["errors_checked"] > 500, counts


def test_the_fingerprint_sees_a_write(tmp_path: Path) -> None:
    """The no-write check can fail: a row added, changed or removed, or a file written, is a
    different fingerprint."""
    import sqlite3

    from tests.api.contract_hooks import Fingerprint

    db = tmp_path / "kaizen.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE journal (seq INTEGER, data TEXT)")
        conn.execute("CREATE TABLE runs (id TEXT, status TEXT)")
        conn.execute("CREATE TABLE notifications (dedupe_key TEXT)")
        conn.execute("INSERT INTO journal VALUES (1, 'a')")
    store = Fingerprint(sqlite_url_for(db), None, tmp_path)
    seen = [store.take()]
    for statement in ("INSERT INTO journal VALUES (2, 'b')",
                      "UPDATE journal SET data = 'c' WHERE seq = 1",
                      "DELETE FROM journal WHERE seq = 2"):
        with sqlite3.connect(db) as conn:
            conn.execute(statement)
        seen.append(store.take())
    (tmp_path / "notes.txt").write_text("written")
    seen.append(store.take())
    assert len({json.dumps(s, sort_keys=True) for s in seen}) == len(seen)
    assert store.take() == seen[-1]  # and reading changes nothing
