"""Kaizen's settings: one pydantic model, read from the environment under each setting's name.

The spec's budgets keep the spec's names (``AGENT_LOOP_MAX_CYCLES`` …); Kaizen's own settings
are ``KAIZEN_*``. Every bound is validated here, once, and an out-of-bounds value stops
start-up with a message naming the setting (API.md, Model provider). The ``KaizenApp``
traitlets default from this model (``c.KaizenApp.<trait>`` in Jupyter config wins over the
environment) and the values they end up with are validated by the same model, so a setting
is checked the same way wherever it came from. Nothing else in the server reads its
configuration from ``os.environ``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kaizen_server_extension.runtime.port import Budgets, CorrectionRule

MAX_CORRECTION_RULES = 16
MAX_CORRECTION_ID_CHARS = 64
MAX_CORRECTION_PATTERN_CHARS = 200
MAX_CORRECTION_REMINDER_CHARS = 1000
#: The tool surface the Library's tools declare; ``KAIZEN_LIBRARY_ENABLED`` exposes it (R-140).
LIBRARY_SURFACE = "library"
#: The surface of manage_openapi_sources; ``KAIZEN_OPENAPI_SOURCES_ENABLED`` exposes it (R-378).
OPENAPI_SOURCES_SURFACE = "openapi_sources"
#: ``ctx.services`` name under which the tool backend hands that tool the member's sources.
OPENAPI_SOURCES_SERVICE = "openapi_sources"
#: The longest schema URL or API base a source may be registered with (the column's size).
OPENAPI_SOURCE_URL_MAX_CHARS = 2048
JAIL_MODES = ("auto", "off", "required")
#: One artifact version's bound, which a file read from the Jupyter tree becomes.
MAX_JUPYTER_FILE_BYTES = 25 * 1024 * 1024
GATEWAY_WORKSPACE_MODES = ("auto", "shared", "transfer")

#: ``KaizenApp`` trait -> the setting it defaults from (and is validated as).
TRAITS: Mapping[str, str] = {
    "database_url": "KAIZEN_DATABASE_URL",
    "database_schema": "KAIZEN_DATABASE_SCHEMA",
    "admin_members": "KAIZEN_ADMIN_MEMBERS",
    "max_message_bytes": "KAIZEN_MAX_MESSAGE_BYTES",
    "model_base_url": "KAIZEN_MODEL_BASE_URL",
    "model": "KAIZEN_MODEL",
    "model_provider": "KAIZEN_MODEL_PROVIDER",
    "plugins": "KAIZEN_PLUGINS",
    "library_enabled": "KAIZEN_LIBRARY_ENABLED",
    "kernel_console": "KAIZEN_KERNEL_CONSOLE",
    "kernel_idle_seconds": "KAIZEN_KERNEL_IDLE_SECONDS",
    "sandbox_jail": "KAIZEN_SANDBOX_JAIL",
    "task_poll_seconds": "KAIZEN_TASK_POLL_SECONDS",
    "run_code_kernelspec": "KAIZEN_RUN_CODE_KERNELSPEC",
}
SETTING_TRAITS: Mapping[str, str] = {setting: trait for trait, setting in TRAITS.items()}


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of ``url``, default ports spelled out; the parts a credential
    destination's origin and a server URL are compared by."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return ("", "", None)
    scheme = parts.scheme.lower()
    return (scheme, (parts.hostname or "").lower(),
            port or {"https": 443, "http": 80}.get(scheme))


class SettingsError(ValueError):
    """A setting is out of bounds; the message names it and is safe to print."""


def withheld_surfaces(*, library_enabled: bool,
                      openapi_sources_enabled: bool = False) -> frozenset[str]:
    """The tool surfaces this deployment does not expose, from its feature flags (R-140,
    R-378)."""
    withheld = set()
    if not library_enabled:
        withheld.add(LIBRARY_SURFACE)
    if not openapi_sources_enabled:
        withheld.add(OPENAPI_SOURCES_SURFACE)
    return frozenset(withheld)


def default_database_url(data_dir: Path) -> str:
    """The embedded store: SQLite in ``<Jupyter data dir>/kaizen/kaizen.db``."""
    return f"sqlite+aiosqlite:///{data_dir / 'kaizen' / 'kaizen.db'}"


class CorrectionRuleModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(min_length=1, max_length=MAX_CORRECTION_ID_CHARS,
                             pattern=r"^[A-Za-z0-9_.-]+$")]
    pattern: Annotated[str, Field(min_length=1, max_length=MAX_CORRECTION_PATTERN_CHARS)]
    reminder: Annotated[str, Field(min_length=1, max_length=MAX_CORRECTION_REMINDER_CHARS)]


PositiveCount = Annotated[int, Field(ge=1)]

#: At most this many MCP servers may be enabled on one server (docs/mcp.md).
MAX_MCP_SERVERS = 32


class McpServerModel(BaseModel):
    """One entry of ``KAIZEN_MCP_SERVERS``: a stdio command or a streamable-HTTP URL."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,23}$")]
    transport: Literal["stdio", "http"]
    command: Annotated[str, Field(max_length=4096)] = ""
    args: Annotated[tuple[Annotated[str, Field(max_length=4096)], ...], Field(max_length=64)] \
        = ()
    url: Annotated[str, Field(max_length=2048)] = ""
    enabled: bool = True
    timeout_s: Annotated[float, Field(ge=1, le=240)] = 30.0
    agents: Annotated[tuple[Annotated[str, Field(max_length=64)], ...],
                      Field(max_length=64)] = ()
    #: An http server's calls carry the member's credential for this destination of
    #: ``KAIZEN_CREDENTIAL_DESTINATIONS`` (docs/mcp.md, "Credentials"); empty: none.
    credential_destination: Annotated[str, Field(pattern=r"^([a-z][a-z0-9-]{0,31})?$")] = ""
    #: Tools of this server the administrator approves as version 2 renderable-artifact
    #: producers (docs/mcp.md, "Artifact producers"): this registration, never anything the
    #: server says, is the producer trust root (R-107, R-403).
    artifact_tools: Annotated[tuple[Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")],
                                    ...], Field(max_length=64)] = ()

    @field_validator("url")
    @classmethod
    def _plain_http_url(cls, url: str) -> str:
        if not url:
            return url
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url must be an http(s) URL with a host")
        if parts.username is not None or parts.password is not None or parts.fragment \
                or parts.query:
            # No credentials in the URL: the server is reached without any (docs/mcp.md).
            raise ValueError("url may not carry user information, a query or a fragment")
        return url

    def model_post_init(self, _context: Any) -> None:
        if self.transport == "stdio" and (not self.command or self.url):
            raise ValueError(f"MCP server {self.id!r}: a stdio server names a command "
                             "and no url")
        if self.transport == "http" and (not self.url or self.command or self.args):
            raise ValueError(f"MCP server {self.id!r}: an http server names a url and no "
                             "command")
        if self.credential_destination and self.transport != "http":
            raise ValueError(f"MCP server {self.id!r}: only an http server takes a "
                             "credential_destination")
        if len(set(self.artifact_tools)) != len(self.artifact_tools):
            raise ValueError(f"MCP server {self.id!r}: artifact_tools names a tool twice")
        for remote in self.artifact_tools:
            # The producer is recorded by its full tool name, which must be one we can call.
            if len(f"mcp__{self.id}__{remote}") > 64:
                raise ValueError(f"MCP server {self.id!r}: artifact tool {remote!r} makes a "
                                 "tool name longer than 64 characters")


#: At most this many static credential destinations (docs/credentials.md).
MAX_CREDENTIAL_DESTINATIONS = 64


class CredentialSchemeModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Query-string credentials are not offered for static destinations: a URL is logged and
    # cached in too many places (spec: External OpenAPI sources, the query-auth ceiling).
    # ``mtls``: a client certificate (and its key, and the key's passphrase when encrypted)
    # presented on the one request's own TLS connection (docs/credentials.md).
    kind: Literal["bearer", "header", "basic", "cookie", "mtls"]
    name: Annotated[str, Field(max_length=64)] = ""


class CredentialDestinationModel(BaseModel):
    """One entry of ``KAIZEN_CREDENTIAL_DESTINATIONS``: an origin and how a credential
    rides on a request to it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,31}$")]
    origin: Annotated[str, Field(max_length=300)]
    scheme: CredentialSchemeModel
    label: Annotated[str, Field(max_length=200)] = ""
    enabled: bool = True
    #: A CA bundle that verifies the destination's server certificate (a private CA), for
    #: the requests the broker sends itself; empty: the default trust store.
    ca_file: Annotated[str, Field(max_length=1024)] = ""

    # The origin and scheme are checked where they are used, at start-up
    # (credentials/service.py), which refuses to start naming the destination.


class KaizenSettings(BaseModel):
    """Every setting of the server, with its name, default and bounds."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    # --- the spec's budgets and guards -----------------------------------------------------
    AGENT_LOOP_MAX_CYCLES: Annotated[int, Field(ge=1, le=100)] = 10
    AGENT_LOOP_BUDGET_MS: Annotated[int, Field(ge=1_000, le=3_600_000)] = 120_000
    AGENT_LOOP_MAX_PARALLEL_TOOLS: Annotated[int, Field(ge=1, le=16)] = 1
    LLM_PER_USER_DAILY_TOKENS: Annotated[int, Field(ge=0)] = 0
    SANDBOX_MAX_WALL_SECONDS: Annotated[int, Field(ge=1, le=240)] = 30
    SANDBOX_MAX_OUTPUT_BYTES: Annotated[int, Field(ge=1024, le=64 * 1024 * 1024)] = 1024 * 1024
    AGENT_STREAM_CORRECTION_RULES: Annotated[
        tuple[CorrectionRuleModel, ...], Field(max_length=MAX_CORRECTION_RULES)
    ] = ()
    # Spec: defaults to 1 and is capped at 3.
    AGENT_STREAM_CORRECTION_MAX_ATTEMPTS: Annotated[int, Field(ge=0, le=3)] = 1
    AGENT_TOOL_DISCOVERY_ENABLED: bool = False
    # --- delegation (invoke_agent, docs/delegation.md; R-060) -------------------------------
    #: How many levels deep a delegation chain may go (0: invoke_agent refuses every call).
    KAIZEN_DELEGATION_MAX_DEPTH: Annotated[int, Field(ge=0, le=4)] = 2
    #: Delegations one run may make, at every depth together.
    KAIZEN_DELEGATION_MAX_CALLS: Annotated[int, Field(ge=1, le=16)] = 4
    #: Tool rounds of one delegated turn (never more than AGENT_LOOP_MAX_CYCLES).
    KAIZEN_DELEGATION_MAX_CYCLES: Annotated[int, Field(ge=1, le=100)] = 4
    #: How long one delegated turn may take, approvals it waits on included; below
    #: invoke_agent's own 240 s deadline so the model reads the delegation's typed error.
    KAIZEN_DELEGATION_TIMEOUT_SECONDS: Annotated[float, Field(ge=5, le=230)] = 180.0

    # --- the store -------------------------------------------------------------------------
    #: SQLAlchemy async URL; empty: SQLite in the Jupyter data dir.
    KAIZEN_DATABASE_URL: str = ""
    #: PostgreSQL schema for Kaizen's tables (search_path); empty: the default.
    KAIZEN_DATABASE_SCHEMA: Annotated[str, Field(pattern=r"^([A-Za-z_][A-Za-z0-9_]{0,62})?$")] \
        = ""
    #: Lease of an active run, renewed every quarter of it; another replica recovers a run
    #: whose lease ran out.
    KAIZEN_RUN_LEASE_SECONDS: Annotated[float, Field(ge=1, le=3600)] = 30.0
    #: How often each replica looks for due tasks (docs/tasks.md); a due task fires once
    #: however many replicas look.
    KAIZEN_TASK_POLL_SECONDS: Annotated[float, Field(ge=0.05, le=3600)] = 5.0

    # --- members and requests --------------------------------------------------------------
    KAIZEN_ADMIN_MEMBERS: frozenset[str] = frozenset()
    KAIZEN_MAX_MESSAGE_BYTES: Annotated[int, Field(ge=1, le=64 * 1024 * 1024)] = 256 * 1024
    #: The largest file of the Jupyter contents tree a member may attach; at most what one
    #: artifact version holds (store/artifacts/repository.py: MAX_FILE_BYTES).
    KAIZEN_JUPYTER_FILE_MAX_BYTES: Annotated[int, Field(ge=1, le=MAX_JUPYTER_FILE_BYTES)] = \
        MAX_JUPYTER_FILE_BYTES

    # --- the model -------------------------------------------------------------------------
    KAIZEN_MODEL_BASE_URL: str = ""
    KAIZEN_MODEL: str = ""
    #: A registered model provider by name; empty: openai-compatible with a base URL, else local.
    KAIZEN_MODEL_PROVIDER: str = ""

    # --- plugins and features --------------------------------------------------------------
    KAIZEN_PLUGINS: tuple[str, ...] = ()
    # Each surface answers to its own feature flag (spec: The closed built-in registry). Off,
    # the member's Library (its agent tools and REST routes) does not exist on this server.
    KAIZEN_LIBRARY_ENABLED: bool = True

    #: A directory of operator-installed tool packages (docs/plugins.md, "Package tools").
    KAIZEN_PACKAGE_TOOLS_DIR: str = ""
    #: Outer deadline of one package tool call; the shared 240 s ceiling bounds it (R-265).
    KAIZEN_PACKAGE_TOOL_DEADLINE_SECONDS: Annotated[float, Field(ge=1, le=240)] = 30.0

    #: Commands (exact paths) a stdio MCP server may run (docs/mcp.md); comma-separated.
    KAIZEN_MCP_STDIO_COMMANDS: tuple[str, ...] = ()
    #: The MCP servers the administrator enables, as a JSON list (docs/mcp.md). A stdio
    #: server's command must be in KAIZEN_MCP_STDIO_COMMANDS.
    KAIZEN_MCP_SERVERS: Annotated[tuple[McpServerModel, ...],
                                  Field(max_length=MAX_MCP_SERVERS)] = ()
    #: Kaizen's own MCP endpoint (POST /kaizen/mcp): the member's read tools for external
    #: agents, under their Jupyter identity (docs/mcp.md). Off unless set.
    KAIZEN_MCP_SERVE_ENABLED: bool = False

    # --- credential quarantine (docs/credentials.md) ----------------------------------------
    #: Members may enter credentials for the destinations below through signed forms, and
    #: credential-backed tools may use them through the broker. Off unless set.
    KAIZEN_CREDENTIALS_ENABLED: bool = False
    #: 32 random bytes, URL-safe base64: the deployment's key, from which the form-signing
    #: and the sealing keys are derived. Required when credentials are enabled; the same on
    #: every replica.
    KAIZEN_CREDENTIAL_KEY: SecretStr = SecretStr("")
    #: Offer "Remember" on the form: the value is sealed in the database and reusable until
    #: the member deletes it. Off, every credential is used once and never stored.
    KAIZEN_CREDENTIAL_REMEMBER_ENABLED: bool = False
    #: How long a credential form can be submitted, in seconds: the spec's five minutes at
    #: most; shorter only tightens it (a call paused for its form waits this long).
    KAIZEN_CREDENTIAL_FORM_SECONDS: Annotated[int, Field(ge=1, le=300)] = 300
    #: The administrator's credential destinations, as a JSON list (docs/credentials.md).
    KAIZEN_CREDENTIAL_DESTINATIONS: Annotated[
        tuple[CredentialDestinationModel, ...], Field(max_length=MAX_CREDENTIAL_DESTINATIONS)
    ] = ()
    # --- external OpenAPI sources (docs/openapi-sources.md) ----------------------------------
    #: Members may register HTTPS OpenAPI documents as tool sources. Off (the default), the
    #: routes do not exist and no source tool is offered, whatever the database holds (R-378).
    KAIZEN_OPENAPI_SOURCES_ENABLED: bool = False
    #: A source's API base may differ in origin from its schema URL only with the source's own
    #: consent and this admin ceiling on (R-383). Off unless set.
    KAIZEN_OPENAPI_CROSS_ORIGIN_ENABLED: bool = False
    #: An operation whose only supported authentication is an API key in the query string is
    #: offered (and its credential form accepted) only with this admin ceiling on (R-384);
    #: the spec's KAMIWAZA_EXTERNAL_QUERY_AUTH_ENABLED. Off unless set.
    KAIZEN_EXTERNAL_QUERY_AUTH_ENABLED: bool = False
    #: The egress policy (R-381): networks (CIDRs) a source's resolved address may be in. Empty:
    #: any globally routable address; loopback, private, link-local and other protected
    #: addresses are refused unless a network listed here contains them.
    KAIZEN_OPENAPI_EGRESS_NETWORKS: tuple[str, ...] = ()
    #: Ports a source may be reached on (R-381); comma-separated.
    KAIZEN_OPENAPI_EGRESS_PORTS: tuple[int, ...] = (443,)
    #: A PEM bundle of extra certificate authorities trusted for sources (besides the system's).
    KAIZEN_OPENAPI_CA_FILE: str = ""
    #: The signed egress policy (R-379): a file written by ``python -m
    #: kaizen_server_extension.tools.egress_sign sign``, re-read when it changes. Without a
    #: valid one in force, every schema fetch and operation call is refused. Once it or the
    #: key is set, streamable-HTTP MCP servers must be in the policy too (docs/mcp.md).
    KAIZEN_OPENAPI_EGRESS_POLICY_FILE: str = ""
    #: The Ed25519 public key (URL-safe base64) the policy must be signed with; the signing
    #: key stays off the server.
    KAIZEN_OPENAPI_EGRESS_POLICY_KEY: str = ""
    #: Seconds a fetched schema is fresh; after that it is revalidated with its ETag (R-327).
    KAIZEN_OPENAPI_SCHEMA_FRESH_SECONDS: Annotated[float, Field(ge=0, le=3600)] = 60.0
    #: Seconds past freshness a schema may still serve when its source cannot be reached or
    #: answers nonsense (the bounded stale fallback, R-327); 0: none.
    KAIZEN_OPENAPI_SCHEMA_STALE_SECONDS: Annotated[float, Field(ge=0, le=86_400)] = 600.0
    #: Bound of one request to a source (schema fetch or operation call).
    KAIZEN_OPENAPI_TIMEOUT_SECONDS: Annotated[float, Field(ge=1, le=240)] = 30.0

    # --- operators (docs/deploy.md) --------------------------------------------------------
    #: Kaizen's log lines as Jupyter's text, or one JSON object per line.
    KAIZEN_LOG_FORMAT: Literal["text", "json"] = "text"
    #: Seconds between two reads of the open runs for /metrics.
    KAIZEN_METRICS_INTERVAL_SECONDS: Annotated[float, Field(ge=1, le=3600)] = 15.0
    #: Development only: a path for a cProfile of the event loop's thread (CPU time), taken
    #: between SIGUSR1 and SIGUSR2 (kaizen_server_extension/profiling.py); empty: off.
    KAIZEN_PROFILE: str = ""

    # --- run_code kernels ------------------------------------------------------------------
    KAIZEN_KERNEL_CONSOLE: bool = True
    KAIZEN_KERNEL_IDLE_SECONDS: Annotated[float, Field(ge=1, le=7 * 24 * 3600)] = 900.0
    #: Persistent kernels kept across an approval wait (parked when the lease is released,
    #: R-239), oldest reclaimed first; each also for at most KAIZEN_KERNEL_IDLE_SECONDS.
    KAIZEN_KERNEL_MAX_PARKED: Annotated[int, Field(ge=0, le=256)] = 16
    KAIZEN_SANDBOX_JAIL: Literal["auto", "off", "required"] = "auto"
    #: An installed kernelspec (a conda env's or virtualenv's python3) for Python run_code;
    #: empty: the server's own ``python3``. It needs ipykernel there, not Kaizen.
    KAIZEN_RUN_CODE_KERNELSPEC: Annotated[
        str, Field(max_length=255, pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]*)?$")] = ""
    #: Warm Python kernels kept ready for the next call.
    KAIZEN_KERNEL_POOL_SIZE: Annotated[int, Field(ge=0, le=16)] = 1
    #: The server address kernels on another host use for ``tools.call``; empty: loopback.
    KAIZEN_KERNEL_BRIDGE_BASE_URL: str = ""
    #: With a kernel gateway: whether its kernels see the server's workspace files.
    KAIZEN_GATEWAY_WORKSPACE: Literal["auto", "shared", "transfer"] = "auto"
    #: Transfer mode's bounds on what one call sends to the kernel (capture's own defaults).
    KAIZEN_GATEWAY_TRANSFER_MAX_FILE_BYTES: PositiveCount = 25 * 1024 * 1024
    KAIZEN_GATEWAY_TRANSFER_MAX_TOTAL_BYTES: PositiveCount = 64 * 1024 * 1024
    KAIZEN_GATEWAY_TRANSFER_MAX_FILES: PositiveCount = 2000

    # --- the member's notebooks (docs/notebook.md) -------------------------------------------
    #: Characters of an attached notebook put into the turn's prompt (about 4 a token); the
    #: rest is one read_notebook call away.
    KAIZEN_NOTEBOOK_CONTEXT_CHARS: Annotated[int, Field(ge=1000, le=400_000)] = 16_000

    @field_validator("AGENT_STREAM_CORRECTION_RULES", "KAIZEN_MCP_SERVERS",
                     "KAIZEN_CREDENTIAL_DESTINATIONS", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        """These settings are JSON arrays in the environment; blank means none."""
        if isinstance(value, str):
            if not value.strip():
                return ()
            try:
                return json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"is not valid JSON ({exc.msg})") from None
        return value

    @field_validator("AGENT_STREAM_CORRECTION_RULES")
    @classmethod
    def _unique_rule_ids(
        cls, rules: tuple[CorrectionRuleModel, ...]
    ) -> tuple[CorrectionRuleModel, ...]:
        ids = [r.id for r in rules]
        if len(ids) != len(set(ids)):
            raise ValueError("rule ids must be unique")
        return rules

    @field_validator("KAIZEN_CREDENTIAL_DESTINATIONS")
    @classmethod
    def _unique_destinations(
        cls, destinations: tuple[CredentialDestinationModel, ...]
    ) -> tuple[CredentialDestinationModel, ...]:
        ids = [d.id for d in destinations]
        if len(ids) != len(set(ids)):
            raise ValueError("destination ids must be unique")
        return destinations

    @model_validator(mode="after")
    def _credentials_need_a_key(self) -> KaizenSettings:
        if self.KAIZEN_CREDENTIALS_ENABLED and not \
                self.KAIZEN_CREDENTIAL_KEY.get_secret_value().strip():
            raise ValueError(
                "KAIZEN_CREDENTIALS_ENABLED is on but KAIZEN_CREDENTIAL_KEY is not set: "
                "generate one with `python -m kaizen_server_extension.credentials.keygen` "
                "and give every replica the same value")
        return self

    @model_validator(mode="after")
    def _mcp_credentials_bound(self) -> KaizenSettings:
        """An MCP server bound to a credential destination needs the quarantine on and a
        destination on its own URL's origin (the broker sends nowhere else)."""
        destinations = {d.id: d for d in self.KAIZEN_CREDENTIAL_DESTINATIONS}
        for server in self.KAIZEN_MCP_SERVERS:
            if not server.credential_destination:
                continue
            named = f"KAIZEN_MCP_SERVERS: server {server.id!r}"
            if not self.KAIZEN_CREDENTIALS_ENABLED:
                raise ValueError(f"{named} takes credentials but KAIZEN_CREDENTIALS_ENABLED "
                                 "is off")
            destination = destinations.get(server.credential_destination)
            if destination is None:
                raise ValueError(f"{named} names credential destination "
                                 f"{server.credential_destination!r}, which "
                                 "KAIZEN_CREDENTIAL_DESTINATIONS does not declare")
            if _origin(destination.origin) != _origin(server.url):
                raise ValueError(f"{named} is not on the origin of credential destination "
                                 f"{destination.id!r}")
            if destination.scheme.kind == "mtls":
                # The MCP client's session presents no client certificate: binding one would
                # send the calls without it.
                raise ValueError(f"{named} cannot use the mutual-TLS destination "
                                 f"{destination.id!r}")
        return self

    @field_validator("KAIZEN_MCP_STDIO_COMMANDS")
    @classmethod
    def _absolute_commands(cls, commands: tuple[str, ...]) -> tuple[str, ...]:
        for command in commands:
            if not command.startswith("/"):
                # A bare name would be looked up on PATH when the server starts.
                raise ValueError(f"{command[:200]!r} is not an absolute path")
        return commands

    @field_validator("KAIZEN_MCP_SERVERS")
    @classmethod
    def _allowlisted_servers(cls, servers: tuple[McpServerModel, ...],
                             info: ValidationInfo) -> tuple[McpServerModel, ...]:
        ids = [s.id for s in servers]
        if len(ids) != len(set(ids)):
            raise ValueError("server ids must be unique")
        allowed = set(info.data.get("KAIZEN_MCP_STDIO_COMMANDS", ()))
        for server in servers:
            if server.transport == "stdio" and server.command not in allowed:
                # Only a command the administrator allowlisted is ever started.
                raise ValueError(f"server {server.id!r} runs {server.command[:200]!r}, which "
                                 "is not in KAIZEN_MCP_STDIO_COMMANDS")
        return servers

    @field_validator("KAIZEN_OPENAPI_EGRESS_NETWORKS")
    @classmethod
    def _networks(cls, networks: tuple[str, ...]) -> tuple[str, ...]:
        import ipaddress

        for network in networks:
            try:
                ipaddress.ip_network(network, strict=True)
            except ValueError:
                raise ValueError(f"{network[:100]!r} is not a network (CIDR)") from None
        return networks

    @field_validator("KAIZEN_OPENAPI_EGRESS_POLICY_KEY")
    @classmethod
    def _policy_key(cls, key: str) -> str:
        # An Ed25519 public key: 32 bytes, URL-safe base64 (tools/egress_policy.py).
        raw = key.strip()
        if raw:
            from kaizen_server_extension.key_text import decode_key

            decode_key(raw, 32, "an Ed25519 public key")
        return raw

    @field_validator("KAIZEN_OPENAPI_EGRESS_PORTS")
    @classmethod
    def _ports(cls, ports: tuple[int, ...]) -> tuple[int, ...]:
        if not ports or any(not 1 <= port <= 65535 for port in ports):
            raise ValueError("must list ports between 1 and 65535")
        return ports

    @field_validator("KAIZEN_ADMIN_MEMBERS", "KAIZEN_PLUGINS", "KAIZEN_MCP_STDIO_COMMANDS",
                     "KAIZEN_OPENAPI_EGRESS_NETWORKS", "KAIZEN_OPENAPI_EGRESS_PORTS",
                     mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("KAIZEN_SANDBOX_JAIL", "KAIZEN_GATEWAY_WORKSPACE", mode="before")
    @classmethod
    def _mode_word(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("KAIZEN_RUN_LEASE_SECONDS", "KAIZEN_KERNEL_IDLE_SECONDS",
                     "KAIZEN_TASK_POLL_SECONDS")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number of seconds")
        return value

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> KaizenSettings:
        """Read every field from ``environ`` under its own name; raise SettingsError.

        A variable set to the empty string counts as unset for anything but text, so
        ``KAIZEN_KERNEL_POOL_SIZE= scripts/run`` means the default, not an error."""
        raw: dict[str, Any] = {}
        for name, info in cls.model_fields.items():
            if name not in environ:
                continue
            value = environ[name]
            if not value.strip() and info.annotation is not str:
                continue
            raw[name] = value
        return cls._validated(raw)

    def with_overrides(self, overrides: Mapping[str, Any]) -> KaizenSettings:
        """These settings with ``overrides`` (by setting name) validated as if read."""
        return self._validated({**self.model_dump(), **overrides})

    @classmethod
    def _validated(cls, raw: Mapping[str, Any]) -> KaizenSettings:
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            if not first["loc"]:
                # A rule across settings: its message names them.
                raise SettingsError(f"Invalid settings: {first['msg']}") from None
            setting = str(first["loc"][0])
            trait = SETTING_TRAITS.get(setting)
            named = f"{setting} (c.KaizenApp.{trait})" if trait else setting
            raise SettingsError(f"Invalid setting {named}: {first['msg']}") from None

    # --- what the settings mean to the parts they configure --------------------------------

    def budgets(self) -> Budgets:
        return Budgets(
            max_cycles=self.AGENT_LOOP_MAX_CYCLES,
            inactivity_ms=self.AGENT_LOOP_BUDGET_MS,
            max_parallel_tools=self.AGENT_LOOP_MAX_PARALLEL_TOOLS,
            correction_max_attempts=self.AGENT_STREAM_CORRECTION_MAX_ATTEMPTS,
        )

    def correction_rules(self) -> tuple[CorrectionRule, ...]:
        return tuple(CorrectionRule(r.id, r.pattern, r.reminder)
                     for r in self.AGENT_STREAM_CORRECTION_RULES)

    def run_lease(self) -> timedelta:
        return timedelta(seconds=self.KAIZEN_RUN_LEASE_SECONDS)

    def database_url(self, data_dir: Path) -> str:
        return self.KAIZEN_DATABASE_URL or default_database_url(data_dir)
