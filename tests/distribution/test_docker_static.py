"""docker/: what can be checked without a Docker engine (this machine has none).

Checked: hadolint lints the Dockerfile; dockerfile-parse reads its structure (multi-stage,
Node.js only in the build stage, a numeric non-root USER, a HEALTHCHECK on the readiness
route, the port compose uses); check-jsonschema validates compose.yaml against the
compose-spec schema; every variable compose sets is one its program reads; the services name
each other consistently; Caddy adapts the Caddyfile to exactly the replicas compose defines.
Not checked here: that the image builds and the containers start (docs/deploy.md says so);
tests/distribution/test_topology.py runs the same topology as processes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from kaizen_server_extension.api.handlers import routes
from kaizen_server_extension.settings import KaizenSettings

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
BIN = Path(sys.executable).parent
IN_CI = os.environ.get("CI") == "true"
SITE = Path(next(p for p in sys.path if p.endswith("site-packages")))


@pytest.fixture(scope="module")
def dockerfile() -> DockerfileParser:
    parser = DockerfileParser(path=str(DOCKER / "Dockerfile"))
    return parser


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((DOCKER / "compose.yaml").read_text()))


def _stages(parser: DockerfileParser) -> list[list[dict[str, Any]]]:
    stages: list[list[dict[str, Any]]] = []
    for instruction in parser.structure:
        if instruction["instruction"] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def test_hadolint_finds_nothing() -> None:
    result = subprocess.run([str(BIN / "hadolint"), str(DOCKER / "Dockerfile")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_is_multi_stage_with_node_only_in_the_build(
        dockerfile: DockerfileParser) -> None:
    stages = _stages(dockerfile)
    names = [stage[0]["value"].split()[-1] for stage in stages]
    assert names == ["node", "build", "runtime"], names
    runtime = " ".join(i["value"] for i in stages[-1])
    assert "from=node" not in runtime.replace(" ", "") and "nodejs" not in runtime
    assert "--no-index" in runtime, "the runtime installs only the build stage's wheels"
    build = " ".join(i["value"] for i in stages[1])
    assert "COPY --from=node" in " ".join(f"{i['instruction']} {i['value']}"
                                          for i in stages[1])
    assert "python -m build --wheel" in build


def test_the_runtime_runs_as_a_numeric_non_root_user(dockerfile: DockerfileParser) -> None:
    runtime = _stages(dockerfile)[-1]
    users = [i["value"] for i in runtime if i["instruction"] == "USER"]
    assert users, "the runtime stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, users
    # The user exists with that id in the image.
    assert f"useradd --create-home --uid {uid}" in " ".join(i["value"] for i in runtime)


def test_the_healthcheck_probes_the_readiness_route(dockerfile: DockerfileParser) -> None:
    runtime = _stages(dockerfile)[-1]
    [check] = [i["value"] for i in runtime if i["instruction"] == "HEALTHCHECK"]
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/[^'\"]+)", check)
    assert url, check
    port, path = url.groups()
    assert path == "/kaizen/api/health/ready"
    assert any(re.fullmatch(pattern, path) for pattern, _ in routes())
    exposed = [i["value"] for i in runtime if i["instruction"] == "EXPOSE"]
    assert exposed == [port]
    assert f"--port={port}" in " ".join(i["value"] for i in runtime if i["instruction"] == "CMD")


def test_the_compose_file_matches_the_compose_spec() -> None:
    result = subprocess.run([str(BIN / "check-jsonschema"), "--builtin-schema",
                             "vendor.compose-spec", str(DOCKER / "compose.yaml")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def _read_by_kaizen() -> set[str]:
    """Names Kaizen's code reads: the settings model's fields, and every KAIZEN_* literal."""
    names = set(KaizenSettings.model_fields)
    for package in ("kaizen_server_extension", "kaizen_kernel", "kaizen_hashline", "plugins"):
        for path in (REPO / package).rglob("*.py"):
            names.update(re.findall(r"\"(KAIZEN_[A-Z0-9_]+)\"", path.read_text()))
    return names


def _read_by(package: str, prefix: str) -> set[str]:
    names: set[str] = set()
    for path in (SITE / package).rglob("*.py"):
        names.update(re.findall(rf"\b({prefix}[A-Z0-9_]+)\b", path.read_text()))
    return names


def _read_by_entrypoint() -> set[str]:
    """The VAR_FILE names it turns into VAR, and the variables it reads itself."""
    text = (DOCKER / "entrypoint.sh").read_text()
    [names] = re.findall(r"for var in ([A-Z_ ]+); do", text)
    return {f"{name}_FILE" for name in names.split()} | set(re.findall(r"\$\{([A-Z_]+)", text))


def _read_by_caddy() -> set[str]:
    return set(re.findall(r"\{\$([A-Z_]+)", (DOCKER / "Caddyfile").read_text()))


def test_every_variable_compose_sets_is_read_by_its_program(compose: dict[str, Any]) -> None:
    kaizen = _read_by_kaizen()
    jupyter = _read_by("jupyter_server", "JUPYTER_")
    gateway = _read_by("kernel_gateway", "KG_")
    entrypoint = _read_by_entrypoint()
    postgres = {"POSTGRES_USER", "POSTGRES_DB", "POSTGRES_PASSWORD_FILE"}
    libpq = {"PGPASSFILE"}  # asyncpg reads it (passfile), like libpq
    unknown = []
    for name, service in compose["services"].items():
        for variable in service.get("environment", {}):
            if name == "proxy":
                known = variable in _read_by_caddy()
            elif name == "postgres":
                known = variable in postgres
            else:
                known = (variable in kaizen or variable in jupyter or variable in gateway
                         or variable in entrypoint or variable in libpq)
            if not known:
                unknown.append(f"{name}: {variable}")
    assert not unknown, unknown


def test_the_services_name_each_other_consistently(compose: dict[str, Any]) -> None:
    services = compose["services"]
    replicas = sorted(n for n in services if n.startswith("kaizen-"))
    assert replicas == ["kaizen-1", "kaizen-2"]
    for name in replicas:
        env = services[name]["environment"]
        database = urlsplit(env["KAIZEN_DATABASE_URL"])
        assert database.hostname in services and database.port == 5432
        assert database.password is None, "the password comes from PGPASSFILE, not the URL"
        assert urlsplit(env["JUPYTER_GATEWAY_URL"]).hostname == "kernels"
        # A kernel calls tools back at the replica whose run it serves.
        assert urlsplit(env["KAIZEN_KERNEL_BRIDGE_BASE_URL"]).hostname == name
        assert "--port=8888" in services[name]["command"]
        assert {"secrets", "postgres", "kernels"} <= set(services[name]["depends_on"])
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
    proxy = services["proxy"]
    upstreams = proxy["environment"]["KAIZEN_UPSTREAMS"].split()
    assert upstreams == [f"{name}:8888" for name in replicas]
    assert proxy["ports"] == ["${KAIZEN_PORT:-8080}:8080"]
    assert proxy["environment"]["KAIZEN_PROXY_PORT"] == "8080"
    # The image's ENTRYPOINT runs commands through docker/entrypoint.sh, whose own
    # subcommand makes the secrets the other services read.
    assert services["secrets"]["command"] == ["secrets", "/run/kaizen-secrets"]
    assert '"${1:-}" = secrets' in (DOCKER / "entrypoint.sh").read_text()
    for name in (*replicas, "kernels", "postgres"):
        assert "secrets" in services[name]["depends_on"], name
    # Both replicas sign login cookies with one secret: the proxy has no sticky sessions.
    assert all("--ServerApp.cookie_secret_file=/run/kaizen-secrets/cookie_secret"
               in services[name]["command"] for name in replicas)


def test_caddy_adapts_the_proxy_to_the_compose_replicas(compose: dict[str, Any]) -> None:
    caddy = shutil.which("caddy")
    if caddy is None:
        if IN_CI:
            pytest.fail("CI must install Caddy (apt-get install caddy)")
        pytest.skip("caddy is not installed (apt-get install caddy)")
    env = {**os.environ, **compose["services"]["proxy"]["environment"]}
    result = subprocess.run([caddy, "adapt", "--config", str(DOCKER / "Caddyfile"),
                             "--adapter", "caddyfile"], capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    server = json.loads(result.stdout)["apps"]["http"]["servers"]["srv0"]
    assert server["listen"] == [":8080"]
    [proxy] = server["routes"][0]["handle"]
    assert [u["dial"] for u in proxy["upstreams"]] == ["kaizen-1:8888", "kaizen-2:8888"]
    assert proxy["load_balancing"]["selection_policy"]["policy"] == "round_robin"
    assert proxy["health_checks"]["active"]["uri"] == "/kaizen/api/health/ready"
