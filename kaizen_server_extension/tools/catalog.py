"""Freezing a run's tool catalog: which tools this agent, in this room, for this member, gets.

Order of the filters (each narrows, none widens):

1. the agent's tool list is a ceiling (R-001); ``explicit_grant_only`` tools need it to name them;
2. the shared-room admission class of each tool (spec: Shared-room admission classes);
3. the descriptor must be well formed (schema.admit_descriptors, R-328/R-330);
4. a multi-call protocol is admitted whole or not at all (R-251/R-301).

The admitted set is projected once (bounds ≥ 2000 stripped, R-335), sorted by name, deep-frozen
and bound to a sha256 digest (R-337). With discovery on, non-first-party tools are deferred
behind ``tool_search`` (R-323); the member's request can earn a deferred tool a bounded
first-step slot (R-298) or, in the strict imperative form, make it the required tool (R-302).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from kaizen_server_extension.protocol.tools import AdvertisedTool
from kaizen_server_extension.tools._frozen import deep_freeze
from kaizen_server_extension.tools.schema import Omitted, admit_descriptors, project_schema
from kaizen_server_extension.tools.types import RoomClass, ToolDescriptor

log = logging.getLogger(__name__)

TOOL_SEARCH_NAME = "tool_search"
# How many tools the member's wording can pull forward onto the first step (a protocol counts
# all its members, and is promoted whole or not at all).
FIRST_STEP_SLOT_LIMIT = 4

# Classes that may enter a room whose audience is more than the initiating member. Actor-bound
# reads and writes run only as the initiator (the callback re-verifies it, R-213/R-221).
_SHARED_ROOM_CLASSES = frozenset(
    {RoomClass.AUDIENCE_SAFE_READ, RoomClass.ACTOR_BOUND_READ, RoomClass.ACTOR_BOUND_WRITE}
)


@dataclass(frozen=True)
class FrozenCatalog:
    """One run's authorized tools. Nothing in it can be changed after :func:`freeze_catalog`."""

    # The direct set the model sees on an ordinary step (tool_search included when on).
    advertised: tuple[AdvertisedTool, ...]
    # sha256 over the whole projected catalog, deferred tools included.
    digest: str
    # Every authorized tool by name, with its ORIGINAL schema (what calls are validated with).
    descriptors: Mapping[str, ToolDescriptor]
    # Authorized but not advertised: reachable through tool_search.
    deferred: tuple[str, ...] = ()
    # Every authorized tool's advertised projection by name (direct and deferred).
    projected: Mapping[str, AdvertisedTool] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    # The first step's direct set: ``advertised`` plus tools the request named.
    first_step: tuple[AdvertisedTool, ...] = ()
    # The one tool the first step must call, when the request demands it.
    required_tool: str | None = None
    # Descriptors dropped as malformed, for operators (never advertised, never repaired).
    omitted: tuple[Omitted, ...] = ()

    def __contains__(self, name: object) -> bool:
        return name in self.descriptors

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.descriptors)

    def advertised_for(self, names: Iterable[str]) -> tuple[AdvertisedTool, ...]:
        """The projections of ``names`` that are in the catalog, sorted by name (for a step
        whose direct set is narrowed, e.g. to the required tool, or widened by discovery)."""
        return tuple(self.projected[n] for n in sorted(set(names)) if n in self.projected)

    def protocol_of(self, name: str) -> tuple[str, ...]:
        """``name`` with every catalog member of its protocol group."""
        group = self.descriptors[name].protocol_group
        if group is None:
            return (name,)
        return tuple(n for n, d in self.descriptors.items() if d.protocol_group == group)


def room_admits(
    descriptor: ToolDescriptor, *, room_shared: bool, roster_is_only_initiator: bool
) -> bool:
    """Whether the tool may enter this turn (spec: Shared-room admission classes).

    A room is treated as shared when it is durable-shared *or* its roster holds anyone besides
    the initiator: the roster, not the room flag, is what the actor-private rule reads (R-218).
    """
    room_class = descriptor.room_class
    if descriptor.private_room_only and (room_shared or not roster_is_only_initiator):
        return False  # the member's own material; a shared room's later readers are others
    if room_class is RoomClass.AUDIENCE_SAFE_READ and not descriptor.first_party:
        # Proving a room scope takes a dedicated first-party adapter; a package or dynamic
        # descriptor cannot claim it.
        room_class = RoomClass.UNKNOWN
    if room_class is RoomClass.ACTOR_PRIVATE_READ:
        return roster_is_only_initiator  # shared flag or not
    if room_shared or not roster_is_only_initiator:
        return room_class in _SHARED_ROOM_CLASSES  # UNKNOWN never
    return True


def freeze_catalog(
    descriptors: Iterable[ToolDescriptor],
    *,
    agent_ceiling: set[str] | frozenset[str] | None,
    room_shared: bool,
    roster_is_only_initiator: bool,
    discovery_enabled: bool,
    member_request: str = "",
    direct: Collection[str] | None = None,
    earned: Sequence[str] = (),
    attached: Sequence[str] = (),
    description_chars: int | None = None,
    routed: str | None = None,
) -> FrozenCatalog:
    """Apply the filters above and freeze the result.

    ``direct`` is a prompt profile's context budget (``models/profiles.py``): when given,
    discovery is on whatever ``discovery_enabled`` says, and the first step advertises only
    ``tool_search``, the ``direct`` tools, the ``earned`` ones (what the turn's own context
    names: attached files earn run_code, an unfinished artifact version update_artifact,
    R-299) and the request's slot (R-298); every other authorized tool is deferred. A protocol
    enters whole (R-301). ``description_chars`` bounds each projected description.
    ``attached`` are a saved prompt's admitted step attachments
    (policy/prompt_attachments.py): on the first step under any profile, when authorized.

    ``routed`` is a server-authored routing grant: the one tool a specialist agent's first
    step must call (the Search agent searches before it answers). When that tool is in the
    catalog it is the run's required tool, whatever the member's wording asks (R-307).

    ``agent_ceiling`` is the agent's tool list; ``None`` means the agent declares none and is
    bounded only by what is registered, except ``explicit_grant_only`` tools, which need an
    explicit list naming them (R-136). ``tool_search`` is not granted by the agent: it is
    admitted exactly when discovery is on.
    """
    candidates = _unique(descriptors)
    by_group: dict[str, set[str]] = defaultdict(set)
    for d in candidates:
        if d.protocol_group is not None:
            by_group[d.protocol_group].add(d.name)

    def granted(d: ToolDescriptor) -> bool:
        if d.name == TOOL_SEARCH_NAME:
            return discovery_enabled or direct is not None
        if agent_ceiling is None:
            return not d.explicit_grant_only
        return d.name in agent_ceiling

    chosen = [
        d for d in candidates
        if granted(d) and room_admits(
            d, room_shared=room_shared, roster_is_only_initiator=roster_is_only_initiator
        )
    ]
    admitted, omitted = admit_descriptors(chosen)
    admitted_names = {d.name for d in admitted}
    # A tool that needs others enters only beside them (R-180: request_document needs search
    # and run_code in the same catalog, so the same room admission and agent ceiling).
    admitted = [d for d in admitted if d.requires_tools <= admitted_names]
    admitted_names = {d.name for d in admitted}
    # A protocol with any member missing (not granted, not room-safe, malformed) is dropped.
    broken = {g for g, members in by_group.items() if not members <= admitted_names}
    final = sorted(
        (deep_freeze_descriptor(d) for d in admitted if d.protocol_group not in broken),
        key=lambda d: d.name,
    )

    use_discovery = (discovery_enabled or direct is not None) and any(
        d.name == TOOL_SEARCH_NAME for d in final)
    budgeted = direct is not None and use_discovery
    deferred = tuple(d.name for d in final if use_discovery and (
        d.name != TOOL_SEARCH_NAME if budgeted else _deferrable(d)))
    projected = {d.name: project(d, description_chars=description_chars) for d in final}
    advertised = tuple(projected[d.name] for d in final if d.name not in deferred)
    frozen_descriptors = MappingProxyType({d.name: d for d in final})

    draft = FrozenCatalog(
        advertised=advertised,
        digest=catalog_digest(final, projected, deferred),
        descriptors=frozen_descriptors,
        deferred=deferred,
        projected=MappingProxyType(projected),
        omitted=tuple(omitted),
    )
    slot = first_step_slot(member_request, draft)
    required = routed if routed is not None and routed in draft.descriptors \
        else required_tool_from_request(member_request, draft)
    first = {a.name for a in advertised} | set(slot)
    if budgeted:
        assert direct is not None
        preferred = delivery_preference(member_request, draft)
        for name in (*((required,) if required else ()), *earned, *preferred, *direct):
            if name in draft.descriptors:
                first.update(draft.protocol_of(name))
    for name in attached:
        if name in draft.descriptors:  # the catalog stays the only callable set
            first.update(draft.protocol_of(name))
    return dataclasses.replace(
        draft, first_step=draft.advertised_for(first), required_tool=required
    )


def narrowed(catalog: FrozenCatalog, ceiling: Collection[str], *,
             exclude: Collection[str] = ()) -> FrozenCatalog:
    """The part of a run's frozen ``catalog`` that another ``ceiling`` also allows: a
    delegated child's tools, never wider than its parent's (R-060, R-410).

    A name the catalog lacks is not added, whatever the ceiling says; a protocol is kept whole
    or not at all and a tool only beside the tools it requires, as at freezing; ``exclude``
    names are dropped. Discovery does not carry over: ``tool_search`` is dropped and every kept
    tool, deferred in the parent or not, is advertised directly (the child's set is small)."""
    allowed = set(ceiling) - set(exclude) - {TOOL_SEARCH_NAME}
    kept = {name: d for name, d in catalog.descriptors.items() if name in allowed}
    kept = {name: d for name, d in kept.items() if d.requires_tools <= kept.keys()}
    kept = {name: d for name, d in kept.items()
            if all(member in kept for member in catalog.protocol_of(name))}
    final = [kept[name] for name in sorted(kept)]
    projected = {d.name: catalog.projected[d.name] for d in final}
    advertised = tuple(projected[d.name] for d in final)
    return FrozenCatalog(
        advertised=advertised, digest=catalog_digest(final, projected, ()),
        descriptors=MappingProxyType({d.name: d for d in final}),
        projected=MappingProxyType(projected), first_step=advertised)


def _deferrable(d: ToolDescriptor) -> bool:
    # Generated and package descriptors wait behind discovery; first-party baseline reads
    # (and tool_search itself) stay directly callable.
    return not d.first_party and d.name != TOOL_SEARCH_NAME


def _unique(descriptors: Iterable[ToolDescriptor]) -> list[ToolDescriptor]:
    """Drop every descriptor whose name occurs more than once: which one is meant is
    ambiguous, so neither is callable (collision check, R-209)."""
    items = list(descriptors)
    counts: dict[str, int] = defaultdict(int)
    for d in items:
        counts[d.name] += 1
    for name, n in counts.items():
        if n > 1:
            log.warning("tool name %r offered %d times; omitted from the catalog", name[:80], n)
    return [d for d in items if counts[d.name] == 1]


def deep_freeze_descriptor(d: ToolDescriptor) -> ToolDescriptor:
    return dataclasses.replace(
        d, input_schema=deep_freeze(d.input_schema), extra=deep_freeze(d.extra)
    )


def project(d: ToolDescriptor, *, description_chars: int | None = None) -> AdvertisedTool:
    """The model-facing projection of one descriptor (the one projection point, R-335)."""
    parameters = deep_freeze(project_schema(d.input_schema))
    description = d.description if description_chars is None \
        else shortened(d.description, description_chars)
    return AdvertisedTool(
        name=d.name, description=description, parameters=parameters, capability=d.capability
    )


_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


def shortened(text: str, limit: int) -> str:
    """``text``'s first paragraph, cut after the last sentence that ends within ``limit``
    characters (at a word, with an ellipsis, when not even one does)."""
    first = text.strip().split("\n\n", 1)[0].strip()
    if len(first) <= limit:
        return first
    ends = [m.end() for m in _SENTENCE_END.finditer(first, 0, limit)]
    if ends:
        return first[:ends[-1]]
    return first[:limit].rsplit(" ", 1)[0] + "…"



def catalog_digest(
    final: Iterable[ToolDescriptor], projected: Mapping[str, AdvertisedTool],
    deferred: Iterable[str],
) -> str:
    deferred_set = set(deferred)
    payload = [
        {
            "name": d.name,
            "description": projected[d.name].description,
            "parameters": projected[d.name].parameters,
            "capability": d.capability.value,
            "surface": d.surface,
            "deferred": d.name in deferred_set,
        }
        for d in final
    ]
    raw = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(raw.encode()).hexdigest()


# --- what the member's request does to visibility ------------------------------------------


def _mentions(text: str, catalog: FrozenCatalog) -> list[tuple[int, str]]:
    """(position, name) of each exact authorized tool name in ``text``, first mention only."""
    # One pass over the request's words instead of one regex per tool name: a word here is
    # exactly what the name boundaries below delimit ([\w-]+).
    names = catalog.descriptors
    first: dict[str, int] = {}
    for word in re.finditer(r"[\w-]+", text):
        name = word.group()
        if name in names and name != TOOL_SEARCH_NAME and name not in first:
            first[name] = word.start()
    return sorted((position, name) for name, position in first.items())


def first_step_slot(text: str, catalog: FrozenCatalog) -> tuple[str, ...]:
    """Tools an exact authorized name in the request brings onto the first step (R-298).

    Visibility only: the names are already in the catalog. A protocol comes whole or not at
    all, inside :data:`FIRST_STEP_SLOT_LIMIT` (R-301).
    """
    chosen: list[str] = []
    for _, name in _mentions(text, catalog):
        group = [n for n in catalog.protocol_of(name) if n not in chosen]
        if len(chosen) + len(group) > FIRST_STEP_SLOT_LIMIT:
            continue
        chosen.extend(group)
    return tuple(chosen)


#: The staged writer's opening operation: its protocol comes whole (R-301).
STAGED_WRITER = "begin_artifact"
CODE_TOOL = "run_code"
_NATIVE_FILE = re.compile(
    r"\b(?:pdf|docx?|word\s+(?:document|file)|powerpoint|pptx|slide\s*deck|excel|xlsx"
    r"|spreadsheet)s?\b", re.IGNORECASE)
_NEW_ARTIFACT = re.compile(
    r"\b(?:make|create|build|write|draw|generate|design)\b[^.?!\n]{0,80}?\b(?:game|app"
    r"|web\s*page|page|document|report|image|illustration|picture|diagram|svg|artwork"
    r"|website|dashboard|story|poem)s?\b", re.IGNORECASE)


def delivery_preference(text: str, catalog: FrozenCatalog) -> tuple[str, ...]:
    """What an unambiguous request for a new artifact prefers on the first step: the staged
    writer's whole protocol; for a native PDF, Word, PowerPoint or Excel file, run_code
    instead, which writes real files where the staged writer writes only text and HTML
    (R-246). Visibility only, like every preference: the tools are already in the catalog.
    A request naming no new artifact, or discussing one ("why is the PDF..."), prefers
    nothing."""
    names = catalog.descriptors
    request = _NEW_ARTIFACT.search(text)
    if request is None or STAGED_WRITER not in names or _talks_about(text, request.start()):
        return ()
    if _NATIVE_FILE.search(text):
        return (CODE_TOOL,) if CODE_TOOL in names else ()
    return tuple(catalog.protocol_of(STAGED_WRITER))


def _talks_about(text: str, start: int) -> bool:
    """A negation or a question word before ``start`` in its sentence ("don't make...",
    "how do I build..."): the sentence is about the thing, not a request for it."""
    sentence_start = max(text.rfind(c, 0, start) for c in ".!?\n") + 1
    return bool(_NEGATION.search(text[sentence_start:start]))


_NAME = r"`?(?P<name>[A-Za-z0-9_-]+)`?"
_TOOL_WORD = r"(?:the\s+)?(?:`?tool`?\s+)?"
_IMPERATIVES = (
    re.compile(rf"\bmust\s+call\s+{_TOOL_WORD}{_NAME}", re.IGNORECASE),
    re.compile(
        rf"\b(?:use|call)\s+{_TOOL_WORD}{_NAME}(?:\s+tool)?\s+exactly\s+once\b", re.IGNORECASE
    ),
)
# Words that turn the imperative into its opposite or into talk about it.
_NEGATION = re.compile(
    r"\b(?:not|never|(?:don|doesn|shouldn|mustn|can|won|didn)[\u2019']?t|no\s+need|without|avoid"
    r"|instead\s+of|rather\s+than|why|how|whether|explain|mean|means|meaning|said|says|say)\b"
    r"[^.!?\n]*$",
    re.IGNORECASE,
)


def required_tool_from_request(text: str, catalog: FrozenCatalog) -> str | None:
    """The one tool the request obliges the first step to call, or None (R-302, R-306).

    Only the strict imperative ("must call X", "call/use X exactly once") naming exactly one
    authorized tool binds. Negations, questions, quoted or reported wording, several tool
    names, and names outside the frozen catalog bind nothing; they may still earn a
    first-step slot, which is only a preference.
    """
    mentioned = {name for _, name in _mentions(text, catalog)}
    if len(mentioned) != 1:
        return None
    (name,) = mentioned
    for pattern in _IMPERATIVES:
        for match in pattern.finditer(text):
            if match.group("name") != name:
                continue
            if _is_discussion(text, match.start(), match.end()):
                continue
            return name
    return None


def _is_discussion(text: str, start: int, end: int) -> bool:
    sentence_start = max(text.rfind(c, 0, start) for c in ".!?\n") + 1
    before = text[sentence_start:start]
    if _NEGATION.search(before):
        return True
    if before.count('"') % 2 or before.count("“") > before.count("”"):
        return True  # inside a quotation: someone else's words
    ends = [i for i in (text.find(c, end) for c in ".!?\n") if i != -1]
    return bool(ends) and text[min(ends)] == "?"
