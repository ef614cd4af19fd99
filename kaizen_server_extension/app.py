"""``KaizenApp``: the Jupyter server extension that wires store, lanes, runtime and API."""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from jupyter_core.paths import jupyter_data_dir
from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Float, Int, List, Set, Unicode, default

from kaizen_server_extension import preload
from kaizen_server_extension.agents import (
    DEFAULT_AGENT_ID,
    AgentDefinition,
    AgentRegistrationError,
    collect_agents,
)
from kaizen_server_extension.settings import (
    TRAITS,
    KaizenSettings,
    SettingsError,
    withheld_surfaces,
)

# The store, the runtime and the routes are imported where they are used, not here: the
# entry point imports this module, and preload.py loads those on a thread of their own
# meanwhile (start-up, bench/README.md extension_load).
if TYPE_CHECKING:
    import pluggy
    from sqlalchemy.ext.asyncio import AsyncEngine

    from kaizen_server_extension.context import KaizenContext
    from kaizen_server_extension.events import EventBus, PostgresLink
    from kaizen_server_extension.store import Store


@dataclass(frozen=True)
class LoadedPlugins:
    pm: pluggy.PluginManager
    first_party: frozenset[str]


def _from_settings(trait: str) -> Any:
    """The default of ``trait``: its setting as read from the environment."""

    def default_value(self: KaizenApp) -> Any:
        value = getattr(self._environment(), TRAITS[trait])
        return set(value) if isinstance(value, frozenset) else \
            list(value) if isinstance(value, tuple) else value

    return default(trait)(default_value)


class KaizenApp(ExtensionApp):
    """The server extension. Each configurable trait defaults from the setting of the same
    meaning in the environment (``settings.py: TRAITS``); Jupyter config wins, and the value a
    trait ends up with is validated like the environment's, so a bad one stops start-up
    naming it."""

    name = "kaizen_server_extension"
    description = "Kaizen: a guarded agent turn loop beside your Jupyter kernels."
    load_other_extensions = True

    database_url = Unicode(
        help="SQLAlchemy async URL of the store (default: KAIZEN_DATABASE_URL, else SQLite "
        "in the Jupyter data dir).",
    ).tag(config=True)
    database_schema = Unicode(
        help="PostgreSQL schema to use (search_path); empty for the default (default: "
        "KAIZEN_DATABASE_SCHEMA)."
    ).tag(config=True)
    admin_members = Set(
        help="Members with the admin role (default: KAIZEN_ADMIN_MEMBERS, comma-separated)."
    ).tag(config=True)
    max_message_bytes = Int(
        help="Largest message text accepted, in UTF-8 bytes (default: KAIZEN_MAX_MESSAGE_BYTES, "
        "else 256 KiB)."
    ).tag(config=True)
    model_base_url = Unicode(
        help="OpenAI-compatible endpoint (default: KAIZEN_MODEL_BASE_URL)."
    ).tag(config=True)
    model = Unicode(help="Model id sent to the endpoint (default: KAIZEN_MODEL).").tag(
        config=True
    )
    model_provider = Unicode(
        help="Name of the registered model provider to use (default: KAIZEN_MODEL_PROVIDER; "
        "empty: openai-compatible when model_base_url is set, else local).",
    ).tag(config=True)
    model_api_key_env = Unicode(
        "KAIZEN_MODEL_API_KEY",
        help="Name of the environment variable holding the model API key.",
    ).tag(config=True)
    plugins = List(
        Unicode(),
        help="Extra plugin modules to load, as a third party would register them (default: "
        "KAIZEN_PLUGINS, comma-separated). Installed packages use the `kaizen` entry point.",
    ).tag(config=True)
    library_enabled = Bool(
        help="Expose the member's Library: collections and projects over their artifacts, the "
        "agent tools inspect_library and manage_library, and its REST routes (default: "
        "KAIZEN_LIBRARY_ENABLED, else on). Off, the Library is indistinguishable from a "
        "feature this server never had: see docs/library.md.",
    ).tag(config=True)
    kernel_console = Bool(
        help="Let a member open their own persistent run_code kernel as a JupyterLab console "
        "(default: KAIZEN_KERNEL_CONSOLE, else on). The kernel then shows in the Jupyter "
        "kernels API, which every user of this Jupyter server may reach: see docs/run_code.md.",
    ).tag(config=True)
    kernel_idle_seconds = Float(
        help="Seconds a run_code kernel lease (its persistent kernels, and a console attached "
        "to one) lives after its last call (default: KAIZEN_KERNEL_IDLE_SECONDS, else 900).",
    ).tag(config=True)
    sandbox_jail = Unicode(
        help="bubblewrap jail for run_code kernels: 'auto' (when bwrap is installed), 'off', "
        "or 'required' (kernels refuse to start without it). Default: KAIZEN_SANDBOX_JAIL, "
        "else auto.",
    ).tag(config=True)
    task_poll_seconds = Float(
        help="Seconds between each replica's looks for due tasks (default: "
        "KAIZEN_TASK_POLL_SECONDS, else 5). A due task fires once however many replicas "
        "look: see docs/tasks.md.",
    ).tag(config=True)
    run_code_kernelspec = Unicode(
        help="An installed kernelspec that runs Python run_code (e.g. a conda env's python3; it "
        "needs ipykernel, not Kaizen). Default: KAIZEN_RUN_CODE_KERNELSPEC, else the server's "
        "own python3. An unknown name stops start-up.",
    ).tag(config=True)

    _default_database_url = _from_settings("database_url")
    _default_database_schema = _from_settings("database_schema")
    _default_admin_members = _from_settings("admin_members")
    _default_max_message_bytes = _from_settings("max_message_bytes")
    _default_model_base_url = _from_settings("model_base_url")
    _default_model = _from_settings("model")
    _default_model_provider = _from_settings("model_provider")
    _default_plugins = _from_settings("plugins")
    _default_library_enabled = _from_settings("library_enabled")
    _default_kernel_console = _from_settings("kernel_console")
    _default_kernel_idle_seconds = _from_settings("kernel_idle_seconds")
    _default_sandbox_jail = _from_settings("sandbox_jail")
    _default_task_poll_seconds = _from_settings("task_poll_seconds")
    _default_run_code_kernelspec = _from_settings("run_code_kernelspec")

    kaizen: KaizenContext
    _run_code: Any = None
    _gateway: Any = None
    _egress: Any = None
    _warming: Any = None
    _stack_probe: Any = None
    _environment_settings: KaizenSettings | None = None

    def _link_jupyter_server_extension(self, serverapp: Any) -> None:
        super()._link_jupyter_server_extension(serverapp)
        # Before the server builds its identity provider: the server-token holder must be one
        # member, not a new anonymous user per request (identity.py).
        from kaizen_server_extension.identity import adopt_as_default

        if adopt_as_default(serverapp):
            self.log.info("Kaizen identity: the server's token and login are the owner "
                          "member (set ServerApp.identity_provider_class to choose another)")

    def _environment(self) -> KaizenSettings:
        """The settings as the environment gives them, read once; a bad one stops start-up."""
        if self._environment_settings is None:
            try:
                self._environment_settings = KaizenSettings.from_environ(os.environ)
            except SettingsError as exc:
                self._refuse_to_start(str(exc))
        return self._environment_settings

    def _effective_settings(self) -> KaizenSettings:
        """The environment's settings with every trait's final value, validated as one."""
        overrides = {setting: getattr(self, trait) for trait, setting in TRAITS.items()}
        try:
            return self._environment().with_overrides(overrides)
        except SettingsError as exc:
            self._refuse_to_start(str(exc))

    def initialize_settings(self) -> None:
        settings = self._effective_settings()
        self._configure_kaizen_logs(settings)
        preload.wait()
        from kaizen_kernel.provisioner import find_bwrap
        from kaizen_server_extension.events import EventBus, PostgresLink
        from kaizen_server_extension.run_metrics import default_run_metrics
        from kaizen_server_extension.store import Store, create_engine, run_blocking
        from kaizen_server_extension.store.engine import is_sqlite
        from kaizen_server_extension.tools.registry import collect_registrations

        if settings.KAIZEN_SANDBOX_JAIL == "required" and find_bwrap() is None:
            self._refuse_to_start("Invalid setting KAIZEN_SANDBOX_JAIL: 'required' but "
                                  "bubblewrap (bwrap) is not installed")
        self._check_run_code_kernelspec(settings.KAIZEN_RUN_CODE_KERNELSPEC)
        database_url = settings.database_url(Path(jupyter_data_dir()))
        schema = settings.KAIZEN_DATABASE_SCHEMA or None
        plugins = self._load_plugins(settings)
        try:
            agents = collect_agents(collect_registrations(plugins.pm, "kaizen_register_agents"))
        except AgentRegistrationError as exc:
            self._refuse_to_start(str(exc))
        try:
            run_blocking(lambda: bootstrap(database_url, schema, agents))
        except Exception as exc:
            self.log.critical("Kaizen could not migrate its database: %s",
                              type(exc).__name__, exc_info=True)
            self._refuse_to_start("Kaizen could not open or migrate its database; see the "
                                  "log above.")
        store = Store(create_engine(database_url, schema=schema))
        bus = EventBus()
        store.add_listener(bus.publish_appended)
        store.add_listener(default_run_metrics().on_appended)
        events_link = None if is_sqlite(database_url) else \
            PostgresLink(bus, database_url, schema)
        ctx = self._wire_runtime(store, bus, settings, plugins, events_link)
        ctx.events_link = events_link
        self.kaizen = ctx
        self.settings.update({"kaizen": ctx})
        self.log.info("Kaizen store: %s", _redact_url(database_url))

    def initialize_handlers(self) -> None:
        from kaizen_server_extension.api import handlers

        self.handlers.extend(handlers.routes(
            library=self.kaizen.library_enabled,
            openapi_sources=self.kaizen.openapi_sources_enabled,
            credentials=self.kaizen.credentials is not None))
        if self.kaizen.settings.KAIZEN_MCP_SERVE_ENABLED:
            # Off, the path does not exist (docs/mcp.md, "Kaizen as an MCP server").
            from kaizen_server_extension.api.mcp_endpoint import mcp_endpoint_routes

            self.handlers.extend(mcp_endpoint_routes())

    def _check_run_code_kernelspec(self, name: str) -> None:
        """The kernelspec named for run_code is installed here and runs Python; else start-up
        stops naming the setting. A gateway's kernelspecs are its own (checked when its
        kernels are first listed, kaizen_kernel/remote/kernel.py)."""
        serverapp = self.serverapp
        gateway = getattr(serverapp, "gateway_config", None)
        if not name or (gateway is not None and gateway.gateway_enabled):
            return
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

        manager = getattr(serverapp, "kernel_spec_manager", None) or KernelSpecManager()
        setting = "KAIZEN_RUN_CODE_KERNELSPEC (c.KaizenApp.run_code_kernelspec)"
        try:
            spec = manager.get_kernel_spec(name)
        except NoSuchKernel:
            installed = ", ".join(sorted(manager.find_kernel_specs())) or "none"
            self._refuse_to_start(f"Invalid setting {setting}: no kernelspec named {name!r} is "
                                  f"installed (installed: {installed}; see jupyter kernelspec "
                                  "list)")
        if (spec.language or "").lower() != "python":
            self._refuse_to_start(f"Invalid setting {setting}: kernelspec {name!r} runs "
                                  f"{spec.language or 'an unknown language'}, not Python")

    def _configure_kaizen_logs(self, settings: KaizenSettings) -> None:
        from kaizen_server_extension import logs

        serverapp = self.serverapp
        logs.configure(settings.KAIZEN_LOG_FORMAT,
                       level=serverapp.log.getEffectiveLevel() if serverapp else logging.INFO,
                       jupyter_log=serverapp.log if serverapp is not None else None,
                       jupyter_format=getattr(serverapp, "log_format", None),
                       datefmt=getattr(serverapp, "log_datefmt", None))

    def _load_plugins(self, settings: KaizenSettings) -> LoadedPlugins:
        """First-party plugins, the ``kaizen`` entry points and ``KAIZEN_PLUGINS``, through
        one pluggy manager; a bad plugin stops start-up naming it."""
        from kaizen_server_extension.tools.registry import build_plugin_manager

        extra: list[tuple[str, object]] = []
        for name in settings.KAIZEN_PLUGINS:
            try:
                extra.append((name, importlib.import_module(name)))
            except ImportError as exc:
                self._refuse_to_start(f"Invalid setting KAIZEN_PLUGINS: cannot import {name} "
                                      f"({exc})")
        if settings.KAIZEN_PACKAGE_TOOLS_DIR:
            from kaizen_server_extension.tools.packages import PackageManifestError, load_packages

            try:
                packages = load_packages(
                    Path(settings.KAIZEN_PACKAGE_TOOLS_DIR),
                    deadline_s=settings.KAIZEN_PACKAGE_TOOL_DEADLINE_SECONDS)
            except (OSError, PackageManifestError) as exc:
                self._refuse_to_start(f"Invalid setting KAIZEN_PACKAGE_TOOLS_DIR: {exc}")
            extra.extend((f"package:{p.package}", p) for p in packages)
        pm, first_party = build_plugin_manager(extra_plugins=extra)
        return LoadedPlugins(pm, first_party)

    def _wire_runtime(self, store: Store, bus: EventBus, settings: KaizenSettings,
                      plugins: LoadedPlugins,
                      events_link: PostgresLink | None) -> KaizenContext:
        """Tool registry, guarded pipeline, model gateway and the room lanes."""
        from kaizen_server_extension.context import KaizenContext
        from kaizen_server_extension.host.delegation import DelegationLimits
        from kaizen_server_extension.host.task_tools import TaskTools
        from kaizen_server_extension.host.tool_backend import PipelineToolBackend
        from kaizen_server_extension.lanes.scheduler import TaskScheduler
        from kaizen_server_extension.lanes.service import LaneConfig, LaneService
        from kaizen_server_extension.policy.guardrails import GuardrailChain
        from kaizen_server_extension.store.tasks import TaskStore
        from kaizen_server_extension.tools.registry import (
            ToolRegistrationError,
            ToolRegistry,
            collect_registrations,
        )

        try:
            registry = ToolRegistry.from_plugin_manager(
                plugins.pm, plugins.first_party,
                withheld_surfaces=withheld_surfaces(
                    library_enabled=settings.KAIZEN_LIBRARY_ENABLED,
                    openapi_sources_enabled=settings.KAIZEN_OPENAPI_SOURCES_ENABLED))
        except ToolRegistrationError as exc:
            self._refuse_to_start(f"A tool plugin was refused: {exc}")
        guardrails = GuardrailChain.from_registrations(
            collect_registrations(plugins.pm, "kaizen_register_guardrails"))
        tools = PipelineToolBackend(
            store, registry,
            discovery_enabled=settings.AGENT_TOOL_DISCOVERY_ENABLED,
            authorize=self._tool_authorizer(),
            guardrails=guardrails,
        )
        if settings.KAIZEN_MCP_SERVERS:
            tools.attach_mcp(self._mcp_sources(settings))
        if settings.KAIZEN_OPENAPI_SOURCES_ENABLED:
            tools.attach_openapi(self._openapi_sources(settings, store))
        credentials = self._credentials(store, settings, tools)
        gateway, model, profile = self._model_gateway(settings, plugins)
        lanes = LaneService(
            store=store,
            tools=tools,
            gateway=lambda: gateway,
            config=LaneConfig(budgets=settings.budgets(),
                              correction_rules=settings.correction_rules(),
                              default_model=model,
                              daily_tokens=settings.LLM_PER_USER_DAILY_TOKENS,
                              notebook_context_chars=settings.KAIZEN_NOTEBOOK_CONTEXT_CHARS,
                              prompt_profile=profile,
                              delegation=DelegationLimits(
                                  max_depth=settings.KAIZEN_DELEGATION_MAX_DEPTH,
                                  max_calls=settings.KAIZEN_DELEGATION_MAX_CALLS,
                                  max_cycles=settings.KAIZEN_DELEGATION_MAX_CYCLES,
                                  timeout_s=settings.KAIZEN_DELEGATION_TIMEOUT_SECONDS)),
            publish_live=bus.publish_run_live,
            lease=settings.run_lease(),
            # On PostgreSQL the events link's connection also holds this process's liveness,
            # so another replica sees a crash in seconds (docs/architecture.md).
            liveness=events_link,
        )
        self._gateway = gateway
        scheduler = TaskScheduler(TaskStore(store), lanes.wake,
                                  interval_s=settings.KAIZEN_TASK_POLL_SECONDS)
        tools.attach_tasks(TaskTools(TaskStore(store, check_prompt=tools.check_task_prompt),
                                     lanes.wake))
        return KaizenContext(store=store, settings=settings, bus=bus, lanes=lanes, tools=tools,
                             model=model, scheduler=scheduler, credentials=credentials)

    def _credentials(self, store: Store, settings: KaizenSettings, tools: Any) -> Any:
        """The credential quarantine when KAIZEN_CREDENTIALS_ENABLED is on (docs/credentials.md):
        a bad key or destination stops start-up naming it, never showing the key."""
        if not settings.KAIZEN_CREDENTIALS_ENABLED:
            return None
        from kaizen_server_extension.credentials.crypto import CredentialKeyInvalid
        from kaizen_server_extension.credentials.destinations import DestinationInvalid
        from kaizen_server_extension.credentials.service import CredentialService

        try:
            service = CredentialService.from_settings(store, settings,
                                                      tools.permissions.allowed)
        except CredentialKeyInvalid as exc:
            self._refuse_to_start(f"Invalid setting {exc}")
        except DestinationInvalid as exc:
            self._refuse_to_start(f"Invalid setting KAIZEN_CREDENTIAL_DESTINATIONS: {exc}")
        tools.attach_credentials(service)
        if tools.openapi is not None:
            # Each security scheme of a member's source is a destination (docs/credentials.md).
            from kaizen_server_extension.credentials.openapi_destinations import (
                OpenApiDestinations,
            )

            service.destinations.attach(OpenApiDestinations(tools.openapi,
                                                            tools.permissions.allowed))
        return service

    def _mcp_sources(self, settings: KaizenSettings) -> Any:
        """The administrator-enabled MCP servers (docs/mcp.md). The ``mcp`` SDK is needed only
        when one is configured: without it, start-up stops saying so."""
        import importlib.util

        from kaizen_server_extension.tools.mcp_sources import McpServer, McpSources

        if importlib.util.find_spec("mcp") is None:
            self._refuse_to_start("KAIZEN_MCP_SERVERS names MCP servers but the mcp package "
                                  "is not installed: pip install 'kaizen-jupyter[mcp]'")
        servers = [McpServer(id=s.id, transport=s.transport, command=s.command,
                             args=s.args, url=s.url, enabled=s.enabled,
                             timeout_s=s.timeout_s, agents=s.agents,
                             credential_destination=s.credential_destination,
                             artifact_tools=frozenset(s.artifact_tools))
                   for s in settings.KAIZEN_MCP_SERVERS]
        return McpSources(servers, stdio_commands=settings.KAIZEN_MCP_STDIO_COMMANDS,
                          egress=self._mcp_egress(settings))

    def _signed_egress(self, settings: KaizenSettings, not_in_force: str) -> Any:
        """The egress door under the deployment's signed policy (tools/egress.py), shared by
        OpenAPI sources and MCP HTTP servers. A policy not in force is not fatal: the door
        fails closed, a warning starting with ``not_in_force`` says so, and a policy
        installed later is read then. An unreadable CA file stops start-up."""
        from kaizen_server_extension.tools.egress import Egress, EgressPolicy, EgressRefused
        from kaizen_server_extension.tools.egress_policy import EgressCeiling, parse_public_key

        key_text = settings.KAIZEN_OPENAPI_EGRESS_POLICY_KEY
        ceiling = EgressCeiling(settings.KAIZEN_OPENAPI_EGRESS_POLICY_FILE,
                                parse_public_key(key_text) if key_text else None)
        try:
            ceiling.current()
        except EgressRefused as refused:
            self.log.warning("%s: %s", not_in_force, refused.code)
        policy = EgressPolicy.build(settings.KAIZEN_OPENAPI_EGRESS_NETWORKS,
                                    settings.KAIZEN_OPENAPI_EGRESS_PORTS,
                                    ca_file=settings.KAIZEN_OPENAPI_CA_FILE,
                                    timeout_s=settings.KAIZEN_OPENAPI_TIMEOUT_SECONDS)
        try:
            return Egress(policy, ceiling)
        except (OSError, ValueError) as exc:
            self._refuse_to_start(f"KAIZEN_OPENAPI_CA_FILE cannot be read: {exc}")

    def _mcp_egress(self, settings: KaizenSettings) -> Any:
        """The signed egress policy's gate for MCP HTTP servers, when the deployment
        configured a policy (either setting); None otherwise (docs/mcp.md, "Egress"). A
        half-configured or invalid policy refuses every HTTP server: it fails closed."""
        if not (settings.KAIZEN_OPENAPI_EGRESS_POLICY_FILE
                or settings.KAIZEN_OPENAPI_EGRESS_POLICY_KEY):
            return None
        from kaizen_server_extension.tools.mcp_http import McpEgressGate

        return McpEgressGate(self._signed_egress(
            settings, "A signed egress policy is configured but not in force: every "
                      "streamable-HTTP MCP server is refused until a valid one is installed"))

    def _openapi_sources(self, settings: KaizenSettings, store: Any) -> Any:
        """The members' external OpenAPI sources behind the egress policy
        (docs/openapi-sources.md); built only with KAIZEN_OPENAPI_SOURCES_ENABLED on."""
        from kaizen_server_extension.store.openapi_sources import OpenApiSourceStore
        from kaizen_server_extension.tools.openapi_schema_cache import SchemaCache
        from kaizen_server_extension.tools.openapi_sources import OpenApiSources

        egress = self._signed_egress(
            settings, "External OpenAPI sources are enabled but every request to them is "
                      "refused until a valid signed egress policy is installed "
                      "(KAIZEN_OPENAPI_EGRESS_POLICY_FILE, KAIZEN_OPENAPI_EGRESS_POLICY_KEY)")
        self._egress = egress
        cache = SchemaCache(egress, fresh_s=settings.KAIZEN_OPENAPI_SCHEMA_FRESH_SECONDS,
                            stale_s=settings.KAIZEN_OPENAPI_SCHEMA_STALE_SECONDS)
        return OpenApiSources(OpenApiSourceStore(store), egress, cache,
                              cross_origin_enabled=settings.KAIZEN_OPENAPI_CROSS_ORIGIN_ENABLED,
                              timeout_s=settings.KAIZEN_OPENAPI_TIMEOUT_SECONDS,
                              credentials_enabled=settings.KAIZEN_CREDENTIALS_ENABLED,
                              query_auth_enabled=settings.KAIZEN_EXTERNAL_QUERY_AUTH_ENABLED)

    def _model_gateway(self, settings: KaizenSettings,
                       plugins: LoadedPlugins) -> tuple[Any, str, Any]:
        """The gateway of the model provider named by ``model_provider``, built by the factory
        a plugin registered (``kaizen_register_model_providers``; the built-in ones come from
        ``kaizen_plugins.providers``), the model id runs use by default, and the provider's
        prompt profile (models/profiles.py). An unknown name or unusable settings stop
        start-up."""
        from kaizen_server_extension.models.providers import (
            ModelProviderRegistry,
            ProviderConfigError,
            ProviderRegistrationError,
            ProviderSettings,
            create_gateway,
        )
        from kaizen_server_extension.tools.registry import collect_registrations

        try:
            providers = ModelProviderRegistry.from_registrations(
                collect_registrations(plugins.pm, "kaizen_register_model_providers"))
        except ProviderRegistrationError as exc:
            self._refuse_to_start(f"A model provider plugin was refused: {exc}")
        try:
            provider = providers.select(settings.KAIZEN_MODEL_PROVIDER,
                                        base_url=settings.KAIZEN_MODEL_BASE_URL)
            # The key is read from the variable the operator named, and only here.
            api_key = os.environ.get(self.model_api_key_env) or None
            # A provider plugin reads its own settings (KAIZEN_LOCAL_MODEL_* …) from these.
            gateway = create_gateway(provider, ProviderSettings(
                base_url=settings.KAIZEN_MODEL_BASE_URL, model=settings.KAIZEN_MODEL,
                api_key=api_key, environ=dict(os.environ)))
        except ProviderConfigError as exc:
            self._refuse_to_start(str(exc))
        model = settings.KAIZEN_MODEL
        if gateway is not None:
            if provider.fixed_model:
                model = provider.fixed_model
            self.log.info("Kaizen model provider: %s (plugin %s), prompt profile %s",
                          provider.name, providers.owner(provider.name),
                          provider.prompt_profile.name)
        return gateway, model, provider.prompt_profile

    def _tool_authorizer(self) -> Any:
        """``(member, tool) -> bool`` through the Jupyter server's Authorizer; a failing
        authorizer denies (fails closed)."""
        from jupyter_server.auth.identity import User

        assert self.serverapp is not None
        authorizer = self.serverapp.authorizer

        def authorize(member: str, tool: str) -> bool:
            try:
                # Called outside any request: there is no handler to pass. Authorizers that
                # need one raise, and a raise denies.
                return bool(authorizer.is_authorized(
                    None, User(username=member), "execute",  # type: ignore[arg-type]
                    f"kaizen:tools:{tool}"))
            except Exception:
                self.log.warning("the Jupyter authorizer failed for tool %s; denied", tool)
                return False

        return authorize

    async def _start_run_code(self, serverapp: Any) -> None:
        """Kernels for run_code, and the loopback bridge their ``tools.call`` uses."""
        from kaizen_kernel.bridge import bridge_handlers, bridge_url
        from kaizen_kernel.leases import KernelLease
        from kaizen_kernel.limits import ExecutionBudget
        from kaizen_kernel.remote.client import GatewaySettings
        from kaizen_kernel.service import RunCodeConfig, RunCodeService
        from kaizen_server_extension.host.tool_backend import BridgeBinding
        from kaizen_server_extension.logs import log_context
        from kaizen_server_extension.protocol.errors import MemberSafeError
        from kaizen_server_extension.run_metrics import default_run_metrics

        settings = self.kaizen.settings
        # Kernels on another host (a gateway) reach the bridge at the URL the operator gives.
        server_url = settings.KAIZEN_KERNEL_BRIDGE_BASE_URL or \
            f"http://127.0.0.1:{serverapp.port}{serverapp.base_url}"
        gateway_config = getattr(serverapp, "gateway_config", None)
        service = RunCodeService(RunCodeConfig(
            state_root=Path(jupyter_data_dir()) / "kaizen" / "sandbox",
            bridge_url=bridge_url(server_url),
            budget=ExecutionBudget(wall_seconds=float(settings.SANDBOX_MAX_WALL_SECONDS),
                                   output_bytes=settings.SANDBOX_MAX_OUTPUT_BYTES),
            pool_sizes={"python": settings.KAIZEN_KERNEL_POOL_SIZE},
            kernel_names={"python": settings.KAIZEN_RUN_CODE_KERNELSPEC}
            if settings.KAIZEN_RUN_CODE_KERNELSPEC else None,
            idle_timeout_s=settings.KAIZEN_KERNEL_IDLE_SECONDS,
            max_parked_kernels=settings.KAIZEN_KERNEL_MAX_PARKED,
            jail=settings.KAIZEN_SANDBOX_JAIL,
            # With --gateway-url the server's kernels live on the gateway; so do ours.
            gateway=GatewaySettings(
                workspace_mode=settings.KAIZEN_GATEWAY_WORKSPACE,
                transfer_max_file_bytes=settings.KAIZEN_GATEWAY_TRANSFER_MAX_FILE_BYTES,
                transfer_max_total_bytes=settings.KAIZEN_GATEWAY_TRANSFER_MAX_TOTAL_BYTES,
                transfer_max_files=settings.KAIZEN_GATEWAY_TRANSFER_MAX_FILES,
            ) if gateway_config is not None and gateway_config.gateway_enabled else None,
        ))

        async def dispatch(lease: KernelLease, name: str, arguments: dict[str, Any]) -> Any:
            binding = lease.active.context if lease.active else None
            if not isinstance(binding, BridgeBinding):
                raise MemberSafeError("No run_code call is in flight.", code="expired")
            # A bridge request is a tornado request, outside the run's task: carry its ids.
            with log_context(conversation_id=binding.bundle.conversation_id,
                             run_id=binding.bundle.run_id):
                return await binding.dispatch(name, arguments)

        serverapp.web_app.add_handlers(".*$", bridge_handlers(serverapp.base_url,
                                                              service.leases, dispatch))
        # Attached before the pool warms (which may wait on a slow or unreachable gateway):
        # the server already answers requests, and a turn arriving meanwhile starts its
        # kernel on demand instead of being told run_code does not exist.
        self.kaizen.tools.attach_run_code(service)
        default_run_metrics().attach_run_code(service)
        self._run_code = service
        await service.start()
        if service.config.gateway is None:
            # A line for the operator, from a probe of the kernels' interpreter (a process
            # of its own): it need not hold up the server's readiness.
            self._stack_probe = asyncio.get_running_loop().create_task(
                self._log_kernel_stack(service), name="kaizen-kernel-stack")
        # Persistent kernels can be attached to the Jupyter server's kernel manager for a
        # console (withdrawn when their lease lets them go; api/kernel_console.py).
        from kaizen_kernel.console import KernelConsoles
        from kaizen_server_extension.api.kernel_console import SETTINGS_KEY

        serverapp.web_app.settings[SETTINGS_KEY] = KernelConsoles(
            serverapp.kernel_manager, service, enabled=settings.KAIZEN_KERNEL_CONSOLE)

    async def _log_kernel_stack(self, service: Any) -> None:
        """One line naming which of the data stack the Python kernels' interpreter has
        (kaizen_kernel/stack.py); a gateway's kernels run elsewhere and are not asked."""
        from kaizen_kernel.pool import LanguageUnavailable
        from kaizen_kernel.stack import log_stack

        try:
            await log_stack(service.pool.kernel_name("python"))
        except LanguageUnavailable:
            self.log.warning("Kaizen run_code: no Python kernelspec is installed")
        except Exception:
            self.log.warning("Kaizen could not check its kernels' data stack", exc_info=True)

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        if self.kaizen.events_link is not None:
            await self.kaizen.events_link.start()
        # The member's notebooks and their kernels, through the server's own managers.
        from kaizen_server_extension.notebooks.service import NotebookService

        self.kaizen.tools.attach_notebooks(NotebookService(
            self.kaizen.store, contents_manager=serverapp.contents_manager,
            session_manager=serverapp.session_manager,
            kernel_manager=serverapp.kernel_manager,
            max_bytes=self.kaizen.jupyter_file_max_bytes))
        if self.kaizen.settings.KAIZEN_PROFILE:
            from kaizen_server_extension.profiling import LoopProfiler

            LoopProfiler(self.kaizen.settings.KAIZEN_PROFILE).install(
                asyncio.get_running_loop())
        await self.kaizen.lanes.start()
        self.kaizen.scheduler.start()
        self._warm_model()
        from kaizen_server_extension.run_metrics import default_run_metrics

        default_run_metrics().start_sampler(
            self.kaizen.store, self.kaizen.settings.KAIZEN_METRICS_INTERVAL_SECONDS)
        try:
            await self._start_run_code(serverapp)
        except Exception:
            # Chat keeps working without kernels; run_code answers that it is unavailable.
            self.log.exception("Kaizen could not start its run_code kernels")
        # Everything loaded so far (the server, its extensions, Kaizen's modules, registry and
        # catalogs) lives as long as the process: out of the collector's sight, a full
        # collection scans only what turns allocate since, instead of pausing a running turn
        # for the whole heap (≈0.3-0.5 s here, bench/README.md).
        gc.freeze()

    def _warm_model(self) -> None:
        """Warm the model gateway now, in the background, so the member's first question
        does not wait for it: an in-process model loads (the local gateway's ``warm``; a turn
        arriving meanwhile queues behind the load on the model's own thread), a remote one
        loads its HTTP transport."""
        warm = getattr(self._gateway, "warm", None)
        if warm is None:
            return

        async def load() -> None:
            try:
                # The default agent's new-conversation prompt, evaluated ahead of the first
                # question (models/local.py).
                await warm(await self.kaizen.lanes.first_step_prefix(DEFAULT_AGENT_ID))
            except Exception:  # logged by the gateway; each turn then reports it
                self.log.warning("Kaizen could not load its local model at start-up", exc_info=True)

        self._warming = asyncio.get_running_loop().create_task(load(), name="kaizen-warm")

    async def stop_extension(self) -> None:
        if getattr(self, "kaizen", None) is None:
            return  # start-up was refused before anything was opened
        if self._stack_probe is not None and not self._stack_probe.done():
            self._stack_probe.cancel()
        if self._run_code is not None:
            await self._run_code.close()
        from kaizen_server_extension.run_metrics import default_run_metrics

        await default_run_metrics().stop_sampler()
        await self.kaizen.scheduler.stop()
        await self.kaizen.lanes.stop()
        if self.kaizen.events_link is not None:
            await self.kaizen.events_link.stop()
        if self._gateway is not None:
            await self._gateway.aclose()
        if self._egress is not None:
            await self._egress.aclose()
        await self.kaizen.store.dispose()

    def _refuse_to_start(self, message: str) -> NoReturn:
        # SystemExit, not an exception: jupyter_server logs and ignores extension
        # exceptions, and a misconfigured guard must stop the server instead.
        self.log.critical(message)
        print(f"kaizen: {message}", file=sys.stderr)
        raise SystemExit(2)


async def bootstrap(url: str, schema: str | None,
                    agents: tuple[AgentDefinition, ...]) -> None:
    """Migrate the schema and seed the plugins' agents before the server takes requests.

    Replicas starting together on one PostgreSQL take turns: a session advisory lock, keyed
    by schema, is held for the whole bootstrap."""
    from kaizen_server_extension.store import create_engine

    engine = create_engine(url, schema=schema)
    try:
        async with bootstrap_lock(engine, schema):
            await _migrate_and_seed(engine, schema, agents)
    finally:
        await engine.dispose()


@asynccontextmanager
async def bootstrap_lock(engine: AsyncEngine, schema: str | None) -> AsyncIterator[None]:
    from sqlalchemy import text

    from kaizen_server_extension.store.engine import is_sqlite

    if is_sqlite(engine.url.render_as_string(hide_password=False)):
        yield  # SQLite's own write lock already serializes the migration
        return
    key = f"kaizen-bootstrap:{schema or ''}"
    async with engine.connect() as conn:
        await conn.execute(text("SELECT pg_advisory_lock(hashtext(:key))"), {"key": key})
        await conn.commit()
        try:
            yield
        finally:
            await conn.execute(text("SELECT pg_advisory_unlock(hashtext(:key))"),
                               {"key": key})
            await conn.commit()


async def _migrate_and_seed(engine: AsyncEngine, schema: str | None,
                            agents: tuple[AgentDefinition, ...]) -> None:
    from kaizen_server_extension.store import Store, upgrade

    await upgrade(engine, schema)
    store = Store(engine)
    for agent in agents:
        await store.agents.ensure_system_agent(
            agent.agent_id, agent.name, persona=agent.persona, mode=agent.mode,
            tool_ceiling=agent.tool_ceiling, knowledge_scope=agent.knowledge_scope)


def _redact_url(url: str) -> str:
    if "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    return f"{scheme}://***@{rest.split('@', 1)[1]}"
