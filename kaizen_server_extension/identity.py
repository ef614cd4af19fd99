"""Who the caller is: Kaizen's token → member identity provider, and when it applies.

Each member gets a token of their own; a request carrying ``Authorization: token <t>`` (or
``?token=``) is that member. Anything else falls through to the Jupyter server's own
identity (its token, password and login cookie), and whoever holds those is one stable member,
the *owner*. Tokens come from ``c.KaizenTokenIdentityProvider.member_tokens`` or, when unset,
from the ``KAIZEN_MEMBER_TOKENS`` environment variable (JSON object ``{"token": "member"}``).

Jupyter's default provider names a token holder "Anonymous <moon>", a new one per request
without a cookie, so a REST client would be a different member on every call.
:func:`adopt_as_default` therefore makes this provider the server's when the operator chose
none; any provider the operator or JupyterHub chose stays authoritative.
"""

from __future__ import annotations

import getpass
import hmac
import json
import os
from collections.abc import Mapping
from typing import Any

from jupyter_server.auth.identity import PasswordIdentityProvider, User
from jupyter_server.auth.login import LoginHandler
from tornado import web
from traitlets import Dict, Unicode, default, validate

ENV_TOKENS = "KAIZEN_MEMBER_TOKENS"
MIN_TOKEN_CHARS = 16
# Set in every single-user server JupyterHub spawns; its own provider then names the user.
HUB_ENV = ("JUPYTERHUB_SERVICE_URL", "JUPYTERHUB_API_TOKEN")


class KaizenTokenIdentityProvider(PasswordIdentityProvider):
    """Jupyter's default provider (token, optional password, login cookie) plus member tokens,
    with the server's own token holder as the owner instead of a random anonymous user."""

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

    def set_login_cookie(self, handler: web.RequestHandler, user: User) -> None:
        # Jupyter answers every token-authenticated request without the login cookie with a
        # fresh signed one. A client that sends its token in the Authorization header (a
        # script, the REST API's users) sends it again with each request and has no use for
        # the cookie, and signing and formatting it is about a tenth of such a request's
        # CPU. A token in the URL (a browser opening a link) and a password login still get
        # the cookie their browser session lives on.
        if self._authorized_by_header(handler):
            return
        super().set_login_cookie(handler, user)

    def _authorized_by_header(self, handler: web.RequestHandler) -> bool:
        if handler.get_argument("token", ""):
            return False
        return self.auth_header_pat.match(
            handler.request.headers.get("Authorization", "")) is not None

    def generate_anonymous_user(self, handler: web.RequestHandler) -> User:
        # The server's own token names no user; give it one stable member instead of a new
        # random "Anonymous" identity per browser, so conversations survive a new session.
        name = self.owner_member
        return User(username=name, name=name, display_name=name)


def adopt_as_default(serverapp: Any, environ: Mapping[str, str] | None = None) -> bool:
    """Make :class:`KaizenTokenIdentityProvider` the server's identity provider when nobody
    chose one; return whether it did.

    Called while the extension links, before the server builds its provider. It stands down
    when ``ServerApp.identity_provider_class`` was configured (a config file or the command
    line), when the class is no longer Jupyter's default, when a legacy login handler is
    configured, and inside a JupyterHub single-user server (its extension sets the Hub's
    provider, possibly after this one links)."""
    env = os.environ if environ is None else environ
    if any(env.get(name) for name in HUB_ENV):
        return False
    if "identity_provider_class" in serverapp.config.get("ServerApp", {}):
        return False
    if serverapp.identity_provider_class is not PasswordIdentityProvider:
        return False
    if serverapp.login_handler_class is not LoginHandler:
        return False
    serverapp.identity_provider_class = KaizenTokenIdentityProvider
    return True
