"""docker/entrypoint.sh, run as compose runs it (no container needed: it is a POSIX shell
script): the `secrets` service's files, and VAR_FILE turned into VAR for the programs that
cannot read a file themselves."""

from __future__ import annotations

import getpass
import stat
import subprocess
import sys
from pathlib import Path

from tests.distribution.support import start_plain, user_env

ENTRYPOINT = Path(__file__).resolve().parents[2] / "docker" / "entrypoint.sh"
SECRETS = ("jupyter_token", "gateway_token", "postgres_password", "cookie_secret")


def _entrypoint(*args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(["sh", str(ENTRYPOINT), *args], capture_output=True, text=True,
                            timeout=60, env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:"
                                             "/bin", **(env or {})})
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_secrets_are_made_once_and_read_verbatim(tmp_path: Path) -> None:
    printed = _entrypoint("secrets", str(tmp_path), env={"KAIZEN_PORT": "9090"})
    values = {name: (tmp_path / name).read_text() for name in SECRETS}
    for name, value in values.items():
        assert len(value) >= 32 and value == value.strip(), name  # no newline: Jupyter
    assert len(set(values.values())) == len(values)
    assert printed.strip() == ("kaizen: open http://localhost:9090/lab?token="
                               + values["jupyter_token"])
    pgpass = tmp_path / "pgpass"
    assert pgpass.read_text() == f"*:*:*:kaizen:{values['postgres_password']}\n"
    assert stat.S_IMODE(pgpass.stat().st_mode) == 0o600  # libpq and asyncpg require it
    _entrypoint("secrets", str(tmp_path))  # a restart keeps every secret
    assert {name: (tmp_path / name).read_text() for name in SECRETS} == values


def test_a_file_variable_becomes_the_variable(tmp_path: Path) -> None:
    (tmp_path / "gateway_token").write_text("the-gateway-token")
    out = _entrypoint("sh", "-c", 'printf %s "$KG_AUTH_TOKEN|$JUPYTER_GATEWAY_AUTH_TOKEN"',
                      env={"KG_AUTH_TOKEN_FILE": str(tmp_path / "gateway_token"),
                           "JUPYTER_GATEWAY_AUTH_TOKEN_FILE": str(tmp_path / "gateway_token")})
    assert out == "the-gateway-token|the-gateway-token"


def test_jupyter_accepts_the_token_the_secrets_service_made(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    _entrypoint("secrets", str(secrets))
    token = (secrets / "jupyter_token").read_text()
    env = user_env(tmp_path / "server", {"JUPYTER_TOKEN_FILE": str(secrets / "jupyter_token")})
    env.pop("JUPYTER_TOKEN")
    server = start_plain(["sh", str(ENTRYPOINT), sys.executable, "-m", "jupyter_server",
                          f"--ServerApp.cookie_secret_file={secrets / 'cookie_secret'}"],
                         tmp_path / "server", env=env)
    try:
        with server.api(token=token) as api:
            me = api.get("kaizen/api/members/me")
        assert me.status_code == 200, me.text
        assert me.json()["member"] == getpass.getuser()  # the owner
    finally:
        server.stop()
