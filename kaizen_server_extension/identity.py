"""A token → member identity provider for tests and small teams.

Each member gets a token of their own; a request carrying ``Authorization: token <t>`` (or
``?token=``) is that member. Anything else falls through to the Jupyter server's own
identity (its token and login cookie), so the person who started the server keeps working.
Tokens come from ``c.KaizenTokenIdentityProvider.member_tokens`` or, when unset, from the
``KAIZEN_MEMBER_TOKENS`` environment variable (JSON object ``{"token": "member"}``).
"""

from __future__ import annotations

import getpass
import hmac
import json
import os
from typing import Any

from jupyter_server.auth.identity import IdentityProvider, User
from tornado import web
from traitlets import Dict, Unicode, default, validate

ENV_TOKENS = "KAIZEN_MEMBER_TOKENS"
MIN_TOKEN_CHARS = 16


class KaizenTokenIdentityProvider(IdentityProvider):
    member_tokens = Dict(
        key_trait=None,
        value_trait=None,
        help="Map of token to member name. Tokens must be at least 16 characters.",
    ).tag(config=True)

    @default("member_tokens")
    def _default_member_tokens(self) -> dict[str, str]:
        raw = os.environ.get(ENV_TOKENS, "").strip()
        if not raw:
            return {}
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ENV_TOKENS} is not valid JSON: {exc.msg}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{ENV_TOKENS} must be a JSON object of token to member")
        return {str(k): str(v) for k, v in value.items()}

    @validate("member_tokens")
    def _validate_member_tokens(self, proposal: Any) -> dict[str, str]:
        tokens: dict[str, str] = dict(proposal["value"])
        for token, member in tokens.items():
            if len(token) < MIN_TOKEN_CHARS:
                raise ValueError(f"member token for {member!r} is shorter than "
                                 f"{MIN_TOKEN_CHARS} characters")
            if not member or len(member) > 200:
                raise ValueError("member names must be 1-200 characters")
        return tokens

    owner_member = Unicode(
        help="Member name of whoever uses the server's own token or login (default: the "
        "operating-system user running the server).",
    ).tag(config=True)

    @default("owner_member")
    def _default_owner_member(self) -> str:
        return os.environ.get("KAIZEN_OWNER_MEMBER") or getpass.getuser()

    async def get_user_token(self, handler: web.RequestHandler) -> User | None:
        presented = self.get_token(handler)
        if presented:
            matched: str | None = None
            for token, member in self.member_tokens.items():
                # Compare every entry in constant time so timing says nothing about tokens.
                if hmac.compare_digest(presented.encode(), token.encode()):
                    matched = member
            if matched is not None:
                return User(username=matched, name=matched, display_name=matched)
        return await super().get_user_token(handler)

    def generate_anonymous_user(self, handler: web.RequestHandler) -> User:
        # The server's own token names no user; give it one stable member instead of a new
        # random "Anonymous" identity per browser, so conversations survive a new session.
        name = self.owner_member
        return User(username=name, name=name, display_name=name)
