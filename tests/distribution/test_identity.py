"""Who the caller is on a server started plainly (``jupyter server``, no scripts/run flags).

Jupyter's default identity provider makes a new anonymous user per token request without a
cookie; Kaizen adopts its own provider when the operator chose none, so the server-token
holder is one stable member, the owner. A provider the operator chose stays authoritative,
and so does JupyterHub's (tests/distribution/test_jupyterhub.py runs a real Hub).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from jupyter_server.auth.identity import IdentityProvider, PasswordIdentityProvider
from jupyter_server.serverapp import ServerApp
from traitlets.config import Config

from kaizen_server_extension.identity import KaizenTokenIdentityProvider, adopt_as_default
from kaizen_server_extension.testing.fake_openai import FakeOpenAI
from tests.distribution.support import OWNER_TOKEN, PlainServer, start_plain, user_env

JUPYTER_SERVER = [sys.executable, "-m", "jupyter_server"]


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlainServer]:
    root = tmp_path_factory.mktemp("plain")
    with FakeOpenAI([{"responses": [{"text": "Hello from the model."}]}]) as fake:
        server = start_plain(JUPYTER_SERVER, root, env=user_env(root, {
            "KAIZEN_OWNER_MEMBER": "olivia",
            "KAIZEN_MODEL_BASE_URL": fake.base_url, "KAIZEN_MODEL": "fake-model"}))
        try:
            yield server
        finally:
            server.stop()


def test_server_token_is_one_member_across_rest_requests(plain_server: PlainServer) -> None:
    """The reported bug: 201 for the conversation, then 404 for its message."""
    with plain_server.api() as api:
        created = api.post("kaizen/api/conversations", json={"agent_id": "general"})
        assert created.status_code == 201, created.text
        conversation = created.json()
        assert conversation["owner"] == "olivia"
        # A fresh client each time: no cookie carries the identity between requests.
    for _ in range(2):
        with plain_server.api() as api:
            me = api.get("kaizen/api/members/me")
            assert me.json()["member"] == "olivia"
    with plain_server.api() as api:
        accepted = api.post(f"kaizen/api/conversations/{conversation['id']}/messages",
                            json={"text": "hello"})
        assert accepted.status_code == 202, accepted.text
        listed = api.get("kaizen/api/conversations").json()
    assert [c["id"] for c in listed] == [conversation["id"]]
    assert "identity: the server's token and login are the owner member" in plain_server.log()


def test_browser_login_is_the_same_owner(plain_server: PlainServer) -> None:
    """Two browsers logging in with the token get the login cookie of the same member."""
    members = []
    for _ in range(2):
        with httpx.Client(base_url=plain_server.base_url, timeout=30) as browser:
            login = browser.get("api/me", params={"token": OWNER_TOKEN})
            assert login.status_code == 200
            assert browser.cookies, "the token login sets a cookie"
            me = browser.get("kaizen/api/members/me")  # the cookie alone, no token
            assert me.status_code == 200, me.text
            members.append(me.json()["member"])
    assert members == ["olivia", "olivia"]


def test_no_token_is_no_member(plain_server: PlainServer) -> None:
    with plain_server.api(token=None) as anonymous:
        assert anonymous.get("kaizen/api/members/me").status_code in (401, 403)
    with plain_server.api(token="not-the-server-token-at-all") as wrong:
        assert wrong.get("kaizen/api/members/me").status_code in (401, 403)


def test_a_configured_password_logs_in_as_the_owner(tmp_path: Path) -> None:
    """Kaizen's provider is Jupyter's password provider underneath: the password form works,
    and whoever logs in with it is the owner."""
    from jupyter_server.auth import passwd

    hashed = passwd("a-password-for-the-owner")
    server = start_plain([*JUPYTER_SERVER, f"--PasswordIdentityProvider.hashed_password={hashed}"],
                         tmp_path, env=user_env(tmp_path, {"KAIZEN_OWNER_MEMBER": "olivia"}))
    try:
        with httpx.Client(base_url=server.base_url, timeout=30) as browser:
            browser.get("login")
            xsrf = browser.cookies["_xsrf"]
            wrong = browser.post("login", data={"password": "not-it", "_xsrf": xsrf})
            assert browser.get("kaizen/api/members/me").status_code in (401, 403), wrong.text
            login = browser.post("login", data={"password": "a-password-for-the-owner",
                                                "_xsrf": xsrf})
            assert login.status_code in (200, 302), login.text
            me = browser.get("kaizen/api/members/me")
            assert me.status_code == 200, me.text
            assert me.json()["member"] == "olivia"
    finally:
        server.stop()


def test_an_identity_provider_the_operator_chose_stays(tmp_path: Path) -> None:
    """Naming Jupyter's own provider explicitly keeps its behaviour: Kaizen stands down."""
    server = start_plain([*JUPYTER_SERVER, "--ServerApp.identity_provider_class="
                          "jupyter_server.auth.identity.PasswordIdentityProvider"],
                         tmp_path, env=user_env(tmp_path, {"KAIZEN_OWNER_MEMBER": "olivia"}))
    try:
        names = set()
        for _ in range(2):
            with server.api() as api:
                names.add(api.get("kaizen/api/members/me").json()["member"])
        assert "olivia" not in names
        assert len(names) == 2, "Jupyter's default: a new anonymous user per request"
    finally:
        server.stop()


# --- adopt_as_default's decision, on unstarted ServerApp objects ------------------------------

def _serverapp(config: Config | None = None) -> ServerApp:
    app = ServerApp(config=config or Config())
    return app


def test_adopted_when_nothing_was_chosen() -> None:
    app = _serverapp()
    assert adopt_as_default(app, environ={}) is True
    assert app.identity_provider_class is KaizenTokenIdentityProvider
    # It is Jupyter's default provider underneath: password login keeps working.
    assert issubclass(KaizenTokenIdentityProvider, PasswordIdentityProvider)


@pytest.mark.parametrize("chosen", [PasswordIdentityProvider, IdentityProvider])
def test_not_adopted_when_configured(chosen: type[IdentityProvider]) -> None:
    config = Config()
    config.ServerApp.identity_provider_class = chosen
    app = _serverapp(config)
    assert adopt_as_default(app, environ={}) is False
    assert app.identity_provider_class is chosen


@pytest.mark.parametrize("variable", ["JUPYTERHUB_SERVICE_URL", "JUPYTERHUB_API_TOKEN"])
def test_not_adopted_in_a_jupyterhub_single_user_server(variable: str) -> None:
    """The Hub's extension may link after Kaizen's: its environment decides."""
    app = _serverapp()
    assert adopt_as_default(app, environ={variable: "x"}) is False
    assert app.identity_provider_class is PasswordIdentityProvider


def test_not_adopted_under_a_legacy_login_handler() -> None:
    """A custom login handler is pre-2.0 authentication, which Jupyter keeps as it was."""
    from jupyter_server.auth.login import LoginHandler

    class CustomLogin(LoginHandler):
        pass

    config = Config()
    config.ServerApp.login_handler_class = CustomLogin
    app = _serverapp(config)
    assert adopt_as_default(app, environ={}) is False
