"""A credential form bound to one exact operation call (R-387, R-390).

A form issued for an External OpenAPI operation call binds, in its signed plan, besides the
member, the destination, the API base origin, the nonce and the five-minute expiry: the
source, the operation (its tool name), the digest of the source's schema document, the
digest of the call's arguments and the operation's effect class (:class:`CallBinding`). The
credential entered on it serves that call only: the broker refuses it for another operation,
other arguments, another effect, or after the source's document changed (a newly discovered
form is needed, R-390). The arguments themselves are not kept, only their digest.

A form issued for a call the pipeline **paused** for a credential (docs/credentials.md, "A
call that needs a credential") binds three things more: the conversation (the workroom), the
paused request's id, and the approval the call consumed before it paused — ``approval`` is
absent only for a call no approval authorized (a read, the member's conversation grant or
Never ask). The credential entered on it then serves that paused call only: a call with
another request id or another consumed approval is refused like one with other arguments
(R-387). A form for one call issued through ``POST credentials/forms`` has none of the three
and serves the call the model then makes with its ``credential_ref``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from kaizen_server_extension.policy.credential_arguments import CREDENTIAL_REF_ARGUMENT

_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
_EFFECTS = frozenset({"read", "write", "sensitive"})


class BindingMalformed(ValueError):
    """A plan's call binding that is not one this server writes."""


def call_arguments_digest(arguments: Mapping[str, Any]) -> str:
    """The digest a form binds and a call is compared with: the canonical JSON of the call's
    arguments without its ``credential_ref`` (the reference is what the form produces)."""
    plain = {k: v for k, v in arguments.items() if k != CREDENTIAL_REF_ARGUMENT}
    text = json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class CallIdentity:
    """One call as the pipeline is about to make it: what a bound credential is checked
    against."""

    tool: str
    args_digest: str
    schema_digest: str
    effect: str
    #: For a paused call being resumed: its request and the approval it consumed.
    request: str | None = None
    approval: str | None = None


#: The fields every call binding has; a paused call's binding has the optional ones too.
_REQUIRED = frozenset({"tool", "source", "operation", "schema_digest", "args_digest",
                       "effect", "api_base"})
_PAUSED = frozenset({"conversation", "request", "approval"})


@dataclass(frozen=True, slots=True)
class CallBinding:
    """The call a form is for (signed into its plan under ``call``)."""

    tool: str
    source: str
    operation: str
    schema_digest: str
    args_digest: str
    effect: str
    api_base: str
    #: A paused call's conversation, request id and consumed approval (None: not paused /
    #: no approval authorized it).
    conversation: str | None = None
    request: str | None = None
    approval: str | None = None

    def plan(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_plan(cls, value: object) -> CallBinding:
        if not isinstance(value, Mapping) or not _REQUIRED <= set(value) <= _REQUIRED | _PAUSED \
                or not all(isinstance(v, str) and v for v in value.values()):
            raise BindingMalformed("call binding")
        binding = cls(**{k: str(v) for k, v in value.items()})
        if binding.approval is not None and binding.request is None:
            raise BindingMalformed("call binding")
        if not (_DIGEST_RE.fullmatch(binding.schema_digest)
                and _DIGEST_RE.fullmatch(binding.args_digest)
                and binding.effect in _EFFECTS):
            raise BindingMalformed("call binding")
        return binding

    def mismatch(self, call: CallIdentity | None) -> str | None:
        """What differs between this binding and ``call`` (None when it is the same call)."""
        if call is None:
            return "the call"
        for field, mine, theirs in (("operation", self.tool, call.tool),
                                    ("arguments", self.args_digest, call.args_digest),
                                    ("schema", self.schema_digest, call.schema_digest),
                                    ("effect", self.effect, call.effect)):
            if mine != theirs:
                return field
        # A paused call's credential resumes that call, under the approval it consumed.
        if self.request is not None and (self.request, self.approval) != (call.request,
                                                                          call.approval):
            return "the call" if self.request != call.request else "approval"
        return None

    def public(self) -> dict[str, str]:
        """What the member and the REST answer may see: identity and digests, no arguments."""
        shown = {"tool": self.tool, "source": self.source, "operation": self.operation,
                 "effect": self.effect, "schema_digest": self.schema_digest,
                 "arguments_digest": self.args_digest}
        if self.request is not None:
            shown["request_id"] = self.request
            if self.approval is not None:
                shown["approval_id"] = self.approval
        return shown


__all__ = ["BindingMalformed", "CallBinding", "CallIdentity", "call_arguments_digest"]
