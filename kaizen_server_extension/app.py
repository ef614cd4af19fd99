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
from traitlets import Int, List, Set, Unicode, default

from kaizen_server_extension.agents import AgentDefinition, AgentRegistrationError, collect_agents
from kaizen_server_extension.events import EventBus, LiveEventInvalid, PostgresLink
from kaizen_server_extension.settings import RuntimeSettings, SettingsError
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

    plugins = List(
        Unicode(),
        help="Extra plugin modules to load, as a third party would register them (default: "
        "KAIZEN_PLUGINS, comma-separated). Installed packages use the `kaizen` entry point.",
    ).tag(config=True)

    @default("plugins")
    def _default_plugins(self) -> list[str]:
        raw = os.environ.get("KAIZEN_PLUGINS", "")
        return [p.strip() for p in raw.split(",") if p.strip()]

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

        self.handlers.extend(handlers.routes())

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
        from kaizen_server_extension.gateway import GatewayConfig, ModelGateway
        from kaizen_server_extension.lanes.service import LaneConfig, LaneService, ModelGatewayPort
        from kaizen_server_extension.lanes.tooling import PipelineToolBackend
        from kaizen_server_extension.policy.guardrails import GuardrailChain
        from kaizen_server_extension.tools.registry import ToolRegistrationError, ToolRegistry

        try:
            registry = ToolRegistry.from_plugin_manager(plugins.pm, plugins.first_party)
        except ToolRegistrationError as exc:
            self._refuse_to_start(f"A tool plugin was refused: {exc}")
        guardrails = GuardrailChain.from_registrations(
            collect_registrations(plugins.pm, "kaizen_register_guardrails"))
        ctx.tools = PipelineToolBackend(
            ctx.store, registry,
            discovery_enabled=ctx.runtime.AGENT_TOOL_DISCOVERY_ENABLED,
            authorize=self._tool_authorizer(),
            guardrails=guardrails,
        )
        gateway: ModelGatewayPort | None = None
        if ctx.model_base_url:
            try:
                gateway = ModelGateway(GatewayConfig(
                    base_url=ctx.model_base_url, model=ctx.model or "default",
                    api_key=ctx.model_api_key))
            except ValueError as exc:
                self._refuse_to_start(f"Invalid setting KAIZEN_MODEL_BASE_URL: {exc}")
        else:
            # No endpoint: the embedded local model, when provisioned (kaizen-local-model).
            from kaizen_server_extension.gateway.local import (
                LOCAL_MODEL_NAME,
                local_gateway_from_env,
            )

            try:
                gateway = local_gateway_from_env(os.environ)
            except ValueError as exc:
                self._refuse_to_start(f"Invalid local model setting: {exc}")
            if gateway is not None:
                ctx.model = LOCAL_MODEL_NAME
                self.log.info("Kaizen model: the embedded local model (no "
                              "KAIZEN_MODEL_BASE_URL is set)")
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
        from kaizen_kernel.service import RunCodeConfig, RunCodeService
        from kaizen_server_extension.lanes.tooling import BridgeBinding
        from kaizen_server_extension.tools.types import MemberSafeError

        pool_size = int(os.environ.get("KAIZEN_KERNEL_POOL_SIZE", "1"))
        server_url = f"http://127.0.0.1:{serverapp.port}{serverapp.base_url}"
        service = RunCodeService(RunCodeConfig(
            state_root=Path(jupyter_data_dir()) / "kaizen" / "sandbox",
            bridge_url=bridge_url(server_url),
            pool_sizes={"python": max(0, pool_size)},
        ))

        async def dispatch(lease: KernelLease, name: str, arguments: dict[str, Any]) -> Any:
            binding = lease.active.context if lease.active else None
            if not isinstance(binding, BridgeBinding):
                raise MemberSafeError("No run_code call is in flight.", code="expired")
            return await binding.dispatch(name, arguments)

        serverapp.web_app.add_handlers(".*$", bridge_handlers(serverapp.base_url,
                                                              service.leases, dispatch))
        await service.start()
        self.kaizen.tools.attach_run_code(service)
        self._run_code = service

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
            tool_ceiling=agent.tool_ceiling)


def _redact_url(url: str) -> str:
    if "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    return f"{scheme}://***@{rest.split('@', 1)[1]}"
