"""Model context rebuilt from the durable room journal (spec: Actor-specific execution).

Only what was committed enters: accepted inputs and committed answers. Thinking, deltas and
the tool traffic of earlier turns do not, so a later turn never inherits another attempt's
reasoning (R-011).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from kaizen_server_extension.policy.grounding import compose_system_prompt
from kaizen_server_extension.protocol.model import ChatMessage
from kaizen_server_extension.protocol.tools import AdvertisedTool
from kaizen_server_extension.store.artifacts.checkpoints import UpdateCheckpoints
from kaizen_server_extension.store.artifacts.repository import (
    ArtifactStore,
    room_may_list_artifacts,
)
from kaizen_server_extension.store.records import EventRecord
from kaizen_server_extension.store.store import Store

#: Earlier messages carried into a turn; older history is left out rather than truncated.
MAX_HISTORY_MESSAGES = 40
INPUT_EVENTS = ("input.accepted", "steering.accepted")

#: The one tool that completes an unfinished artifact version. The roster's instruction names
#: it only when the step's advertised catalog carries it (R-300).
COMPLETE_TOOL = "update_artifact"
MAX_ROSTER_ENTRIES = 50
MAX_ROSTER_TITLE = 120


@dataclass(frozen=True, slots=True)
class RosterEntry:
    artifact_id: str
    title: str
    kind: str
    version: int
    # An interrupted or still-building update checkpoint of the member's own.
    unfinished: bool = False


@dataclass(frozen=True, slots=True)
class ArtifactRoster:
    """This conversation's artifacts (R-253): identity only, never another chat's."""

    entries: tuple[RosterEntry, ...] = ()

    def render(self, advertised: Collection[str]) -> str | None:
        """The roster block for the system prompt, given the names the step advertises."""
        if not self.entries:
            return None
        can_complete = COMPLETE_TOOL in advertised
        lines = ["Artifacts in this conversation (pass an artifact_id exactly as shown; a "
                 "new request with no id creates a new artifact):"]
        for entry in self.entries:
            # Titles are member-authored text: quoted as data, bounded.
            title = json.dumps(entry.title[:MAX_ROSTER_TITLE], ensure_ascii=False)
            line = (f"- {entry.artifact_id} {title} ({entry.kind}, version "
                    f"{entry.version})")
            if entry.unfinished:
                line += (f" - has an unfinished new version: complete it with {COMPLETE_TOOL}"
                         " using this artifact_id" if can_complete
                         else " - has an unfinished new version")
            lines.append(line)
        return "\n".join(lines)


async def roster_for(store: Store, member: str, conversation_id: str,
                     advertised: Iterable[AdvertisedTool]) -> str | None:
    """The rendered roster for a step that advertises ``advertised`` (one definition)."""
    roster = await load_artifact_roster(store, member, conversation_id)
    return roster.render({tool.name for tool in advertised})


async def load_artifact_roster(store: Store, member: str,
                               conversation_id: str) -> ArtifactRoster:
    """The member's view of this room's artifacts, with their own unfinished updates."""
    if not await store.read(room_may_list_artifacts, member, conversation_id,
                            single_statement=True):
        return ArtifactRoster(())  # the common case: nothing to list, nothing more to read
    artifacts = ArtifactStore(store)
    listed = await artifacts.list_for(member, room=conversation_id, limit=MAX_ROSTER_ENTRIES)
    unfinished = {c.artifact_id for c in
                  await UpdateCheckpoints(store, artifacts).unfinished(member, conversation_id)}
    return ArtifactRoster(tuple(
        RosterEntry(r.artifact_id, r.title, r.kind, r.version,
                    unfinished=r.artifact_id in unfinished and r.owner == member)
        for r in listed))


MAX_NOTED_NAME = 120


def attachment_note(data: dict[str, object]) -> str:
    """What the model learns of the files pinned to the input it answers: names, types and
    sizes (never bytes), as run_code finds them. Names are member-chosen: quoted as data."""
    pinned = data.get("attachments")
    if not isinstance(pinned, list) or not pinned:
        return ""
    described = []
    for item in pinned:
        if not isinstance(item, dict):
            continue
        name = json.dumps(str(item.get("filename", ""))[:MAX_NOTED_NAME], ensure_ascii=False)
        described.append(f"{name} ({item.get('media_type', 'file')}, {item.get('size', 0)} "
                         "bytes)")
    if not described:
        return ""
    return ("\n\n[Files attached to this message, read-only in run_code's working directory "
            f"under these names: {', '.join(described)}]")


def build_context(
    persona: str,
    history: Sequence[EventRecord],
    *,
    current_input_id: str,
    shared: bool,
    roster: str | None = None,
    attachments: str | None = None,
    compact: bool = False,
    rewrite_current: Callable[[str], str] | None = None,
) -> tuple[ChatMessage, ...]:
    """The system prompt (persona, the shared grounding rules, this conversation's artifact
    roster when there is one), earlier answered exchanges, then the input this run answers,
    followed by the rendering of its attached files when there is one (attached notebooks:
    notebooks/context.py). ``compact``: the grounding rules in their short wording (a prompt
    profile for small models, models/profiles.py). ``rewrite_current`` turns the current
    input's text into what the model reads (a saved prompt's attachment tokens)."""
    answered = {e.run_id for e in history if e.type == "answer.committed"}
    messages: list[ChatMessage] = []
    current: ChatMessage | None = None
    for event in history:
        if event.type in INPUT_EVENTS:
            text = str(event.data.get("text", ""))
            # In a shared room the model must know who said what.
            content = f"[{event.actor}] {text}" if shared else text
            message = ChatMessage(role="user", content=content)
            if event.data.get("input_id") == current_input_id:
                if rewrite_current is not None:
                    text = rewrite_current(text)
                    content = f"[{event.actor}] {text}" if shared else text
                # Only this turn's files are on disk: earlier turns' were theirs alone. An
                # attached notebook's rendering follows (notebooks/context.py).
                content = content + attachment_note(event.data)
                if attachments:
                    content = f"{content}\n\n{attachments}"
                current = ChatMessage(role="user", content=content)
            elif event.run_id in answered:
                messages.append(message)
        elif event.type == "answer.committed":
            messages.append(ChatMessage(role="assistant", content=str(event.data.get("text",
                                                                                      ""))))
    if current is None:
        raise LookupError("the run's accepted input is not in the journal")
    recent = messages[-MAX_HISTORY_MESSAGES:]
    # Never start the history with a dangling answer whose question was cut off.
    while recent and recent[0].role == "assistant":
        recent = recent[1:]
    # The shared composition chain: persona, grounding (no agent can opt out), roster.
    system = compose_system_prompt(persona, roster, compact=compact)
    return (ChatMessage(role="system", content=system), *recent, current)
