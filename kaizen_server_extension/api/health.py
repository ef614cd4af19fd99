"""``health/live`` and ``health/ready``: probes for Docker, Kubernetes and load balancers.

Unauthenticated (a probe holds no token; they stay reachable with
``ServerApp.allow_unauthenticated_access = False``) and content-free: a status and reason
codes (kaizen_server_extension/health.py). Metrics are Jupyter's own ``/metrics``
(docs/deploy.md), which serves Kaizen's collectors with the server's.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.base.handlers import JupyterHandler

from kaizen_server_extension.api.params import allow_header, refuse_undeclared_method
from kaizen_server_extension.health import readiness

JSON = "application/json"


class _ProbeHandler(JupyterHandler):
    def check_xsrf_cookie(self) -> None:
        return  # GET only; nothing to protect

    async def prepare(self) -> None:  # type: ignore[override]
        refuse_undeclared_method(self)
        await super().prepare()

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Refusals are JSON like every Kaizen error (a probe has only 405 to give)."""
        allow_header(self, status_code)
        code = "method_not_allowed" if status_code == 405 else "probe_failed"
        self._answer(status_code, {"error": {"code": code, "message": (
            "That method is not allowed here." if status_code == 405
            else "The probe could not answer.")}})

    def _answer(self, status: int, payload: dict[str, Any]) -> None:
        self.set_status(status)
        self.set_header("Content-Type", JSON)
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(payload))


class LiveHandler(_ProbeHandler):
    @allow_unauthenticated
    def get(self) -> None:
        self._answer(200, {"status": "live"})


class ReadyHandler(_ProbeHandler):
    @allow_unauthenticated
    async def get(self) -> None:
        ctx = self.settings["kaizen"]
        state = await readiness(ctx.store, ctx.events_link)
        self._answer(200 if state.ready else 503, state.public())


def health_routes(prefix: str) -> list[tuple[str, type[JupyterHandler]]]:
    return [(rf"{prefix}/health/live", LiveHandler), (rf"{prefix}/health/ready", ReadyHandler)]


def health_openapi() -> tuple[dict[str, Any], dict[str, Any]]:
    """(paths, components) of the probes; both need no authentication."""
    check_codes = ["ok", "unreachable", "unknown", "missing", "behind", "unknown_revision",
                   "disconnected"]
    components = {
        "Liveness": {"type": "object", "required": ["status"],
                     "properties": {"status": {"const": "live"}}},
        "Readiness": {
            "type": "object", "required": ["status", "checks"],
            "properties": {
                "status": {"enum": ["ready", "not_ready"]},
                "checks": {"type": "object",
                           "description": "store: the database answers; migrations: its "
                           "schema is at the head this release ships; events (PostgreSQL "
                           "only): the LISTEN link to the other replicas is connected.",
                           "required": ["store", "migrations"],
                           "additionalProperties": {"enum": check_codes},
                           "properties": {name: {"enum": check_codes}
                                          for name in ("store", "migrations", "events")}}}},
    }

    def probe(summary: str, op_id: str, responses: dict[str, Any]) -> dict[str, Any]:
        return {"get": {"summary": summary, "operationId": op_id, "security": [],
                        "responses": responses}}

    def answer(description: str, name: str) -> dict[str, Any]:
        return {"description": description,
                "content": {JSON: {"schema": {"$ref": f"#/components/schemas/{name}"}}}}

    paths = {
        "/kaizen/api/health/live": probe(
            "Liveness: the server process answers", "getLiveness",
            {"200": answer("Live", "Liveness")}),
        "/kaizen/api/health/ready": probe(
            "Readiness: the store answers and is migrated to the head revision (and, on "
            "PostgreSQL, the events link is connected)", "getReadiness",
            {"200": answer("Ready", "Readiness"),
             "503": answer("Not ready; checks names what is not", "Readiness")}),
    }
    return paths, components
