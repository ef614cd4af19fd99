"""Bad input through the REST API: how many cases were tried, how many reached a server
error (5xx), and how many error answers changed the database (issue 21, item 1).

For every operation of the served OpenAPI document (a real server, every feature's routes
on) the bench sends malformed requests built from the operation's own parameters:

* each path parameter as a Unicode digit (``²``), a 300-character id, a percent-encoded
  invalid byte and a dot-dot segment, with the other path parameters real (a room of the
  member, a run of it) or placeholders;
* each integer query parameter as ``1e30``, ``9223372036854775808``, ``-1``, ``²`` and
  ``abc``;
* each operation with a request body: bytes that are not JSON, invalid UTF-8, JSON nested
  100,000 levels deep at the top and inside a field, a JSON array, a JSON string, and an
  object of wrong types;

plus the issue's six reproductions by name. Per database, one JSON line: ``cases``,
``server_errors`` (5xx answers: must be 0), ``writes_on_error`` (a 4xx answer after which
some row of some table differed: must be 0), ``statuses`` (answers by status) and
``reproductions`` / ``reproduction_server_errors``. A case answered 2xx is valid input, not
a bad one; it counts in ``statuses`` only. The store is read between cases (every row of
every table), so the bench takes a minute or two.

    .venv/bin/python bench/bad_input.py [--db sqlite|postgresql|both] [--n CASES]

``--n`` caps the cases tried after the reproductions (default 0: the whole sweep).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH_DIR))

from benchkit import emit, parse_args, reachable_databases  # noqa: E402

from kaizen_server_extension.credentials.crypto import new_key_text  # noqa: E402
from kaizen_server_extension.store.engine import sqlite_url_for  # noqa: E402
from tests.conftest import all_rows, with_server_store  # noqa: E402
from tests.support.server import ServerProcess, free_port, member_token, start_server  # noqa: E402

BENCH = "bad_input"
#: The admin member, so the admin routes are tried too.
MEMBER = "dave"
BAD_IDS = ("²", "x" * 300, "%ff", "..")
BAD_INTEGERS = ("1e30", "9223372036854775808", "-1", "²", "abc")
WRITING = ("post", "put", "patch")


@dataclass(frozen=True, slots=True)
class Case:
    method: str
    path: str
    params: dict[str, str]
    body: bytes | None


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


BAD_BODIES = (b"not json", b"\xff\xfe{", _deep(100_000),
              b'{"text": ' + _deep(100_000) + b"}", b"[]", b'"text"',
              b'{"text": 1, "agent_id": [], "name": {}, "enabled": "yes"}')


def _reproductions(room: str) -> list[Case]:
    """The issue's six, as it reported them (the artifact a member cannot see: the version
    is read before the artifact is looked up)."""
    artifact = "/kaizen/api/artifacts/no-such-artifact"
    cases = [Case("post", "/kaizen/api/conversations", {}, _deep(100_000)),
             Case("post", f"/kaizen/api/conversations/{room}/messages", {},
                  b'{"text": ' + _deep(100_000) + b"}"),
             Case("get", f"/kaizen/api/conversations/{room}/journal", {"after": "1e30"}, None),
             Case("get", f"/kaizen/api/conversations/{room}/journal",
                  {"after": "9223372036854775808"}, None)]
    return [*cases, Case("get", f"{artifact}/versions/²", {}, None),
            Case("get", f"{artifact}/versions/²/download", {}, None)]


def _filled(template: str, real: dict[str, str], bad: str | None = None,
            of: str | None = None) -> str:
    """``template`` with its path parameters filled: ``bad`` for ``of``, real ids (or
    placeholders) for the others."""
    for name in re.findall(r"{(\w+)}", template):
        value = bad if name == of else real.get(name, f"no-such-{name}")
        template = template.replace(f"{{{name}}}", str(value))
    return template


def _sweep(document: dict[str, Any], real: dict[str, str]) -> Iterator[Case]:
    for template, item in document["paths"].items():
        names = re.findall(r"{(\w+)}", template)
        for method, operation in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            for name in names:
                for bad in BAD_IDS:
                    yield Case(method, _filled(template, real, bad, name), {}, None)
            for parameter in operation.get("parameters", []):
                schema = parameter.get("schema", {})
                if parameter.get("in") == "query" and schema.get("type") == "integer":
                    for bad in BAD_INTEGERS:
                        yield Case(method, _filled(template, real), {parameter["name"]: bad},
                                   None)
            if method in WRITING and "requestBody" in operation:
                for body in BAD_BODIES:
                    yield Case(method, _filled(template, real), {}, body)


def _send(client: httpx.Client, case: Case) -> int:
    headers = {"Content-Type": "application/json"} if case.body is not None else {}
    response = client.request(case.method.upper(), case.path, params=case.params,
                              content=case.body, headers=headers)
    return response.status_code


def _setting_up(client: httpx.Client) -> dict[str, str]:
    """A room with a settled turn: real ids for the path parameters a case does not make
    bad."""
    room = client.post("/kaizen/api/conversations", json={"agent_id": "general"}).json()
    accepted = client.post(f"/kaizen/api/conversations/{room['id']}/messages",
                           json={"text": "hello"}).json()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # no model: the turn fails at once
        events = client.get(f"/kaizen/api/conversations/{room['id']}/journal",
                            params={"limit": 1000}).json()["events"]
        if any(e["type"] == "run.terminal" for e in events):
            break
        time.sleep(0.05)
    real = {"conversation_id": room["id"], "run_id": accepted["run_id"],
            "agent_id": "general", "member": MEMBER}
    return real


def _fingerprint(server: ServerProcess) -> int:
    return hash(repr(with_server_store(server, all_rows)))


def measure(db: str, server: ServerProcess, most: int) -> None:
    base = server.base_url.rstrip("/")
    with httpx.Client(base_url=base, timeout=60,
                      headers={"Authorization": f"token {member_token(MEMBER)}"}) as client:
        # The member's first visit writes their row: before, not during, the sweep.
        client.get("/kaizen/api/members/me").raise_for_status()
        real = _setting_up(client)
        document = client.get("/kaizen/api/openapi.json").json()
        reproductions = _reproductions(real["conversation_id"])
        sweep = list(_sweep(document, real))
        cases = [*reproductions, *(sweep[:most] if most else sweep)]
        statuses: Counter[int] = Counter()
        server_errors = writes_on_error = reproduction_errors = 0
        before = _fingerprint(server)
        for i, case in enumerate(cases):
            status = _send(client, case)
            statuses[status] += 1
            if status >= 500:
                server_errors += 1
                reproduction_errors += i < len(reproductions)
                print(f"5xx: {case.method.upper()} {case.path} {case.params}", file=sys.stderr)
            after = _fingerprint(server)
            if status >= 400 and after != before:
                writes_on_error += 1
                print(f"wrote on {status}: {case.method.upper()} {case.path}", file=sys.stderr)
            before = after
    emit({"bench": BENCH, "db": db, "n": len(cases), "operations": sum(
              1 for item in document["paths"].values() for m in item
              if m in ("get", "post", "put", "patch", "delete")),
          "cases": len(cases), "server_errors": server_errors,
          "writes_on_error": writes_on_error,
          "statuses": {str(k): v for k, v in sorted(statuses.items())},
          "reproductions": len(reproductions),
          "reproduction_server_errors": reproduction_errors})


def main() -> None:
    args = parse_args(__doc__ or BENCH, default_n=0)
    for db in asyncio.run(reachable_databases(BENCH, args)):
        with tempfile.TemporaryDirectory(prefix="kaizen-bad-input-") as tmp:
            root = Path(tmp)
            url, schema = sqlite_url_for(root / "kaizen.db"), None
            if db == "postgresql":
                url, schema = args.pg_url, "kzbad_" + uuid.uuid4().hex[:12]
            # Every feature's routes, egress to a loopback port nothing listens on; tasks
            # never fire on their own during the sweep (as tests/api/test_contract.py).
            server = start_server(root / "server", url, schema, extra_env={
                "KAIZEN_TASK_POLL_SECONDS": "3600",
                "KAIZEN_OPENAPI_SOURCES_ENABLED": "1",
                "KAIZEN_OPENAPI_EGRESS_NETWORKS": "127.0.0.1/32",
                "KAIZEN_OPENAPI_EGRESS_PORTS": str(free_port()),
                "KAIZEN_CREDENTIALS_ENABLED": "1",
                "KAIZEN_CREDENTIAL_KEY": new_key_text(),
                "KAIZEN_CREDENTIAL_DESTINATIONS": json.dumps([
                    {"id": "echo", "origin": "https://api.example.com",
                     "scheme": {"kind": "bearer"}}])})
            try:
                measure(db, server, args.n)
            finally:
                server.stop()
                if schema is not None:
                    asyncio.run(_drop(args.pg_url, schema))


async def _drop(pg_url: str, schema: str) -> None:
    from kaizen_server_extension.store import create_engine

    engine = create_engine(pg_url)
    try:
        async with engine.begin() as conn:
            await conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await engine.dispose()


if __name__ == "__main__":
    main()
