"""Trusted snapshot and register state (HASHLINE.md §2.1, §6; R-082…R-084, R-159).

Kept in the server process, never in the (untrusted) workspace: a tag resolves only inside the
namespace of the authenticated (actor, conversation), so a tag from another member,
conversation, expired history or colliding content cannot widen a write.

Per namespace: up to ``max_versions`` (4) full-text versions per path, most recent first, with
the set of 1-based line numbers a read actually displayed; up to ``max_paths`` paths (LRU) and
``max_chars`` retained characters; and the named registers. Namespaces are LRU-bounded too.
This in-memory :class:`WorkspaceState` is what the engine works on. The server keeps it in the
database between calls (``kaizen_server_extension/store/hashline_state.py``: loaded before a
call, changes saved after it), so state survives a lease release or a replica change; a host
without that service falls back to one process-wide instance.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from kaizen_hashline.text import compute_tag

MAX_VERSIONS = 4
MAX_PATHS = 256
MAX_CHARS = 64 * 1024 * 1024
MAX_NAMESPACES = 1024
MAX_REGISTERS = 64
MAX_REGISTER_LINES = 100_000


@dataclass(frozen=True, slots=True)
class WorkspaceKey:
    actor: str
    conversation_id: str


@dataclass(slots=True)
class Version:
    text: str
    tag: str
    seen: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _Namespace:
    paths: OrderedDict[str, list[Version]] = field(default_factory=OrderedDict)
    registers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    chars: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class WorkspaceState:
    def __init__(self, *, max_versions: int = MAX_VERSIONS, max_paths: int = MAX_PATHS,
                 max_chars: int = MAX_CHARS, max_namespaces: int = MAX_NAMESPACES) -> None:
        self.max_versions = max_versions
        self.max_paths = max_paths
        self.max_chars = max_chars
        self.max_namespaces = max_namespaces
        self._spaces: OrderedDict[WorkspaceKey, _Namespace] = OrderedDict()
        self._lock = threading.RLock()

    # --- namespaces ---------------------------------------------------------------------

    def _space(self, key: WorkspaceKey) -> _Namespace:
        space = self._spaces.get(key)
        if space is None:
            space = _Namespace()
            self._spaces[key] = space
            while len(self._spaces) > self.max_namespaces:
                self._spaces.popitem(last=False)
        else:
            self._spaces.move_to_end(key)
        return space

    @contextmanager
    def exclusive(self, key: WorkspaceKey) -> Iterator[None]:
        """Serialize reads/edits of one workspace (held across a whole edit)."""
        with self._lock:
            lock = self._space(key).lock
        with lock:
            yield

    # --- versions -----------------------------------------------------------------------

    def record(self, key: WorkspaceKey, path: str, text: str,
               seen: Iterable[int] = (), *, tag: str | None = None) -> Version:
        """Record ``text`` as the newest version of ``path`` (read fusion), adding ``seen``.

        ``tag`` may be passed when the caller already computed it for ``text``.
        """
        with self._lock:
            space = self._space(key)
            history = space.paths.get(path)
            if history is None:
                history = []
                space.paths[path] = history
            space.paths.move_to_end(path)
            for index, version in enumerate(history):
                if version.text == text:
                    version.seen.update(seen)
                    history.insert(0, history.pop(index))
                    return version
            version = Version(text=text, tag=tag or compute_tag(text), seen=set(seen))
            history.insert(0, version)
            space.chars += len(text)
            while len(history) > self.max_versions:
                space.chars -= len(history.pop().text)
            self._evict(space, keep=path)
            return version

    def _evict(self, space: _Namespace, keep: str) -> None:
        while len(space.paths) > self.max_paths or (space.chars > self.max_chars
                                                    and len(space.paths) > 1):
            oldest = next(iter(space.paths))
            if oldest == keep:
                break
            for version in space.paths.pop(oldest):
                space.chars -= len(version.text)

    def paths(self, key: WorkspaceKey) -> list[str]:
        """The namespace's paths, least recently used first (what a durable copy keeps)."""
        with self._lock:
            space = self._spaces.get(key)
            return list(space.paths) if space else []

    def versions(self, key: WorkspaceKey, path: str) -> list[Version]:
        with self._lock:
            space = self._spaces.get(key)
            return list(space.paths.get(path, ())) if space else []

    def lookup(self, key: WorkspaceKey, path: str, tag: str) -> tuple[Version, bool] | None:
        """The most recent version of ``path`` with ``tag``, and whether it is the newest."""
        history = self.versions(key, path)
        for index, version in enumerate(history):
            if version.tag == tag:
                return version, index == 0
        return None

    def paths_with_tag(self, key: WorkspaceKey, tag: str) -> list[str]:
        with self._lock:
            space = self._spaces.get(key)
            if space is None:
                return []
            return [p for p, history in space.paths.items()
                    if any(v.tag == tag for v in history)]

    def mark_seen(self, key: WorkspaceKey, path: str, version: Version,
                  lines: Iterable[int]) -> None:
        with self._lock:
            version.seen.update(lines)

    def move(self, key: WorkspaceKey, source: str, dest: str) -> None:
        """The snapshot history (and seen lines) follows a moved file."""
        with self._lock:
            space = self._space(key)
            history = space.paths.pop(source, None)
            if history is None:
                return
            for version in space.paths.pop(dest, []):
                space.chars -= len(version.text)
            space.paths[dest] = history

    def drop(self, key: WorkspaceKey, path: str) -> None:
        with self._lock:
            space = self._spaces.get(key)
            if space is None:
                return
            for version in space.paths.pop(path, []):
                space.chars -= len(version.text)

    # --- registers ----------------------------------------------------------------------

    def registers(self, key: WorkspaceKey) -> dict[str, tuple[str, ...]]:
        with self._lock:
            return dict(self._space(key).registers)

    def publish_registers(self, key: WorkspaceKey,
                          registers: Mapping[str, Sequence[str]]) -> None:
        """Store the named registers after a call's writes landed (bounded)."""
        with self._lock:
            kept: dict[str, tuple[str, ...]] = {}
            for name, rows in list(registers.items())[-MAX_REGISTERS:]:
                kept[name] = tuple(rows)[:MAX_REGISTER_LINES]
            self._space(key).registers = kept

    def forget(self, key: WorkspaceKey) -> None:
        with self._lock:
            self._spaces.pop(key, None)
