"""``KaizenApp``: the Jupyter server extension that wires store, lanes, runtime and API."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy
from jupyter_core.paths import jupyter_data_dir
from jupyter_server.extension.application import ExtensionApp
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from traitlets import Bool, Float, Int, List, Set, Unicode, default

from kaizen_server_extension.agents import AgentDefinition, AgentRegistrationError, collect_agents
from kaizen_server_extension.events import EventBus, LiveEventInvalid, PostgresLink
from kaizen_server_extension.settings import RuntimeSettings, SettingsError, withheld_surfaces
from kaizen_server_extension.store import Store, create_engine, run_blocking, upgrade
from kaizen_server_extension.store.engine import is_sqlite, sqlite_url_for
from kaizen_server_extension.tools.registry import build_plugin_manager, collect_registrations


@dataclass(frozen=True)
class LoadedPlugins:
    pm: pluggy.PluginManager
    first_party: frozenset[str]

def default_database_url() -> str:
    return sqlite_url_for(Path(jupyter_data_dir()) / "kaizen" / "kaizen.db")


@dataclass
class KaizenContext:
    """Everything handlers need, placed in the tornado settings under ``"kaizen"``."""

    store: Store
    runtime: RuntimeSettings
    admin_members: frozenset[str]
    max_message_bytes: int
    model_base_url: str
    model: str
    model_api_key: str | None = field(repr=False, default=None)
    known_members: set[str] = field(default_factory=set)
    # Observers of the journal (websockets); the runtime publishes live-only events here.
    bus: EventBus = field(default_factory=EventBus)
    # Carries the bus across server processes on PostgreSQL; None on SQLite.
    events_link: PostgresLink | None = None
    # Set once the server starts; handlers reach lanes and tools through the context.
    lanes: Any = None
    tools: Any = None
    # Names of the registered tools (the admin tool-policy routes refuse any other).
    tool_names: frozenset[str] = frozenset()
    # The member's Library (its tools and REST routes); off, it does not exist here.
    library_enabled: bool = True

    def is_admin(self, member: str) -> bool:
        return member in self.admin_members

    def publish_live(self, conversation_id: str, kind: str, data: dict[str, Any]) -> None:
        """Live-only events (answer and thinking deltas): shown, never stored."""
        fields = dict(data)
        run_id = fields.pop("run_id", None)
        try:
            self.bus.publish_live(conversation_id,
                                  {"type": kind, "run_id": run_id, "data": fields})
        except LiveEventInvalid as exc:
            # A preview that cannot be shown must not fail the run: the journal has the rest.
            logging.getLogger("kaizen.events").warning("live event %s not published: %s",
                                                       kind, exc)


class KaizenApp(ExtensionApp):
    name = "kaizen_server_extension"
    description = "Kaizen: a guarded agent turn loop beside your Jupyter kernels."
    load_other_extensions = True

    database_url = Unicode(
        help="SQLAlchemy async URL of the store (default: KAIZEN_DATABASE_URL, else SQLite "
        "in the Jupyter data dir).",
    ).tag(config=True)

    database_schema = Unicode(
        "", help="PostgreSQL schema to use (search_path); empty for the default."
    ).tag(config=True)

    admin_members = Set(
        help="Members with the admin role (default: KAIZEN_ADMIN_MEMBERS, comma-separated)."
    ).tag(config=True)

    max_message_bytes = Int(
        help="Largest message text accepted, in UTF-8 bytes (default 256 KiB)."
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

    @default("model_provider")
    def _default_model_provider(self) -> str:
        return os.environ.get("KAIZEN_MODEL_PROVIDER", "")

    plugins = List(
        Unicode(),
        help="Extra plugin modules to load, as a third party would register them (default: "
        "KAIZEN_PLUGINS, comma-separated). Installed packages use the `kaizen` entry point.",
    ).tag(config=True)

    @default("plugins")
    def _default_plugins(self) -> list[str]:
        raw = os.environ.get("KAIZEN_PLUGINS", "")
        return [p.strip() for p in raw.split(",") if p.strip()]

    library_enabled = Bool(
        help="Expose the member's Library: collections and projects over their artifacts, the "
        "agent tools inspect_library and manage_library, and its REST routes (default: "
        "KAIZEN_LIBRARY_ENABLED, else on). Off, the Library is indistinguishable from a "
        "feature this server never had: see docs/library.md.",
    ).tag(config=True)

    @default("library_enabled")
    def _default_library_enabled(self) -> bool:
        try:
            return RuntimeSettings.from_environ(os.environ).KAIZEN_LIBRARY_ENABLED
        except SettingsError as exc:
            return bool(self._refuse_to_start(str(exc)))

    kernel_console = Bool(
        help="Let a member open their own persistent run_code kernel as a JupyterLab console "
        "(default: KAIZEN_KERNEL_CONSOLE, else on). The kernel then shows in the Jupyter "
        "kernels API, which every user of this Jupyter server may reach: see docs/run_code.md.",
    ).tag(config=True)

    @default("kernel_console")
    def _default_kernel_console(self) -> bool:
        return os.environ.get("KAIZEN_KERNEL_CONSOLE", "1").strip().lower() not in (
            "0", "false", "no", "off")

    kernel_idle_seconds = Float(
        help="Seconds a run_code kernel lease (its persistent kernels, and a console attached "
        "to one) lives after its last call (default: KAIZEN_KERNEL_IDLE_SECONDS, else 900).",
    ).tag(config=True)

    @default("kernel_idle_seconds")
    def _default_kernel_idle_seconds(self) -> float:
        raw = os.environ.get("KAIZEN_KERNEL_IDLE_SECONDS", "900")
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 1.0 <= value <= 7 * 24 * 3600.0:
            self._refuse_to_start("Invalid setting KAIZEN_KERNEL_IDLE_SECONDS: must be a "
                                  "number of seconds between 1 and 604800")
        return value

    sandbox_jail = Unicode(
        help="bubblewrap jail for run_code kernels: 'auto' (when bwrap is installed), 'off', "
        "or 'required' (kernels refuse to start without it). Default: KAIZEN_SANDBOX_JAIL, "
        "else auto.",
    ).tag(config=True)

    @default("sandbox_jail")
    def _default_sandbox_jail(self) -> str:
        return os.environ.get("KAIZEN_SANDBOX_JAIL", "auto").strip() or "auto"

    model_api_key_env = Unicode(
        "KAIZEN_MODEL_API_KEY",
        help="Name of the environment variable holding the model API key.",
    ).tag(config=True)

    @default("database_url")
    def _default_database_url(self) -> str:
        return os.environ.get("KAIZEN_DATABASE_URL") or default_database_url()

    @default("database_schema")
    def _default_database_schema(self) -> str:
        return os.environ.get("KAIZEN_DATABASE_SCHEMA", "")

    @default("admin_members")
    def _default_admin_members(self) -> set[str]:
        raw = os.environ.get("KAIZEN_ADMIN_MEMBERS", "")
        return {m.strip() for m in raw.split(",") if m.strip()}

    @default("max_message_bytes")
    def _default_max_message_bytes(self) -> int:
        return int(os.environ.get("KAIZEN_MAX_MESSAGE_BYTES", str(256 * 1024)))

    @default("model_base_url")
    def _default_model_base_url(self) -> str:
        return os.environ.get("KAIZEN_MODEL_BASE_URL", "")

    @default("model")
    def _default_model(self) -> str:
        return os.environ.get("KAIZEN_MODEL", "")

    _run_code: Any = None
    _gateway: Any = None

    def initialize_settings(self) -> None:
        try:
            runtime = RuntimeSettings.from_environ(os.environ)
        except SettingsError as exc:
            self._refuse_to_start(str(exc))
        if self.max_message_bytes < 1 or self.max_message_bytes > 64 * 1024 * 1024:
            self._refuse_to_start(
                "Invalid setting KAIZEN_MAX_MESSAGE_BYTES: must be between 1 and 67108864"
            )
        # Read now so a bad KAIZEN_KERNEL_IDLE_SECONDS stops start-up (its default refuses).
        self.kernel_idle_seconds  # noqa: B018
        from kaizen_kernel.provisioner import JAIL_MODES, find_bwrap

        if self.sandbox_jail not in JAIL_MODES:
            self._refuse_to_start("Invalid setting KAIZEN_SANDBOX_JAIL: must be one of "
                                  + ", ".join(JAIL_MODES))
        if self.sandbox_jail == "required" and find_bwrap() is None:
            self._refuse_to_start("Invalid setting KAIZEN_SANDBOX_JAIL: 'required' but "
                                  "bubblewrap (bwrap) is not installed")
        schema = self.database_schema or None
        plugins = self._load_plugins()
        try:
            agents = collect_agents(collect_registrations(plugins.pm, "kaizen_register_agents"))
        except AgentRegistrationError as exc:
            self._refuse_to_start(str(exc))
        try:
            run_blocking(lambda: bootstrap(self.database_url, schema, agents))
        except Exception as exc:
            self.log.critical("Kaizen could not migrate its database: %s",
                              type(exc).__name__, exc_info=True)
            self._refuse_to_start("Kaizen could not open or migrate its database; see the "
                                  "log above.")
        store = Store(create_engine(self.database_url, schema=schema))
        ctx = KaizenContext(
            store=store,
            runtime=runtime,
            admin_members=frozenset(self.admin_members),
            max_message_bytes=self.max_message_bytes,
            model_base_url=self.model_base_url,
            model=self.model,
            model_api_key=os.environ.get(self.model_api_key_env) or None,
            library_enabled=self.library_enabled,
        )
        store.add_listener(ctx.bus.publish_appended)
        if not is_sqlite(self.database_url):
            ctx.events_link = PostgresLink(ctx.bus, self.database_url, schema)
        try:
            self._wire_runtime(ctx, plugins)
        except SettingsError as exc:
            self._refuse_to_start(str(exc))
        self.kaizen = ctx
        self.settings.update({"kaizen": ctx})
        self.log.info("Kaizen store: %s", _redact_url(self.database_url))

    def initialize_handlers(self) -> None:
        from kaizen_server_extension.api import handlers

        self.handlers.extend(handlers.routes(library=self.kaizen.library_enabled))

    def _load_plugins(self) -> LoadedPlugins:
        """First-party plugins, the ``kaizen`` entry points and ``c.KaizenApp.plugins``,
        through one pluggy manager; a bad plugin stops start-up naming it."""
        extra: list[tuple[str, object]] = []
        for name in self.plugins:
            try:
                extra.append((name, importlib.import_module(name)))
            except ImportError as exc:
                self._refuse_to_start(f"Invalid setting KAIZEN_PLUGINS: cannot import {name} "
                                      f"({exc})")
        pm, first_party = build_plugin_manager(extra_plugins=extra)
        return LoadedPlugins(pm, first_party)

    def _wire_runtime(self, ctx: KaizenContext, plugins: LoadedPlugins) -> None:
        """Tool registry, guarded pipeline, model gateway and the room lanes."""
        from kaizen_server_extension.lanes.service import LaneConfig, LaneService, ModelGatewayPort
        from kaizen_server_extension.lanes.tooling import PipelineToolBackend
        from kaizen_server_extension.policy.guardrails import GuardrailChain
        from kaizen_server_extension.tools.registry import ToolRegistrationError, ToolRegistry

        try:
            registry = ToolRegistry.from_plugin_manager(
                plugins.pm, plugins.first_party,
                withheld_surfaces=withheld_surfaces(library_enabled=ctx.library_enabled))
        except ToolRegistrationError as exc:
            self._refuse_to_start(f"A tool plugin was refused: {exc}")
        ctx.tool_names = frozenset(registry.names())
        guardrails = GuardrailChain.from_registrations(
            collect_registrations(plugins.pm, "kaizen_register_guardrails"))
        ctx.tools = PipelineToolBackend(
            ctx.store, registry,
            discovery_enabled=ctx.runtime.AGENT_TOOL_DISCOVERY_ENABLED,
            authorize=self._tool_authorizer(),
            guardrails=guardrails,
        )
        gateway: ModelGatewayPort | None = self._model_gateway(ctx, plugins)
        ctx.lanes = LaneService(
            store=ctx.store,
            tools=ctx.tools,
            gateway=lambda: gateway,
            config=LaneConfig(budgets=ctx.runtime.budgets(),
                              correction_rules=ctx.runtime.correction_rules(),
                              default_model=ctx.model,
                              daily_tokens=ctx.runtime.LLM_PER_USER_DAILY_TOKENS),
            publish_live=ctx.publish_live,
        )
        self._gateway = gateway

    def _model_gateway(self, ctx: KaizenContext, plugins: LoadedPlugins) -> Any:
        """The gateway of the model provider named by ``model_provider``, built by the factory
        a plugin registered (``kaizen_register_model_providers``; the built-in ones come from
        ``kaizen_plugins.providers``). An unknown name or unusable settings stop start-up."""
        from kaizen_server_extension.gateway.providers import (
            ModelProviderRegistry,
            ProviderConfigError,
            ProviderRegistrationError,
            ProviderSettings,
            create_gateway,
        )

        try:
            providers = ModelProviderRegistry.from_registrations(
                collect_registrations(plugins.pm, "kaizen_register_model_providers"))
        except ProviderRegistrationError as exc:
            self._refuse_to_start(f"A model provider plugin was refused: {exc}")
        try:
            provider = providers.select(self.model_provider, base_url=ctx.model_base_url)
            gateway = create_gateway(provider, ProviderSettings(
                base_url=ctx.model_base_url, model=ctx.model, api_key=ctx.model_api_key,
                environ=dict(os.environ)))
        except ProviderConfigError as exc:
            self._refuse_to_start(str(exc))
        if gateway is not None:
            if provider.fixed_model:
                ctx.model = provider.fixed_model
            self.log.info("Kaizen model provider: %s (plugin %s)", provider.name,
                          providers.owner(provider.name))
        return gateway

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
        from kaizen_kernel.gateway import GatewaySettings
        from kaizen_kernel.leases import KernelLease
        from kaizen_kernel.service import RunCodeConfig, RunCodeService
        from kaizen_server_extension.lanes.tooling import BridgeBinding
        from kaizen_server_extension.protocol.errors import MemberSafeError

        pool_size = int(os.environ.get("KAIZEN_KERNEL_POOL_SIZE", "1"))
        # Kernels on another host (a gateway) reach the bridge at the URL the operator gives.
        server_url = os.environ.get("KAIZEN_KERNEL_BRIDGE_BASE_URL") or \
            f"http://127.0.0.1:{serverapp.port}{serverapp.base_url}"
        gateway_config = getattr(serverapp, "gateway_config", None)
        service = RunCodeService(RunCodeConfig(
            state_root=Path(jupyter_data_dir()) / "kaizen" / "sandbox",
            bridge_url=bridge_url(server_url),
            pool_sizes={"python": max(0, pool_size)},
            idle_timeout_s=self.kernel_idle_seconds,
            jail=self.sandbox_jail,
            # With --gateway-url the server's kernels live on the gateway; so do ours.
            gateway=GatewaySettings.from_env() if gateway_config is not None
            and gateway_config.gateway_enabled else None,
        ))

        async def dispatch(lease: KernelLease, name: str, arguments: dict[str, Any]) -> Any:
            binding = lease.active.context if lease.active else None
            if not isinstance(binding, BridgeBinding):
                raise MemberSafeError("No run_code call is in flight.", code="expired")
            return await binding.dispatch(name, arguments)

        serverapp.web_app.add_handlers(".*$", bridge_handlers(serverapp.base_url,
                                                              service.leases, dispatch))
        # Attached before the pool warms (which may wait on a slow or unreachable gateway):
        # the server already answers requests, and a turn arriving meanwhile starts its
        # kernel on demand instead of being told run_code does not exist.
        self.kaizen.tools.attach_run_code(service)
        self._run_code = service
        await service.start()
        # Persistent kernels can be attached to the Jupyter server's kernel manager for a
        # console (withdrawn when their lease lets them go; api/kernel_console.py).
        from kaizen_kernel.console import KernelConsoles
        from kaizen_server_extension.api.kernel_console import SETTINGS_KEY

        serverapp.web_app.settings[SETTINGS_KEY] = KernelConsoles(
            serverapp.kernel_manager, service, enabled=self.kernel_console)

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        if self.kaizen.events_link is not None:
            await self.kaizen.events_link.start()
        await self.kaizen.lanes.start()
        try:
            await self._start_run_code(serverapp)
        except Exception:
            # Chat keeps working without kernels; run_code answers that it is unavailable.
            self.log.exception("Kaizen could not start its run_code kernels")

    async def stop_extension(self) -> None:
        if getattr(self, "kaizen", None) is None:
            return  # start-up was refused before anything was opened
        if self._run_code is not None:
            await self._run_code.close()
        await self.kaizen.lanes.stop()
        if self.kaizen.events_link is not None:
            await self.kaizen.events_link.stop()
        if self._gateway is not None:
            await self._gateway.aclose()
        await self.kaizen.store.dispose()

    def _refuse_to_start(self, message: str) -> Any:
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
    engine = create_engine(url, schema=schema)
    try:
        async with bootstrap_lock(engine, schema):
            await _migrate_and_seed(engine, schema, agents)
    finally:
        await engine.dispose()


@asynccontextmanager
async def bootstrap_lock(engine: AsyncEngine, schema: str | None) -> AsyncIterator[None]:
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
