"""``inspect_notebook_kernel``'s probe, from the server's side: one fixed expression, run
quietly in the member's notebook kernel, its bounded answer parsed and redacted.

How the probe stays out of the member's way:

* the request is ``execute_request`` with empty ``code``, ``silent=True`` and
  ``store_history=False``: no execution count, no ``In``/``Out``/``_`` entries, no output on
  iopub; the probe is the one *user expression*, which the kernel evaluates after the
  (empty) cell and returns in the reply;
* the expression ``exec``s ``kernel_probe.py``'s source into a fresh dictionary and calls its
  ``probe`` with the user namespace, so no name is bound in it;
* the probe bounds its own time, counts and string lengths; the server bounds the whole
  exchange (``timeout_s``) and the size of what it accepts back.

Nothing of the model's reaches the kernel: the source is this package's file and the limits
are the server's; the only caller-chosen input, the variable names to look at, travels as
JSON data inside the limits and is matched, never evaluated.
"""

from __future__ import annotations

import ast
import json
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from kaizen_server_extension.policy.redaction import REDACTED, is_credential_key, redact

#: What the probe's JSON may weigh when it comes back; a larger answer is refused.
MAX_PROBE_REPLY_CHARS = 512 * 1024


@dataclass(frozen=True, slots=True)
class ProbeLimits:
    seconds: float = 2.0
    max_variables: int = 100
    max_columns: int = 40
    head_rows: int = 5
    max_string: int = 200
    names: tuple[str, ...] = field(default=())

    def as_json(self) -> str:
        data = asdict(self)
        data["names"] = list(self.names)
        return json.dumps(data)


class ProbeFailed(Exception):
    """The kernel did not answer the probe usefully (member-safe ``reason``)."""

    def __init__(self, reason: str, code: str = "kernel_probe_failed") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


def probe_source() -> str:
    return resources.files("kaizen_server_extension.notebooks").joinpath(
        "kernel_probe.py").read_text(encoding="utf-8")


def probe_expression(limits: ProbeLimits) -> str:
    """The one user expression sent: the probe's source and the limits as string literals."""
    return ("(lambda s, g, l: (lambda n: (exec(s, n), n['probe'](g, l))[1])"
            "({'__name__': '__kaizen_probe__'}))"
            f"({probe_source()!r}, globals(), {limits.as_json()!r})")


async def run_probe(client: Any, limits: ProbeLimits, *, timeout_s: float) -> dict[str, Any]:
    """Send the probe on ``client`` (a started jupyter_client async kernel client) and return
    its redacted answer. ProbeFailed when the kernel answers anything else in time."""
    msg_id = client.execute("", silent=True, store_history=False, allow_stdin=False,
                            user_expressions={"kaizen": probe_expression(limits)})
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ProbeFailed("The notebook's kernel is busy: it did not answer the "
                              "inspection in time. Ask again when it is idle.",
                              code="kernel_busy")
        try:
            reply = await client.get_shell_msg(timeout=remaining)
        except TimeoutError:
            continue
        except Exception as exc:  # queue.Empty and friends, across client versions
            if type(exc).__name__ == "Empty":
                continue
            raise
        if reply.get("parent_header", {}).get("msg_id") == msg_id:
            break
    return parse_reply(reply.get("content", {}))


def parse_reply(content: dict[str, Any]) -> dict[str, Any]:
    expression = (content.get("user_expressions") or {}).get("kaizen")
    if content.get("status") != "ok" or not isinstance(expression, dict):
        raise ProbeFailed("The notebook's kernel could not run the inspection.")
    if expression.get("status") != "ok":
        # The kernel's own error type only, never its text.
        raise ProbeFailed("The inspection failed in the notebook's kernel "
                          f"({str(expression.get('ename', 'error'))[:80]}).")
    text = (expression.get("data") or {}).get("text/plain")
    if not isinstance(text, str) or len(text) > MAX_PROBE_REPLY_CHARS:
        raise ProbeFailed("The notebook's kernel answered the inspection with something "
                          "unexpected.")
    try:
        payload = json.loads(ast.literal_eval(text))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise ProbeFailed("The notebook's kernel answered the inspection with something "
                          "unexpected.") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("variables"), list):
        raise ProbeFailed("The notebook's kernel answered the inspection with something "
                          "unexpected.")
    return redact_probe(payload)


def redact_probe(payload: dict[str, Any]) -> dict[str, Any]:
    """The existing redaction rules over the probe's answer: a variable whose *name* is
    credential-shaped keeps its name and type only; every value, key and DataFrame cell goes
    through ``redact`` (credential-shaped columns lose their values) (R-072)."""
    variables = []
    for entry in payload["variables"]:
        if not isinstance(entry, dict):
            continue
        name = str(entry.get("name", ""))
        if is_credential_key(name):
            entry = {"name": name, "type": entry.get("type"), "value": REDACTED}
        variables.append(redact(entry))
    return {"variables": variables,
            "modules": [str(m) for m in payload.get("modules", [])][:200],
            "callables": [str(c) for c in payload.get("callables", [])][:200],
            "truncated": bool(payload.get("truncated"))}


#: What one inspection hands the model, in JSON characters (inside the pipeline's own bound).
RESULT_BUDGET = 14_000


def fit(result: dict[str, Any], budget: int = RESULT_BUDGET) -> dict[str, Any]:
    """Shrink a probe answer until its JSON fits ``budget``: fewer head rows, then no heads,
    then fewer columns, then columns counted only, then later variables named only
    (``omitted``). Says what it dropped
    so the model can ask for the names it needs (``names``)."""

    def size(value: dict[str, Any]) -> int:
        return len(json.dumps(value, ensure_ascii=False))

    if size(result) <= budget:
        return result
    variables = [dict(v) for v in result["variables"]]
    steps = (("head rows cut to 2", lambda v: {**v, "head": v["head"][:2]} if "head" in v
              else v),
             ("head rows left out", lambda v: {k: x for k, x in v.items() if k != "head"}),
             ("columns cut to 10", _fewer_columns),
             ("columns counted only", _no_columns))
    dropped: list[str] = []
    for label, step in steps:
        variables = [step(v) for v in variables]
        dropped.append(label)
        shrunk = {**result, "variables": variables, "shortened": list(dropped)}
        if size(shrunk) <= budget:
            return shrunk
    omitted: list[str] = []

    def final() -> dict[str, Any]:
        return {**result, "variables": variables, "shortened": dropped, "omitted": omitted,
                "truncated": True}

    while variables and size(final()) > budget:
        omitted.insert(0, str(variables.pop().get("name", "")))
    return final()


def _fewer_columns(entry: dict[str, Any]) -> dict[str, Any]:
    columns = entry.get("columns")
    if not isinstance(columns, list) or len(columns) <= 10:
        return entry
    extra = int(entry.get("more_columns", 0)) + len(columns) - 10
    return {**entry, "columns": columns[:10], "more_columns": extra}


def _no_columns(entry: dict[str, Any]) -> dict[str, Any]:
    columns = entry.get("columns")
    if not isinstance(columns, list):
        return entry
    kept = {k: v for k, v in entry.items() if k not in ("columns", "more_columns")}
    return {**kept, "column_count": len(columns) + int(entry.get("more_columns", 0))}
