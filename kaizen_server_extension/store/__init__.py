"""Durable store: SQLAlchemy 2 async over SQLite (embedded) or PostgreSQL."""

from kaizen_server_extension.store.core import Tx
from kaizen_server_extension.store.engine import create_engine, run_blocking, upgrade
from kaizen_server_extension.store.store import Store

__all__ = ["Store", "Tx", "create_engine", "run_blocking", "upgrade"]
